#include "gpumigrate/common/clock.h"

#include <thread>

namespace gpumigrate {
namespace {

class SteadyClock final : public Clock {
 public:
  TimePoint Now() override { return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now()); }
  void SleepUntil(TimePoint t) override { std::this_thread::sleep_until(t); }
};

}  // namespace

Clock& SystemClock() {
  static SteadyClock clock;
  return clock;
}

}  // namespace gpumigrate
