// RateLimiter on a fake clock: SleepUntil jumps the fake time, so the time a
// transfer takes is an exact expectation, not a measurement.
#include "engine/session/rate_limiter.h"

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

std::chrono::nanoseconds Elapsed(FakeClock& clock) { return clock.Now().time_since_epoch(); }

TEST(RateLimiter, ABurstGoesAtOnceAndTheRestAtTheRate) {
  FakeClock clock;
  RateLimiter limiter(1000, clock, /*burst_bytes=*/100);
  EXPECT_TRUE(limiter.enabled());
  limiter.Acquire(100);  // the initial burst
  EXPECT_EQ(Elapsed(clock), 0ns);
  limiter.Acquire(1000);  // (1000 - 0 tokens) / 1000 B/s
  EXPECT_EQ(Elapsed(clock), 1s);
  limiter.Acquire(500);
  EXPECT_EQ(Elapsed(clock), 1500ms);
}

TEST(RateLimiter, NBytesTakeNMinusBurstOverRate) {
  FakeClock clock;
  RateLimiter limiter(1000, clock, /*burst_bytes=*/250);
  limiter.Acquire(1250);  // (1250 - 250) / 1000
  EXPECT_EQ(Elapsed(clock), 1s);

  // In many small pieces: 10000 x 64 bytes = 640000 bytes at 4096 B/s with a
  // 4096-byte burst: (640000 - 4096) / 4096 s.
  FakeClock clock2;
  RateLimiter limiter2(4096, clock2, /*burst_bytes=*/4096);
  for (int i = 0; i < 10000; ++i) limiter2.Acquire(64);
  const double want_s = (640000.0 - 4096.0) / 4096.0;
  EXPECT_NEAR(std::chrono::duration<double>(Elapsed(clock2)).count(), want_s, 1e-6);
}

TEST(RateLimiter, IdleTimeRefillsOnlyUpToTheBurst) {
  FakeClock clock;
  RateLimiter limiter(1000, clock, /*burst_bytes=*/100);
  limiter.Acquire(100);
  clock.Advance(10s);  // would be 10000 tokens uncapped
  limiter.Acquire(1100);
  EXPECT_EQ(Elapsed(clock), 11s) << "only the 100-byte burst was saved up";
}

TEST(RateLimiter, TheBurstIsAtLeastTenMillisecondsOfRate) {
  FakeClock clock;
  RateLimiter limiter(1e6, clock, /*burst_bytes=*/0);  // burst raised to 10000
  limiter.Acquire(10000);
  EXPECT_EQ(Elapsed(clock), 0ns);
  limiter.Acquire(1000);
  EXPECT_EQ(Elapsed(clock), 1ms);
}

TEST(RateLimiter, RateZeroIsDisabledAndNeverSleeps) {
  FakeClock clock;
  RateLimiter limiter(0, clock, /*burst_bytes=*/1);
  EXPECT_FALSE(limiter.enabled());
  for (int i = 0; i < 100; ++i) limiter.Acquire(1e12);
  EXPECT_EQ(Elapsed(clock), 0ns);
}

TEST(RateLimiter, ANewRateAppliesFromNowAndKeepsWhatWasEarned) {
  FakeClock clock;
  RateLimiter limiter(1000, clock, /*burst_bytes=*/100);
  limiter.Acquire(100);   // the burst
  limiter.Acquire(1000);  // 1 s at 1000 B/s
  EXPECT_EQ(Elapsed(clock), 1s);
  limiter.SetRate(4000);
  EXPECT_EQ(limiter.rate(), 4000);
  limiter.Acquire(4000);  // 1 s at the new rate, no more
  EXPECT_EQ(Elapsed(clock), 2s);
  limiter.SetRate(500);
  limiter.Acquire(1000);  // 2 s at the lower one
  EXPECT_EQ(Elapsed(clock), 4s);
}

TEST(RateLimiter, TurnedOnLaterItStartsWithoutABurstAndTurnedOffItNeverSleeps) {
  FakeClock clock;
  RateLimiter limiter(0, clock, /*burst_bytes=*/100);
  limiter.Acquire(1e9);
  EXPECT_EQ(Elapsed(clock), 0ns);
  clock.Advance(10s);
  limiter.SetRate(1000);
  EXPECT_TRUE(limiter.enabled());
  limiter.Acquire(1000);
  EXPECT_EQ(Elapsed(clock), 11s) << "no credit from the time it was off";
  limiter.SetRate(0);
  EXPECT_FALSE(limiter.enabled());
  limiter.Acquire(1e9);
  EXPECT_EQ(Elapsed(clock), 11s);
}

}  // namespace
}  // namespace gpumigrate
