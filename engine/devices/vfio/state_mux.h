// The device-state stream of a vfio: device made of several VFIO devices (the
// devices of one VM, migrated together): each piece of one device's migration
// stream travels as a record, a 16-byte header (magic, member index, length,
// little-endian) and then that many bytes of the member's own stream. A vfio:
// device of one member sends its stream as it is, with no records.
//
// MuxReader on the destination takes the stream in pieces of any size and
// hands each member its bytes in order; it refuses a stream that is not made of
// such records, names a member the destination does not have, or ends inside a
// record, naming the byte where it went wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "gpumigrate/common/status.h"

namespace gpumigrate::vfio {

inline constexpr uint32_t kMuxMagic = 0x584d4647;  // "GFMX"
inline constexpr size_t kMuxHeaderBytes = 16;
// No member's record is longer: a larger length is a damaged header.
inline constexpr uint64_t kMaxMuxRecordBytes = uint64_t{1} << 30;

// Writes the header of a record of `length` bytes of member `member` into `out`
// (at least kMuxHeaderBytes).
void PutMuxHeader(std::span<std::byte> out, uint32_t member, uint64_t length);

class MuxReader {
 public:
  // `write(member, bytes)` stores bytes of a member's stream; `name(member)`
  // names a member in errors.
  MuxReader(size_t members, std::function<Status(size_t, std::span<const std::byte>)> write,
            std::function<std::string(size_t)> name)
      : members_(members), write_(std::move(write)), name_(std::move(name)) {}

  Status Feed(std::span<const std::byte> in);
  // The stream has ended: an error when it ended inside a record.
  Status Finish() const;
  uint64_t position() const { return pos_; }
  void Reset() {
    header_have_ = 0;
    member_ = 0;
    left_ = 0;
    pos_ = 0;
  }

 private:
  size_t members_;
  std::function<Status(size_t, std::span<const std::byte>)> write_;
  std::function<std::string(size_t)> name_;
  std::byte header_[kMuxHeaderBytes] = {};
  size_t header_have_ = 0;
  size_t member_ = 0;
  uint64_t left_ = 0;  // bytes of the current record still to come
  uint64_t pos_ = 0;   // stream bytes consumed
};

}  // namespace gpumigrate::vfio
