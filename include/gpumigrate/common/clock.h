// Clock: the seam for time, so that measurement code (the estimator's dirty
// sampler) can be tested with a fake clock and exact expectations.
//
// Every timeout and measurement in the engine goes through it: the session,
// destination, mailbox, rate limiter and sim workload take a Clock (default
// SystemClock()), so a test can move time instead of sleeping through it.
//
// SystemClock() is the steady clock. FakeClock starts at zero and moves only when
// told to, or when someone sleeps on it (SleepUntil jumps to the deadline).
// Waiting code polls: it re-reads Now() at least every kPollInterval of real
// time, so an Advance() from another thread is seen within that.
// Thread safety: both are thread-safe.
#pragma once

#include <atomic>
#include <chrono>

namespace gpumigrate {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;
  virtual ~Clock() = default;
  virtual TimePoint Now() = 0;
  virtual void SleepUntil(TimePoint t) = 0;
};

Clock& SystemClock();

// How often (real time) a wait on a Clock re-reads it.
inline constexpr std::chrono::milliseconds kPollInterval{20};

// Milliseconds from a to b, for reports.
inline double MsBetween(Clock::TimePoint a, Clock::TimePoint b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

class FakeClock final : public Clock {
 public:
  TimePoint Now() override { return TimePoint(Duration(now_ns_.load())); }
  void SleepUntil(TimePoint t) override {
    int64_t want = t.time_since_epoch().count();
    int64_t cur = now_ns_.load();
    while (want > cur && !now_ns_.compare_exchange_weak(cur, want)) {
    }
  }
  void Advance(Duration d) { now_ns_ += d.count(); }

 private:
  std::atomic<int64_t> now_ns_{0};
};

}  // namespace gpumigrate
