// The estimator's model on hand-computed cases.
#include <gtest/gtest.h>

#include "gpumigrate/estimator/estimator.h"

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;
using B = WorkingSetCurve::Bound;

WorkingSetCurve Curve(std::vector<double> t, std::vector<double> bytes) {
  WorkingSetCurve c;
  c.window_s = t;
  c.low_bytes = c.mid_bytes = c.high_bytes = bytes;
  return c;
}

RegionProfile Region(uint32_t id, double size, double nonzero, WorkingSetCurve w) {
  RegionProfile r;
  // Appended, not "r" + std::to_string(id): GCC 12 at -O2 and above raises a false
  // -Wrestrict inside std::string's operator+(const char*, string&&).
  std::string name = "r";
  name += std::to_string(id);
  r.info = RegionInfo{id, std::move(name), static_cast<uint64_t>(size), 4096, RegionHint::kDynamic};
  r.nonzero_fraction = nonzero;
  r.dirty = std::move(w);
  return r;
}

ModelParams Params(double bw) {
  ModelParams p;
  p.bandwidth_low = p.bandwidth_mid = p.bandwidth_high = bw;
  p.fixed_cost = 2ms;
  p.downtime_target = 300ms;
  p.max_stun = 100s;
  p.max_rounds = 30;
  return p;
}

TEST(WorkingSetCurve, InterpolatesExtrapolatesAndCaps) {
  WorkingSetCurve c = Curve({0.01, 0.1}, {10e6, 100e6});
  EXPECT_DOUBLE_EQ(c.Eval(0.005, B::kMid, 1e12), 5e6);     // proportional below the first window
  EXPECT_DOUBLE_EQ(c.Eval(0.055, B::kMid, 1e12), 55e6);    // linear between
  EXPECT_DOUBLE_EQ(c.Eval(0.2, B::kMid, 1e12), 200e6);     // last slope beyond
  EXPECT_DOUBLE_EQ(c.Eval(0.2, B::kMid, 150e6), 150e6);    // never more than the region
  EXPECT_DOUBLE_EQ(c.Eval(0, B::kMid, 1e12), 0);
  WorkingSetCurve flat = Curve({0.01, 0.1}, {40e6, 40e6});  // a saturated hot set stays put
  EXPECT_DOUBLE_EQ(flat.Eval(10, B::kMid, 1e12), 40e6);
}

// A burst at the end of the sample (the last window holds one burst, the one
// before it none) is not extended as a rate: the median grows at most at the
// longest window's average beyond it; the high bound still extends the burst.
TEST(WorkingSetCurve, ABurstCaughtByTheSampleIsNotExtendedAsARate) {
  WorkingSetCurve c;
  c.window_s = {0.16, 0.32, 0.64};
  c.low_bytes = {0, 0, 20e6};
  c.mid_bytes = {0, 4e6, 24e6};   // last segment: 62.5 MB/s; average over 0.64 s: 37.5 MB/s
  c.high_bytes = {8e6, 24e6, 24e6};
  EXPECT_DOUBLE_EQ(c.Eval(1.28, B::kMid, 1e12), 24e6 + 37.5e6 * 0.64);
  EXPECT_DOUBLE_EQ(c.Eval(1.28, B::kHigh, 1e12), 24e6 + 62.5e6 * 0.64);
  EXPECT_LE(c.Eval(1.28, B::kLow, 1e12), c.Eval(1.28, B::kMid, 1e12));
  // A steady writer (W linear) and a hot set (W bending down) are unchanged.
  WorkingSetCurve steady = Curve({0.01, 0.1}, {10e6, 100e6});
  EXPECT_DOUBLE_EQ(steady.Eval(0.2, B::kMid, 1e12), 200e6);
}

// Beyond the last window, bounds keep their order even when the lowest samples
// happen to grow faster than the median ones.
TEST(WorkingSetCurve, BoundsStayOrderedWhenExtrapolating) {
  WorkingSetCurve c;
  c.window_s = {0.08, 0.16};
  c.low_bytes = {2.00e6, 4.13e6};
  c.mid_bytes = {2.08e6, 4.13e6};
  c.high_bytes = {2.10e6, 4.13e6};
  for (double t : {0.2, 0.4, 2.0}) {
    EXPECT_LE(c.Eval(t, B::kLow, 1e12), c.Eval(t, B::kMid, 1e12)) << t;
    EXPECT_LE(c.Eval(t, B::kMid, 1e12), c.Eval(t, B::kHigh, 1e12)) << t;
  }
}

// Weights 1 GB clean, a hot set of 100 MB rewritten at 1 GB/s, link 1 GB/s:
// round 0 moves 1.1 GB in 1.1 s, during which the whole hot set is dirtied;
// 100 MB / 1 GB/s + 2 ms = 102 ms is within 300 ms: switch after one round.
TEST(Model, SaturatingHotSetConvergesAfterRoundZero) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, 1.0, Curve({0.01, 1}, {0, 0})));
  p.regions.push_back(Region(1, 100e6, 1.0, Curve({0.01, 0.1}, {10e6, 100e6})));
  ModelRun m = RunModel(p, Params(1e9), B::kMid, 1e9);
  ASSERT_EQ(m.rounds.size(), 1u);
  EXPECT_DOUBLE_EQ(m.rounds[0].bytes, 1100e6);
  EXPECT_DOUBLE_EQ(m.rounds[0].seconds, 1.1);
  EXPECT_DOUBLE_EQ(m.final_bytes, 100e6);
  EXPECT_NEAR(m.stun_ms, 102.0, 1e-9);
  EXPECT_NEAR(m.total_ms, 1202.0, 1e-9);
  EXPECT_EQ(m.stop_reason, StopReason::kConverged);
  EXPECT_TRUE(m.switches);
}

// The same device, its weights held by the destination's content store
// (--content-store-hint), offered at 2 GB/s: round 0 sends the hot set and one
// 32-byte digest per 4096-byte weights page (7.8125 MB), and spends 0.5 s
// reading and hashing the weights: 107.8125 MB in 0.1078 s + 0.5 s. The rounds'
// bandwidth leaves the offer's time out, as the engine does.
TEST(Model, WeightsTheDestinationHoldsCostTheirDigestsAndTheOffersTime) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, 1.0, Curve({0.01, 1}, {0, 0})));
  p.regions.push_back(Region(1, 100e6, 1.0, Curve({0.01, 0.1}, {10e6, 100e6})));
  p.regions[0].held_fraction = 1.0;
  p.offer_bytes_per_s = 2e9;
  ModelRun m = RunModel(p, Params(1e9), B::kMid, 1e9);
  ASSERT_GE(m.rounds.size(), 1u);
  EXPECT_NEAR(m.rounds[0].bytes, 100e6 + 1000e6 / 4096 * 32, 1);
  EXPECT_NEAR(m.rounds[0].offer_seconds, 0.5, 1e-9);
  EXPECT_NEAR(m.rounds[0].seconds, 0.1078125 + 0.5, 1e-9);
  EXPECT_NEAR(m.final_bytes, 100e6, 1);  // 0.61 s dirties the whole hot set
  EXPECT_NEAR(m.stun_ms, 102.0, 1e-6) << "the stun is predicted at the link's rate, not diluted by the offer";

  // Held half: half the weights' bytes go, half are offered.
  p.regions[0].held_fraction = 0.5;
  ModelRun half = RunModel(p, Params(1e9), B::kMid, 1e9);
  EXPECT_NEAR(half.rounds[0].bytes, 100e6 + 500e6 + 500e6 / 4096 * 32, 1);
  EXPECT_NEAR(half.rounds[0].offer_seconds, 0.25, 1e-9);
}

TEST(ContentHint, SetsHeldSharesByRegionOrStaticAndNamesAnUnknownRegion) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, 1.0, Curve({0.01, 1}, {0, 0})));
  p.regions.push_back(Region(1, 100e6, 1.0, Curve({0.01, 1}, {0, 0})));
  p.regions[0].info.hint = RegionHint::kStatic;
  ASSERT_TRUE(ApplyContentHint({{"static", 1.0}}, p).ok());
  EXPECT_EQ(p.regions[0].held_fraction, 1.0);
  EXPECT_EQ(p.regions[1].held_fraction, 0.0);
  ASSERT_TRUE(ApplyContentHint({{"r1", 0.25}}, p).ok());
  EXPECT_EQ(p.regions[1].held_fraction, 0.25);
  Status bad = ApplyContentHint({{"weights", 1.0}}, p);
  EXPECT_NE(bad.message().find("no region 'weights' (the regions: r0, r1; or 'static')"), std::string::npos)
      << bad.message();
  EXPECT_FALSE(ApplyContentHint({{"r0", 1.5}}, p).ok());
}

// A KV cache appending 200 MB/s, 1 GB of it non-zero, link 1 GB/s, target 50 ms:
// round 0: 1 GB in 1 s -> 200 MB dirty (stun 202 ms, continue);
// round 1: 200 MB in 0.2 s -> 40 MB dirty (stun 42 ms, switch).
TEST(Model, AppendOnlyCacheNeedsTwoRounds) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 10e9, 0.1, Curve({0.01, 0.1}, {2e6, 20e6})));
  ModelParams params = Params(1e9);
  params.downtime_target = 50ms;
  ModelRun m = RunModel(p, params, B::kMid, 1e9);
  ASSERT_EQ(m.rounds.size(), 2u);
  EXPECT_DOUBLE_EQ(m.rounds[0].bytes, 1e9);
  EXPECT_NEAR(m.rounds[1].bytes, 200e6, 1);
  EXPECT_NEAR(m.rounds[1].seconds, 0.2, 1e-9);
  EXPECT_NEAR(m.stun_ms, 42.0, 1e-6);
  EXPECT_NEAR(m.total_ms, 1242.0, 1e-6);
  EXPECT_EQ(m.stop_reason, StopReason::kConverged);
}

// 500 MB rewritten at 2 GB/s over a 1 GB/s link: every round re-sends all of it.
// After four equal rounds the rule sees no shrinking: 502 ms of stun.
TEST(Model, DirtyRateAboveTheLinkCannotConverge) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 500e6, 1.0, Curve({0.01, 0.1}, {20e6, 200e6})));
  ModelParams params = Params(1e9);
  params.max_stun = 100ms;
  Prediction pr = Predict(p, params);
  EXPECT_EQ(pr.mid.rounds.size(), 4u);
  EXPECT_EQ(pr.mid.stop_reason, StopReason::kNotShrinking);
  EXPECT_NEAR(pr.mid.stun_ms, 502.0, 1e-6);
  EXPECT_FALSE(pr.mid.switches);
  EXPECT_EQ(pr.decision, EstimateDecision::kCannotConverge);
  EXPECT_EQ(EstimateDecisionName(pr.decision), "cannot-converge");

  params.max_stun = 1s;  // a longer stun is acceptable: switch over anyway
  pr = Predict(p, params);
  EXPECT_EQ(pr.decision, EstimateDecision::kLiveMigrate);
  EXPECT_EQ(pr.mid.stop_reason, StopReason::kNotShrinking);
}

TEST(Model, RoundLimitWithTooLongAStunRecommendsDrainAndReplace) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 10e9, 0.1, Curve({0.01, 0.1}, {2e6, 20e6})));
  ModelParams params = Params(1e9);
  params.downtime_target = 10ms;
  params.max_rounds = 1;
  params.max_stun = 100ms;
  Prediction pr = Predict(p, params);
  EXPECT_EQ(pr.mid.stop_reason, StopReason::kRoundLimit);
  EXPECT_EQ(pr.decision, EstimateDecision::kDrainAndReplace);
}

TEST(Model, RangePairsLowDirtWithHighBandwidth) {
  DeviceProfile p;
  RegionProfile r = Region(0, 10e9, 0.1, Curve({0.01, 0.1}, {2e6, 20e6}));
  r.dirty.low_bytes = {1e6, 10e6};
  r.dirty.high_bytes = {4e6, 40e6};
  p.regions.push_back(r);
  ModelParams params = Params(1e9);
  params.bandwidth_low = 0.5e9;
  params.bandwidth_high = 2e9;
  Prediction pr = Predict(p, params);
  EXPECT_LT(pr.low.stun_ms, pr.mid.stun_ms);
  EXPECT_LT(pr.mid.stun_ms, pr.high.stun_ms);
  EXPECT_LT(pr.low.total_ms, pr.high.total_ms);
  // Low: 0.5 s round 0 at 2 GB/s dirties 50 MB -> 25 ms + 2 ms.
  EXPECT_NEAR(pr.low.stun_ms, 27.0, 1e-6);
}

TEST(Model, ProjectionScalesRegionsAndStatesItsAssumptions) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1e9, 1.0, Curve({0.01, 0.1}, {1e6, 10e6})));
  p.regions.push_back(Region(1, 3e9, 1.0, Curve({0.01, 0.1}, {0, 0})));
  std::vector<std::string> why;
  DeviceProfile big = ProjectProfile(p, 40'000'000'000ull, true, &why);
  EXPECT_EQ(big.regions[0].info.size_bytes, 10'000'000'000ull);
  EXPECT_EQ(big.regions[1].info.size_bytes, 30'000'000'000ull);
  EXPECT_DOUBLE_EQ(big.regions[0].dirty.mid_bytes[1], 100e6);
  EXPECT_GE(why.size(), 3u);
  DeviceProfile same = ProjectProfile(p, 40'000'000'000ull, false, nullptr);
  EXPECT_DOUBLE_EQ(same.regions[0].dirty.mid_bytes[1], 10e6);
}

}  // namespace
}  // namespace gpumigrate
