// StreamReader: ReadExact over a Stream, through a small buffer filled with
// Stream::ReadSome, so a run of small frames (a header, a 4 KiB payload, a
// tag, again and again: the scattered pages of a final round) costs one read
// call per buffer, not three per frame. Reads of at least half the buffer go
// straight to the stream once the buffer is drained (a 1 MiB payload is not
// copied twice). A stream without ReadSome (pipes, files) is read directly.
// The reader owns every byte it took from the stream: read through it only.
// One thread.
#pragma once

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate {

class StreamReader {
 public:
  static constexpr size_t kDefaultBuffer = 64 << 10;

  explicit StreamReader(Stream& s, size_t buffer = kDefaultBuffer) : s_(s), buf_(buffer) {}

  Status ReadExact(std::span<std::byte> out) {
    size_t done = Take(out);
    while (done < out.size()) {
      std::span<std::byte> rest = out.subspan(done);
      if (!some_ || rest.size() >= buf_.size() / 2) return s_.ReadExact(rest);
      Result<size_t> got = s_.ReadSome(buf_);
      if (!got.ok() && got.status().code() == StatusCode::kUnimplemented && !filled_once_) {
        some_ = false;  // this stream reads whole spans only
        return s_.ReadExact(rest);
      }
      if (!got.ok()) {
        return Status(got.status().code(), fmt::format("{} after {} of {} bytes", got.status().message(), done,
                                                       out.size()));
      }
      if (*got == 0) {
        return Unavailable(
            fmt::format("{}: read failed: stream closed after {} of {} bytes", s_.Name(), done, out.size()));
      }
      filled_once_ = true;
      begin_ = 0;
      end_ = *got;
      done += Take(rest);
    }
    return Status::Ok();
  }

  size_t buffered() const { return end_ - begin_; }

 private:
  // Copies what the buffer holds into the front of `out`; returns how much.
  size_t Take(std::span<std::byte> out) {
    const size_t n = std::min(out.size(), end_ - begin_);
    if (n > 0) std::memcpy(out.data(), buf_.data() + begin_, n);
    begin_ += n;
    return n;
  }

  Stream& s_;
  std::vector<std::byte> buf_;
  size_t begin_ = 0, end_ = 0;
  bool some_ = true, filled_once_ = false;
};

}  // namespace gpumigrate
