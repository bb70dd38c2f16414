// Clock: the seam for time, so that measurement code (the estimator's dirty
// sampler) can be tested with a fake clock and exact expectations.
//
// SystemClock() is the steady clock. FakeClock starts at zero and moves only when
// told to, or when someone sleeps on it (SleepUntil jumps to the deadline).
// Thread safety: SystemClock is thread-safe; FakeClock is for one thread.
#pragma once

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

class FakeClock final : public Clock {
 public:
  TimePoint Now() override { return now_; }
  void SleepUntil(TimePoint t) override {
    if (t > now_) now_ = t;
  }
  void Advance(Duration d) { now_ += d; }

 private:
  TimePoint now_{};
};

}  // namespace gpumigrate
