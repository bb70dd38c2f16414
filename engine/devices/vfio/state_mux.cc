#include "engine/devices/vfio/state_mux.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace gpumigrate::vfio {
namespace {

void PutLe(std::byte* p, uint64_t v, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t GetLe(const std::byte* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

void PutMuxHeader(std::span<std::byte> out, uint32_t member, uint64_t length) {
  PutLe(out.data(), kMuxMagic, 4);
  PutLe(out.data() + 4, member, 4);
  PutLe(out.data() + 8, length, 8);
}

Status MuxReader::Feed(std::span<const std::byte> in) {
  while (!in.empty()) {
    if (left_ == 0) {
      const size_t take = std::min(kMuxHeaderBytes - header_have_, in.size());
      std::memcpy(header_ + header_have_, in.data(), take);
      header_have_ += take;
      in = in.subspan(take);
      pos_ += take;
      if (header_have_ < kMuxHeaderBytes) break;
      const uint64_t at = pos_ - kMuxHeaderBytes;
      header_have_ = 0;
      const uint64_t magic = GetLe(header_, 4), member = GetLe(header_ + 4, 4), length = GetLe(header_ + 8, 8);
      if (magic != kMuxMagic) {
        return Corrupt(fmt::format("vfio: device state stream byte {}: not a device record (magic {:#010x}, "
                                   "expected {:#010x}); does the source migrate the same number of VFIO devices?",
                                   at, magic, kMuxMagic));
      }
      if (member >= members_) {
        return Corrupt(fmt::format("vfio: device state stream byte {}: a record for device {} of the source, but "
                                   "this destination has {} device(s)",
                                   at, member, members_));
      }
      if (length == 0 || length > kMaxMuxRecordBytes) {
        return Corrupt(fmt::format("vfio: device state stream byte {}: a record of {} bytes for {} (1 to {} expected)",
                                   at, length, name_(member), kMaxMuxRecordBytes));
      }
      member_ = member;
      left_ = length;
      continue;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(left_, in.size()));
    GM_RETURN_IF_ERROR(write_(member_, in.first(take)));
    left_ -= take;
    in = in.subspan(take);
    pos_ += take;
  }
  return Status::Ok();
}

Status MuxReader::Finish() const {
  if (header_have_ != 0) {
    return Corrupt(fmt::format("vfio: the device state stream ended at byte {}, inside a record header ({} of {} bytes)",
                               pos_, header_have_, kMuxHeaderBytes));
  }
  if (left_ != 0) {
    return Corrupt(fmt::format("vfio: the device state stream ended at byte {}, inside a record of {}: {} bytes missing",
                               pos_, name_(member_), left_));
  }
  return Status::Ok();
}

}  // namespace gpumigrate::vfio
