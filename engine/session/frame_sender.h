// FrameSender: builds data frames (header, payload, tag) and spreads them over
// the data streams round-robin, numbering each stream's frames from 0. Applies
// the optional rate cap. Used by one thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/session/rate_limiter.h"
#include "transport/crypto/frame_protector.h"
#include "gpumigrate/status.h"
#include "gpumigrate/stream.h"
#include "transport/wire/frame.h"

namespace gpumigrate {

class FrameSender {
 public:
  FrameSender(std::vector<Stream*> streams, const FrameKeys& keys, double rate_limit_bytes_per_s)
      : streams_(std::move(streams)), protector_(MakeFrameProtector(keys)), frames_(streams_.size(), 0),
        limiter_(rate_limit_bytes_per_s) {}

  Status Send(wire::FrameType type, uint32_t region, uint32_t round, uint64_t offset, uint32_t raw_length,
              std::span<const std::byte> payload, uint8_t codec_flags = 0);

  uint64_t bytes_sent() const { return bytes_; }
  const std::vector<uint64_t>& frames_per_stream() const { return frames_; }
  const std::vector<uint64_t>& bytes_per_stream() const { return stream_bytes_; }

 private:
  std::vector<Stream*> streams_;
  std::unique_ptr<FrameProtector> protector_;
  std::vector<std::byte> sealed_;
  std::vector<uint64_t> frames_;  // == next sequence number per stream
  std::vector<uint64_t> stream_bytes_ = std::vector<uint64_t>(frames_.size(), 0);
  size_t next_stream_ = 0;
  uint64_t bytes_ = 0;
  RateLimiter limiter_;
};

}  // namespace gpumigrate
