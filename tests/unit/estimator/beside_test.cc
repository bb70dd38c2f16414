// The estimator's model with memory moved beside the device on the same link
// (BesideMemory: a QEMU guest's RAM), on hand-computed cases.
#include <gtest/gtest.h>

#include "gpumigrate/estimator.h"

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

DeviceProfile OneRegion(double size, double nonzero, WorkingSetCurve w) {
  DeviceProfile p;
  RegionProfile r;
  r.info = RegionInfo{0, "r0", static_cast<uint64_t>(size), 4096, RegionHint::kDynamic};
  r.nonzero_fraction = nonzero;
  r.dirty = std::move(w);
  p.regions.push_back(std::move(r));
  return p;
}

// 1 GB/s, 2 ms fixed cost, 300 ms target; the guest's RAM gets half the link
// while both send.
ModelParams Params(double ram_bytes, double ram_dirty_bytes_per_s) {
  ModelParams p;
  p.bandwidth_low = p.bandwidth_mid = p.bandwidth_high = 1e9;
  p.fixed_cost = 2ms;
  p.downtime_target = 300ms;
  p.max_stun = 100s;
  p.max_rounds = 30;
  p.beside.name = "guest RAM";
  p.beside.bytes = ram_bytes;
  p.beside.dirty_bytes_per_s = ram_dirty_bytes_per_s;
  p.beside.link_share = 0.5;
  return p;
}

void ExpectSameRun(const ModelRun& a, const ModelRun& b) {
  ASSERT_EQ(a.rounds.size(), b.rounds.size());
  for (size_t i = 0; i < a.rounds.size(); ++i) {
    EXPECT_EQ(a.rounds[i].bytes, b.rounds[i].bytes) << i;
    EXPECT_EQ(a.rounds[i].seconds, b.rounds[i].seconds) << i;
  }
  EXPECT_EQ(a.final_bytes, b.final_bytes);
  EXPECT_EQ(a.stun_ms, b.stun_ms);
  EXPECT_EQ(a.total_ms, b.total_ms);
  EXPECT_EQ(a.stop_reason, b.stop_reason);
  EXPECT_EQ(a.switches, b.switches);
  EXPECT_EQ(a.policy_reason, b.policy_reason);
}

// No bytes beside the device: exactly the device-only prediction, whatever the
// other fields say.
TEST(BesideModel, ZeroBytesIsTheDeviceOnlyPredictionExactly) {
  DeviceProfile p = OneRegion(10e9, 0.1, Curve({0.01, 0.1}, {2e6, 20e6}));
  ModelParams alone = Params(0, 0);
  alone.beside = BesideMemory{};
  ModelParams zero = Params(0, 5e8);
  zero.beside.link_share = 0.3;
  zero.bandwidth_low = alone.bandwidth_low = 0.5e9;
  zero.bandwidth_high = alone.bandwidth_high = 2e9;
  Prediction a = Predict(p, alone), z = Predict(p, zero);
  ExpectSameRun(a.mid, z.mid);
  ExpectSameRun(a.low, z.low);
  ExpectSameRun(a.high, z.high);
  EXPECT_EQ(a.stun_low_ms, z.stun_low_ms);
  EXPECT_EQ(a.stun_high_ms, z.stun_high_ms);
  EXPECT_EQ(a.total_low_ms, z.total_low_ms);
  EXPECT_EQ(a.total_high_ms, z.total_high_ms);
  EXPECT_EQ(a.decision, z.decision);
  EXPECT_EQ(a.explanation, z.explanation);
  EXPECT_EQ(z.mid.beside_bytes, 0);
}

// 1 GB of static device memory beside 4 GB of static RAM: round 0 runs at half
// the link (2 s, 1 GB of RAM sent meanwhile); the device is clean, the rule says
// go; QEMU alone sends 2.7 GB more in 2.7 s until 0.3 GB (300 ms x 1 GB/s) is
// left, which it sends during the stun: 300 ms + 2 ms. Every RAM byte is in the
// total: (1 GB + 4 GB) / 1 GB/s + 2 ms.
TEST(BesideModel, RamBytesAreCountedInTheTotal) {
  DeviceProfile p = OneRegion(1e9, 1.0, Curve({0.01, 1}, {0, 0}));
  ModelRun m = RunModel(p, Params(4e9, 0), B::kMid, 1e9);
  ASSERT_EQ(m.rounds.size(), 1u);
  EXPECT_DOUBLE_EQ(m.rounds[0].seconds, 2.0);
  EXPECT_TRUE(m.switches);
  EXPECT_FALSE(m.beside_paused_first);
  EXPECT_NEAR(m.converge_ms, 2700, 1e-6);
  EXPECT_NEAR(m.beside_final_bytes, 0.3e9, 1);
  EXPECT_NEAR(m.beside_bytes, 4e9, 1);
  EXPECT_NEAR(m.stun_ms, 302, 1e-6);
  EXPECT_NEAR(m.device_stun_ms, 2, 1e-6);  // the engine's rule sees only the device
  EXPECT_NEAR(m.total_ms, 5002, 1e-6);
  ModelRun alone = RunModel(p, Params(0, 0), B::kMid, 1e9);
  EXPECT_NEAR(alone.total_ms, 1002, 1e-6);
}

// 2 GB of device memory beside 0.5 GB of RAM: QEMU's first pass ends after 1 s
// (half the link) and QEMU 7.2 pauses the guest by itself; the device sends its
// remaining 1.5 GB at the full link while the guest stays stopped. A RAM dirty
// rate of 0.2 GB/s leaves 0.2 GB dirtied during that first second to send in the
// stun as well.
TEST(BesideModel, QemuPausingFirstStunsTheGuestUntilTheRoundEnds) {
  DeviceProfile p = OneRegion(2e9, 1.0, Curve({0.01, 1}, {0, 0}));
  ModelRun clean = RunModel(p, Params(0.5e9, 0), B::kMid, 1e9);
  ASSERT_EQ(clean.rounds.size(), 1u);
  EXPECT_DOUBLE_EQ(clean.rounds[0].seconds, 2.5);
  EXPECT_TRUE(clean.beside_paused_first);
  EXPECT_TRUE(clean.switches);
  EXPECT_NEAR(clean.stopped_before_switchover_ms, 1500, 1e-6);
  EXPECT_NEAR(clean.stun_ms, 1502, 1e-6);
  EXPECT_NEAR(clean.total_ms, 2502, 1e-6);  // (2 GB + 0.5 GB) / 1 GB/s + 2 ms
  EXPECT_NEAR(clean.beside_bytes, 0.5e9, 1);

  ModelRun dirty = RunModel(p, Params(0.5e9, 0.2e9), B::kMid, 1e9);
  EXPECT_NEAR(dirty.beside_final_bytes, 0.2e9, 1);
  EXPECT_NEAR(dirty.stun_ms, 1702, 1e-6);
  EXPECT_NEAR(dirty.total_ms, 2702, 1e-6);
}

// The RAM's dirty rate was measured over 2 s: the pessimistic run takes that
// window's 0.4 GB as dirtied within the 1 s first pass too (a hot set rewritten
// faster than the window); the mid run keeps 0.2 GB/s x 1 s.
TEST(BesideModel, ThePessimisticRunTakesTheWholeWindowsDirtySet) {
  DeviceProfile p = OneRegion(2e9, 1.0, Curve({0.01, 1}, {0, 0}));
  ModelParams params = Params(0.5e9, 0.2e9);
  params.beside.dirty_window_s = 2;
  Prediction pr = Predict(p, params);
  EXPECT_NEAR(pr.mid.beside_final_bytes, 0.2e9, 1);
  EXPECT_NEAR(pr.mid.stun_ms, 1702, 1e-6);
  EXPECT_NEAR(pr.high.beside_final_bytes, 0.4e9, 1);
  EXPECT_NEAR(pr.high.stun_ms, 1902, 1e-6);
  EXPECT_NEAR(pr.stun_high_ms, 1902, 1e-6);
  EXPECT_NEAR(pr.low.stun_ms, 1702, 1e-6);
}

// A KV cache growing 200 MB/s beside 4 GB of RAM. Rounds at half the link:
// 1 GB in 2 s (400 MB dirty, rule: 802 ms), 400 MB in 0.8 s (160 MB: 322 ms),
// 160 MB in 0.32 s (64 MB: 130 ms, go) after 3.12 s, 1.56 GB of RAM sent.
// Clean RAM: QEMU's 2.44 GB backlog shrinks to 0.3 GB in 2.14 s; the device's
// final set spans 0.32 + 2.14 s = 492 MB: (492 + 300) MB / 1 GB/s + 2 ms.
// RAM dirtied at 0.5 GB/s: the backlog is all 4 GB and shrinks at 0.5 GB/s,
// 7.4 s, so the device dirties 1544 MB meanwhile: a longer stun.
TEST(BesideModel, ADirtierRamRaisesTheStun) {
  DeviceProfile p = OneRegion(10e9, 0.1, Curve({0.01, 0.1}, {2e6, 20e6}));
  ModelRun clean = RunModel(p, Params(4e9, 0), B::kMid, 1e9);
  ASSERT_EQ(clean.rounds.size(), 3u);
  EXPECT_NEAR(clean.rounds[2].bytes, 160e6, 1);
  EXPECT_NEAR(clean.converge_ms, 2140, 1e-6);
  EXPECT_NEAR(clean.final_bytes, 492e6, 1);
  EXPECT_NEAR(clean.stun_ms, 794, 1e-6);
  EXPECT_NEAR(clean.device_stun_ms, 130, 1e-3);  // the rule counts whole bytes

  ModelRun dirty = RunModel(p, Params(4e9, 0.5e9), B::kMid, 1e9);
  EXPECT_NEAR(dirty.converge_ms, 7400, 1e-6);
  EXPECT_NEAR(dirty.final_bytes, 1544e6, 1);
  EXPECT_NEAR(dirty.stun_ms, 1846, 1e-6);
  EXPECT_GT(dirty.stun_ms, clean.stun_ms);
  EXPECT_GT(dirty.total_ms, clean.total_ms);
  EXPECT_GT(Predict(p, Params(4e9, 0.5e9)).mid.stun_ms, Predict(p, Params(4e9, 0)).mid.stun_ms);
}

// RAM dirtied as fast as the link carries it never fits QEMU's threshold.
TEST(BesideModel, RamDirtiedFasterThanTheLinkCannotConverge) {
  DeviceProfile p = OneRegion(1e9, 1.0, Curve({0.01, 1}, {0, 0}));
  Prediction pr = Predict(p, Params(4e9, 1.5e9));
  EXPECT_FALSE(pr.mid.switches);
  EXPECT_EQ(pr.mid.stop_reason, StopReason::kNotShrinking);
  EXPECT_EQ(pr.decision, EstimateDecision::kCannotConverge);
  EXPECT_NE(pr.mid.policy_reason.find("guest RAM cannot converge"), std::string::npos) << pr.mid.policy_reason;
}

}  // namespace
}  // namespace gpumigrate
