// The estimator's model with memory moved beside the device on the same link
// (BesideMemory: a QEMU guest's RAM), on hand-computed cases.
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

// 1 GB of static device memory beside 4 GB of static RAM: round 0 (the device's
// bulk) has the link alone, 1 s; the device is clean, the rule says go; QEMU,
// started then, sends 3.7 GB in 3.7 s while the switchover is held, until 0.3 GB
// (300 ms x 1 GB/s) is left, and 0.1 GB more before its next 100 ms threshold
// update lets it pause: 0.2 GB in the stun, 200 ms + 2 ms. Every RAM byte is in
// the total: (1 GB + 4 GB) / 1 GB/s + 2 ms.
TEST(BesideModel, RamBytesAreCountedInTheTotal) {
  DeviceProfile p = OneRegion(1e9, 1.0, Curve({0.01, 1}, {0, 0}));
  ModelRun m = RunModel(p, Params(4e9, 0), B::kMid, 1e9);
  ASSERT_EQ(m.rounds.size(), 1u);
  EXPECT_DOUBLE_EQ(m.rounds[0].seconds, 1.0);
  EXPECT_TRUE(m.switches);
  EXPECT_FALSE(m.beside_paused_first);
  EXPECT_NEAR(m.converge_ms, 3800, 1e-6);
  EXPECT_EQ(m.held_rounds, 38u) << "a clean device: each held round is the hook's 100 ms wait";
  EXPECT_NEAR(m.beside_final_bytes, 0.2e9, 1);
  EXPECT_NEAR(m.beside_bytes, 4e9, 1);
  EXPECT_NEAR(m.stun_ms, 202, 1e-6);
  EXPECT_NEAR(m.device_stun_ms, 2, 1e-6);  // the engine's rule sees only the device
  EXPECT_NEAR(m.total_ms, 5002, 1e-6);
  ModelRun alone = RunModel(p, Params(0, 0), B::kMid, 1e9);
  EXPECT_NEAR(alone.total_ms, 1002, 1e-6);
}

// 2 GB of device memory dirtied at 0.5 GB/s (W(t) linear) beside 0.5 GB of RAM.
// Round 0: 2 s alone, 1 GB dirtied (rule: 1 s, go on). QEMU starts; round 1
// sends at half the link while QEMU's first pass takes 1 s, then QEMU 7.2 pauses
// the guest by itself: the engine cuts round 1 there (0.5 GB of its 1 GB sent),
// and the final round carries the unsent 0.5 GB plus the 0.5 GB dirtied in that
// second: 1 GB / 1 GB/s + 2 ms. A RAM dirty rate of 0.2 GB/s adds the 0.2 GB
// dirtied since QEMU started.
TEST(BesideModel, QemuPausingFirstCutsTheRoundAndStunsForItsRest) {
  DeviceProfile p = OneRegion(2e9, 1.0, Curve({0.01, 1, 10}, {5e6, 0.5e9, 5e9}));
  ModelRun clean = RunModel(p, Params(0.5e9, 0), B::kMid, 1e9);
  ASSERT_EQ(clean.rounds.size(), 2u);
  EXPECT_DOUBLE_EQ(clean.rounds[0].seconds, 2.0);
  EXPECT_DOUBLE_EQ(clean.rounds[1].seconds, 1.0);
  EXPECT_NEAR(clean.rounds[1].bytes, 0.5e9, 1);
  EXPECT_TRUE(clean.beside_paused_first);
  EXPECT_EQ(clean.held_rounds, 0u) << "QEMU paused first: nothing held";
  EXPECT_TRUE(clean.switches);
  EXPECT_NEAR(clean.final_bytes, 1e9, 1e3);
  EXPECT_NEAR(clean.stun_ms, 1002, 1e-3);
  EXPECT_NEAR(clean.total_ms, 4002, 1e-3);
  EXPECT_NEAR(clean.beside_bytes, 0.5e9, 1);

  ModelRun dirty = RunModel(p, Params(0.5e9, 0.2e9), B::kMid, 1e9);
  EXPECT_NEAR(dirty.beside_final_bytes, 0.2e9, 1);
  EXPECT_NEAR(dirty.stun_ms, 1202, 1e-3);
  EXPECT_NEAR(dirty.total_ms, 4202, 1e-3);
  EXPECT_GT(dirty.stun_ms, clean.stun_ms);
}

// The RAM's dirty rate was measured over 2 s: the pessimistic run takes that
// window's 0.4 GB as dirtied within the 1 s first pass too (a hot set rewritten
// faster than the window); the mid run keeps 0.2 GB/s x 1 s.
TEST(BesideModel, ThePessimisticRunTakesTheWholeWindowsDirtySet) {
  DeviceProfile p = OneRegion(2e9, 1.0, Curve({0.01, 1, 10}, {5e6, 0.5e9, 5e9}));
  ModelParams params = Params(0.5e9, 0.2e9);
  params.beside.dirty_window_s = 2;
  Prediction pr = Predict(p, params);
  EXPECT_NEAR(pr.mid.beside_final_bytes, 0.2e9, 1);
  EXPECT_NEAR(pr.mid.stun_ms, 1202, 1e-3);
  EXPECT_NEAR(pr.high.beside_final_bytes, 0.4e9, 1);
  EXPECT_NEAR(pr.high.stun_ms, 1402, 1e-3);
  EXPECT_NEAR(pr.stun_high_ms, 1402, 1e-3);
  EXPECT_NEAR(pr.low.stun_ms, 1202, 1e-3);
}

// A KV cache growing 200 MB/s beside 4 GB of RAM: round 0, 1 GB alone in 1 s
// (200 MB dirty: rule 202 ms, go). The switchover is held while QEMU converges:
// clean RAM shrinks from 4 GB to 0.3 GB in 3.7 s; RAM dirtied at 0.5 GB/s shrinks
// at 0.5 GB/s, 7.4 s; then 100 ms more to QEMU's threshold update (0.2 GB left
// clean, 0.25 GB dirty). The held rounds keep the device's final round at one
// round's dirtying (200 MB) and QEMU leaves at most its threshold: the dirtier RAM
// costs 3.75 s of total time and only 50 ms of stun.
TEST(BesideModel, ADirtierRamLengthensTheConvergenceWhileTheHoldKeepsTheStun) {
  DeviceProfile p = OneRegion(10e9, 0.1, Curve({0.01, 0.1}, {2e6, 20e6}));
  ModelRun clean = RunModel(p, Params(4e9, 0), B::kMid, 1e9);
  ASSERT_EQ(clean.rounds.size(), 1u);
  EXPECT_NEAR(clean.converge_ms, 3800, 1e-6);
  EXPECT_NEAR(clean.final_bytes, 200e6, 1e3);
  EXPECT_NEAR(clean.stun_ms, 402, 1e-3);
  EXPECT_NEAR(clean.device_stun_ms, 202, 1e-3);

  ModelRun dirty = RunModel(p, Params(4e9, 0.5e9), B::kMid, 1e9);
  EXPECT_NEAR(dirty.converge_ms, 7500, 1e-6);
  // Held rounds of 100 ms plus the device's dirtying at half the link: 0.5 s,
  // 0.3 s, 0.22 s, ... towards 1/6 s (t = 0.1 + 200 MB/s x t / 0.5 GB/s).
  EXPECT_GT(clean.held_rounds, 15u);
  EXPECT_LT(clean.held_rounds, 25u);
  EXPECT_GT(dirty.held_rounds, clean.held_rounds + 15);
  EXPECT_NEAR(dirty.stun_ms, 452, 1e-3);
  EXPECT_NEAR(dirty.total_ms - clean.total_ms, 3750, 1e-3);
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
