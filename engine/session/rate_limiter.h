// Token bucket that caps a sender's rate (emulates a slower link). Acquire()
// sleeps until `bytes` may go; bursts are capped at `burst_bytes`.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace gpumigrate {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimiter(double bytes_per_s, double burst_bytes = 4 << 20)
      : rate_(bytes_per_s), burst_(std::max(burst_bytes, bytes_per_s * 0.01)), tokens_(burst_), last_(Clock::now()) {}

  bool enabled() const { return rate_ > 0; }

  void Acquire(double bytes) {
    if (rate_ <= 0) return;
    Refill();
    tokens_ -= bytes;
    if (tokens_ < 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(-tokens_ / rate_));
      Refill();
    }
  }

 private:
  void Refill() {
    auto now = Clock::now();
    tokens_ = std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * rate_);
    last_ = now;
  }
  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
};

}  // namespace gpumigrate
