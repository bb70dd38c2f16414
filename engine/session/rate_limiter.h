// Token bucket that caps a sender's rate (emulates a slower link, or paces a
// migration at its share of one). Acquire() sleeps (on the clock) until `bytes`
// may go; bursts are capped at `burst_bytes`. The rate may change while it runs
// (SetRate). One thread.
#pragma once

#include <algorithm>
#include <chrono>

#include "gpumigrate/common/clock.h"

namespace gpumigrate {

class RateLimiter {
 public:
  // `clock` is borrowed and must outlive the limiter.
  RateLimiter(double bytes_per_s, Clock& clock, double burst_bytes = 4 << 20)
      : clock_(clock),
        rate_(bytes_per_s),
        burst_base_(burst_bytes),
        burst_(std::max(burst_bytes, bytes_per_s * 0.01)),
        tokens_(burst_),
        last_(clock.Now()) {}

  bool enabled() const { return rate_ > 0; }
  double rate() const { return rate_; }

  // From now on at `bytes_per_s` (0: unlimited). What was earned at the old rate
  // is kept, up to the new burst; a limiter turned on starts with no credit, so
  // it never opens with a burst.
  void SetRate(double bytes_per_s) {
    if (rate_ > 0) {
      Refill();
    } else {
      tokens_ = 0;
      last_ = clock_.Now();
    }
    rate_ = std::max(0.0, bytes_per_s);
    burst_ = std::max(burst_base_, rate_ * 0.01);
    tokens_ = std::min(tokens_, burst_);
  }

  void Acquire(double bytes) {
    if (rate_ <= 0) return;
    const Clock::TimePoint until = Reserve(bytes);
    if (until > clock_.Now()) {
      clock_.SleepUntil(until);
      Refill();
    }
  }

  // Takes `bytes` now and says when they may go (now, or later once the
  // tokens they overdraw have come back); the caller waits until then, in
  // slices if it has other work to do meanwhile.
  Clock::TimePoint Reserve(double bytes) {
    const Clock::TimePoint now = clock_.Now();
    if (rate_ <= 0) return now;
    Refill();
    tokens_ -= bytes;
    if (tokens_ >= 0) return now;
    return now + std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(-tokens_ / rate_));
  }

 private:
  void Refill() {
    auto now = clock_.Now();
    tokens_ = std::min(burst_, tokens_ + std::chrono::duration<double>(now - last_).count() * rate_);
    last_ = now;
  }
  Clock& clock_;
  double rate_;
  double burst_base_;
  double burst_;
  double tokens_;
  Clock::TimePoint last_;
};

}  // namespace gpumigrate
