// FaultStream: wraps a Stream and injects faults on the bytes written through it,
// for tests: cut the connection at byte N, flip one bit at byte N, cut when a
// test calls Cut() from another thread (at a chosen protocol phase), or, after
// Blackhole(), accept writes and deliver nothing (a network partition), or,
// after Deafen(), deliver nothing read either (the peer's packets vanish: reads
// block, swallowing what arrives, until the stream is closed).
// Counts are of bytes written through this wrapper since it was made.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "gpumigrate/common/stream.h"

namespace gpumigrate {

struct FaultPlan {
  std::optional<uint64_t> cut_at_byte;   // the write that would pass it fails; the stream closes
  std::optional<uint64_t> flip_at_byte;  // XOR 0x01 into that byte as it passes
};

class FaultStream final : public Stream {
 public:
  FaultStream(std::unique_ptr<Stream> inner, FaultPlan plan) : inner_(std::move(inner)), plan_(plan) {}
  std::string Name() const override { return inner_->Name(); }
  Status WriteAll(std::span<const std::byte> data) override;
  Status ReadExact(std::span<std::byte> out) override {
    Status st = inner_->ReadExact(out);
    while (st.ok() && deaf_.load()) st = inner_->ReadExact(out);  // swallowed
    return st;
  }
  void Close() override { inner_->Close(); }
  void Reset() override { inner_->Reset(); }
  void Cut() { inner_->Close(); }
  void Blackhole() { blackhole_ = true; }
  void Deafen() { deaf_ = true; }
  uint64_t bytes_written() const { return written_.load(); }

 private:
  std::unique_ptr<Stream> inner_;
  FaultPlan plan_;
  std::atomic<uint64_t> written_{0};
  std::atomic<bool> blackhole_{false};
  std::atomic<bool> deaf_{false};
};

}  // namespace gpumigrate
