#include "gpumigrate/policy/switchover.h"

#include <cmath>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

PolicyInput Base() {
  PolicyInput in;
  in.bandwidth_bytes_per_s = 1e9;  // 1 GB/s: 1 MB costs 1 ms
  in.device_state_bytes = 0;
  in.limits.max_rounds = 30;
  in.limits.downtime_target = 300ms;
  in.limits.max_stun = 2s;
  in.limits.fixed_cost = 2ms;
  return in;
}

TEST(SwitchoverPolicy, PredictsStunFromDirtyBytesAndBandwidth) {
  EXPECT_DOUBLE_EQ(PredictStunMs(100'000'000, 1e9, 2ms), 102.0);
  EXPECT_DOUBLE_EQ(PredictStunMs(0, 0, 5ms), 5.0);
  EXPECT_TRUE(std::isinf(PredictStunMs(1, 0, 0ms)));
}

TEST(SwitchoverPolicy, SwitchesWhenWithinTarget) {
  PolicyInput in = Base();
  in.dirty_bytes_history = {4'000'000'000, 250'000'000};
  in.device_state_bytes = 8'000'000;
  in.rounds_done = 2;
  PolicyResult r = DecideSwitchover(in);
  EXPECT_EQ(r.decision, Decision::kSwitchover);
  EXPECT_DOUBLE_EQ(r.predicted_stun_ms, 260.0);  // (250 MB + 8 MB) / 1 GB/s + 2 ms
  EXPECT_NE(r.reason.find("converged"), std::string::npos);
}

TEST(SwitchoverPolicy, WaitsForADevicesInitialDataUntilTheRoundLimit) {
  PolicyInput in = Base();
  in.dirty_bytes_history = {4'000'000'000, 250'000'000};
  in.device_initial_bytes = 1'000'000;
  in.rounds_done = 2;
  PolicyResult r = DecideSwitchover(in);
  EXPECT_EQ(r.decision, Decision::kContinue);
  EXPECT_NE(r.reason.find("1000000 bytes of initial pre-copy data"), std::string::npos) << r.reason;
  in.rounds_done = in.limits.max_rounds;  // no longer: the stun carries it
  EXPECT_EQ(DecideSwitchover(in).decision, Decision::kSwitchover);
  in.rounds_done = 2;
  in.device_initial_bytes = 0;
  EXPECT_EQ(DecideSwitchover(in).decision, Decision::kSwitchover);
}

TEST(SwitchoverPolicy, ContinuesWhileShrinking) {
  PolicyInput in = Base();
  in.dirty_bytes_history = {4'000'000'000, 2'000'000'000, 1'000'000'000, 600'000'000};
  in.rounds_done = 4;
  EXPECT_EQ(DecideSwitchover(in).decision, Decision::kContinue);
}

TEST(SwitchoverPolicy, StalledButWithinMaxStunSwitches) {
  PolicyInput in = Base();
  // Dirty set stuck near 1 GB for three rounds after reaching 1 GB.
  in.dirty_bytes_history = {4'000'000'000, 1'000'000'000, 950'000'000, 990'000'000, 1'000'000'000};
  in.rounds_done = 5;
  PolicyResult r = DecideSwitchover(in);
  EXPECT_EQ(r.decision, Decision::kSwitchover);
  EXPECT_DOUBLE_EQ(r.predicted_stun_ms, 1002.0);
  EXPECT_NE(r.reason.find("stopped shrinking"), std::string::npos);
}

TEST(SwitchoverPolicy, StalledBeyondMaxStunAbortsWithDrainAndReplace) {
  PolicyInput in = Base();
  in.dirty_bytes_history = {8'000'000'000, 3'000'000'000, 3'000'000'000, 3'100'000'000, 2'900'000'000};
  in.rounds_done = 5;
  PolicyResult r = DecideSwitchover(in);
  EXPECT_EQ(r.decision, Decision::kAbort);
  EXPECT_DOUBLE_EQ(r.predicted_stun_ms, 2902.0);
  EXPECT_NE(r.reason.find("drain-and-replace"), std::string::npos);
}

TEST(SwitchoverPolicy, RoundLimitAppliesTheMaxStunRule) {
  PolicyInput in = Base();
  in.limits.max_rounds = 3;
  in.dirty_bytes_history = {4'000'000'000, 2'000'000'000, 1'000'000'000};
  in.rounds_done = 3;
  PolicyResult r = DecideSwitchover(in);
  EXPECT_EQ(r.decision, Decision::kSwitchover);
  EXPECT_NE(r.reason.find("round limit 3"), std::string::npos);
  in.limits.max_stun = 500ms;
  EXPECT_EQ(DecideSwitchover(in).decision, Decision::kAbort);
}

TEST(SwitchoverPolicy, ZeroBandwidthNeverSwitchesOnPrediction) {
  PolicyInput in = Base();
  in.bandwidth_bytes_per_s = 0;
  in.dirty_bytes_history = {10};
  in.rounds_done = 1;
  EXPECT_EQ(DecideSwitchover(in).decision, Decision::kContinue);
}

}  // namespace
}  // namespace gpumigrate

namespace gpumigrate {
namespace {

LinkRateInput Collapsed() {
  LinkRateInput in;
  in.limits.downtime_target = 300ms;
  in.limits.max_stun = 2s;
  in.limits.fixed_cost = 2ms;
  in.bandwidth_bytes_per_s = 250e3;  // 2 Mbit/s
  in.peak_bandwidth_bytes_per_s = 25e6;
  in.interval_s = 2;
  return in;
}

TEST(LinkRatePolicy, AbortsWhenTheWorkloadWritesMoreThanTheLinkCarriesAndTheFloorExceedsMaxStun) {
  LinkRateInput in = Collapsed();
  in.written_bytes = 4'000'000;  // 4 MB in 2 s against 0.5 MB carried: the floor is 16 s
  in.device_state_bytes = 250'000;
  PolicyResult r = DecideAtLinkRate(in);
  EXPECT_EQ(r.decision, Decision::kAbort);
  EXPECT_EQ(r.stop, StopReason::kLinkTooSlow);
  EXPECT_DOUBLE_EQ(r.predicted_stun_ms, 17'002.0);  // (4 MB + 0.25 MB) / 250 kB/s + 2 ms
  EXPECT_NE(r.reason.find("exceeds max stun 2000 ms"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("250.00 KB/s"), std::string::npos) << r.reason;
  EXPECT_EQ(StopReasonName(r.stop), "link too slow");
}

TEST(LinkRatePolicy, GoesOnWhenTheLinkStillCarriesMoreThanTheWorkloadWrites) {
  LinkRateInput in = Collapsed();
  in.written_bytes = 499'999;  // just under R*t: rounds can still shrink
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
  in.written_bytes = 500'000;  // R*t exactly: the floor is 2.002 s, over the 2 s
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kAbort);
}

TEST(LinkRatePolicy, GoesOnWhenTheFloorIsWithinMaxStunOrThePolicySwitchesAnyway) {
  LinkRateInput in = Collapsed();
  in.written_bytes = 400'000;
  in.interval_s = 1;  // 0.4 MB in 1 s: floor 1.6 s, within 2 s
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
  in.written_bytes = 4'000'000;
  in.limits.switch_when_not_converging = true;
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
}

TEST(LinkRatePolicy, AbortsWhenEvenTheBestCaseEndsAfterTheTimeBudget) {
  LinkRateInput in = Collapsed();
  in.limits.max_total = 100s;
  in.written_bytes = 100'000;  // 0.1 MB in 2 s: rounds can shrink, the stun rule goes on
  in.device_state_bytes = 0;
  in.elapsed_s = 10;
  in.round = 0;
  in.round_left_bytes = 22'000'000;  // 88 s at 250 kB/s: 98.002 s in all, within 100 s
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
  in.round_left_bytes = 23'000'000;  // 92 s: 102.002 s
  PolicyResult r = DecideAtLinkRate(in);
  EXPECT_EQ(r.decision, Decision::kAbort);
  EXPECT_EQ(r.stop, StopReason::kOverBudget);
  EXPECT_EQ(StopReasonName(r.stop), "over budget");
  EXPECT_NE(r.reason.find("the link carries 250.00 KB/s now (it carried 25.00 MB/s before)"), std::string::npos)
      << r.reason;
  EXPECT_NE(r.reason.find("beyond max total 100 s"), std::string::npos) << r.reason;
  // 23 MB in the 89.998 s left: 255.56 KB/s.
  EXPECT_NE(r.reason.find("it would need 255.56 KB/s from now"), std::string::npos) << r.reason;
  // The policy that switches anyway when not converging still keeps the budget.
  in.limits.switch_when_not_converging = true;
  EXPECT_EQ(DecideAtLinkRate(in).stop, StopReason::kOverBudget);
  // No budget, no such abort.
  in.limits.max_total = 0s;
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
}

TEST(LinkRatePolicy, TheBudgetCountsTheSmallestFinalRoundTheWorkloadAllows) {
  LinkRateInput in = Collapsed();
  in.limits.max_total = 100s;
  in.limits.switch_when_not_converging = true;  // the 16 s stun is accepted, the budget is not
  in.written_bytes = 4'000'000;                 // writes outpace the link: the final round is at least 16 s
  in.elapsed_s = 10;
  in.round_left_bytes = 18'000'000;  // 72 s: 10 + 72 + 16 = 98 s, within
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
  in.round_left_bytes = 19'000'000;  // 10 + 76 + 16 = 102 s
  PolicyResult r = DecideAtLinkRate(in);
  EXPECT_EQ(r.stop, StopReason::kOverBudget);
  EXPECT_NEAR(r.predicted_stun_ms, 16'002.0, 1e-6);
  // A budget already spent says so.
  in.elapsed_s = 120;
  r = DecideAtLinkRate(in);
  EXPECT_NE(r.reason.find("the budget is spent"), std::string::npos) << r.reason;
}

TEST(LinkRatePolicy, NoMeasureNoAbort) {
  LinkRateInput in = Collapsed();
  in.written_bytes = 4'000'000;
  in.bandwidth_bytes_per_s = 0;
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
  in.bandwidth_bytes_per_s = 250e3;
  in.interval_s = 0;
  EXPECT_EQ(DecideAtLinkRate(in).decision, Decision::kContinue);
}

}  // namespace
}  // namespace gpumigrate
