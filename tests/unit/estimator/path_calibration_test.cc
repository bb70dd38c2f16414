// The path calibration (gpumigrate/estimator/path_calibration.h): its fit recovers known
// costs from synthetic runs, reports are read back, the store keeps one entry per
// configuration and rejects a damaged file by name; and the model's use of it
// (round overhead, stun = fixed + final / final rate, the marginal outcome).
#include "gpumigrate/estimator/path_calibration.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <gtest/gtest.h>

#include "gpumigrate/estimator/estimator.h"
#include "tests/support/calibration_dir.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using B = WorkingSetCurve::Bound;

// Round 0 at 500 MB/s; later rounds cost 4 ms beyond their bytes; the stun is
// 20 ms + final / 250 MB/s.
PathRun MakeRun(bool small, double wobble = 1.0) {
  PathRun r;
  r.small_final = small;
  r.round0_bytes = 200e6;
  r.round0_raw_bytes = 200e6;
  r.round0_ms = 400.0 * wobble;
  const double hot = small ? 0.1e6 : 20e6;
  r.final_bytes = hot;
  r.stun_ms = 20.0 + hot / 250e6 * 1e3;
  if (!small) {
    r.dirty_rounds = {{20e6, 20e6 / 500e6 * 1e3 + 4.0}, {20e6, 20e6 / 500e6 * 1e3 + 4.0}};
  }
  return r;
}

TEST(PathCalibrationFit, RecoversTheRatesAndCostsItWasGiven) {
  PathConfig cfg;
  auto c = FitPathCalibration(cfg, {MakeRun(true), MakeRun(false), MakeRun(true), MakeRun(false)});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NEAR(c->bytes_per_s, 500e6, 1);
  EXPECT_NEAR(c->round_overhead_ms, 4.0, 1e-9);
  EXPECT_NEAR(c->final_bytes_per_s, 250e6, 1);
  EXPECT_NEAR(c->fixed_ms, 20.0, 1e-9);
  EXPECT_DOUBLE_EQ(c->wire_ratio, 1.0);
  EXPECT_EQ(c->runs, 4);
}

// Round 0 lasts 300 ms of startup plus its bytes at 500 MB/s: the small kind
// moves 50 MB in 400 ms, the large 200 MB in 700 ms (neither alone says 500 MB/s).
TEST(PathCalibrationFit, RoundZerosStartupComesFromTheTwoSizes) {
  PathRun small = MakeRun(true), large = MakeRun(false);
  small.round0_bytes = small.round0_raw_bytes = 50e6;
  small.round0_ms = 400;
  large.round0_ms = 700;
  auto c = FitPathCalibration(PathConfig{}, {small, large, small, large});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NEAR(c->round0_startup_ms, 300.0, 1e-6);
  EXPECT_NEAR(c->bytes_per_s, 500e6, 1);
  DeviceProfile p;
  RegionProfile r;
  r.info = RegionInfo{0, "weights", 1'000'000'000, 4096, RegionHint::kStatic};
  r.dirty.window_s = {0.01, 1};
  r.dirty.low_bytes = r.dirty.mid_bytes = r.dirty.high_bytes = {0, 0};
  p.regions.push_back(r);
  ModelParams params;
  params.bandwidth_low = params.bandwidth_mid = params.bandwidth_high = c->bytes_per_s;
  params.path.round0_startup_s = c->round0_startup_ms / 1e3;
  params.path.fixed_ms[1] = c->fixed_ms;
  params.path.final_bytes_per_s[1] = c->final_bytes_per_s;
  ModelRun m = RunModel(p, params, B::kMid, c->bytes_per_s);
  EXPECT_NEAR(m.rounds[0].seconds, 0.3 + 2.0, 1e-9);  // 1 GB at 500 MB/s after the startup
}

// cli_contract under CI's sanitizers: a 6 MiB round 0 rode the token bucket's
// first burst, the startup fit put the bulk at 128 MB/s and the fastest run at
// 543 MB/s under a 125 MB/s cap. No rate of a capped path exceeds the cap.
TEST(PathCalibrationFit, ACappedPathNeverRunsFasterThanItsCap) {
  PathConfig capped;
  capped.cap_bytes_per_s = 125e6;
  PathRun small = MakeRun(true), large = MakeRun(false);
  small.round0_bytes = small.round0_raw_bytes = 6e6;
  small.round0_ms = 11;  // 545 MB/s: the burst
  large.round0_bytes = large.round0_raw_bytes = 24e6;
  large.round0_ms = 150;
  auto c = FitPathCalibration(capped, {small, large, small, large});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_LE(c->bytes_per_s, 125e6);
  EXPECT_LE(c->high_bytes_per_s, 125e6);
  EXPECT_LE(c->low_bytes_per_s, c->bytes_per_s);
}

// cli_contract on a loaded machine: one small run ended before the startup the
// medians fitted, its rate came out negative, the stored file was refused on
// reading (so every estimate measured again) and the range printed null.
TEST(PathCalibrationFit, ARunShorterThanTheFittedStartupLeavesEveryRatePositive) {
  PathRun slow = MakeRun(true), fast = MakeRun(true), large = MakeRun(false);
  slow.round0_bytes = slow.round0_raw_bytes = fast.round0_bytes = fast.round0_raw_bytes = 50e6;
  slow.round0_ms = 400;
  fast.round0_ms = 120;  // shorter than the 300 ms startup of the medians
  large.round0_ms = 700;
  auto c = FitPathCalibration(PathConfig{}, {slow, slow, fast, large, large});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_GT(c->low_bytes_per_s, 0);
  EXPECT_LE(c->low_bytes_per_s, c->bytes_per_s);
  EXPECT_GE(c->high_bytes_per_s, c->bytes_per_s);
}

TEST(PathCalibrationFit, TheRangeSpansTheRuns) {
  auto c = FitPathCalibration(PathConfig{}, {MakeRun(true, 0.8), MakeRun(false, 1.25), MakeRun(true), MakeRun(false)});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NEAR(c->high_bytes_per_s, 500e6 / 0.8, 1);
  EXPECT_NEAR(c->low_bytes_per_s, 500e6 / 1.25, 1);
  EXPECT_LE(c->fixed_low_ms, c->fixed_ms);
  EXPECT_LE(c->fixed_ms, c->fixed_high_ms);
  EXPECT_LE(c->final_low_bytes_per_s, c->final_bytes_per_s);
  EXPECT_LE(c->final_bytes_per_s, c->final_high_bytes_per_s);
}

TEST(PathCalibrationFit, NeedsBothKindsOfRun) {
  auto c = FitPathCalibration(PathConfig{}, {MakeRun(true), MakeRun(true)});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("small and with a large final round"), std::string::npos);
}

TEST(PathCalibrationReport, ReadsRoundsFinalAndStun) {
  const std::string report = R"({"outcome":"completed","stun_ms":31.5,"rounds":[
    {"round":0,"final":false,"bytes":1000,"raw_bytes":1500,"ms":2.0},
    {"round":1,"final":false,"bytes":100,"ms":0.5},
    {"round":2,"final":true,"bytes":40,"ms":0.1}],
    "stun_breakdown_ms":{"stop_device":0.1,"final_sync":0.7}})";
  auto r = PathRunFromReport(report, false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->final_sync_ms, 0.7);
  EXPECT_DOUBLE_EQ(r->round0_bytes, 1000);
  EXPECT_DOUBLE_EQ(r->round0_raw_bytes, 1500);
  ASSERT_EQ(r->dirty_rounds.size(), 1u);
  EXPECT_DOUBLE_EQ(r->final_bytes, 40);
  EXPECT_DOUBLE_EQ(r->stun_ms, 31.5);
  auto aborted = PathRunFromReport(R"({"outcome":"aborted","rounds":[]})", true);
  ASSERT_FALSE(aborted.ok());
  EXPECT_NE(aborted.status().message().find("did not complete"), std::string::npos);
  EXPECT_FALSE(PathRunFromReport("not json", true).ok());
}

using PathCalibrationStore = testing::CalibrationDirTest;

TEST_F(PathCalibrationStore, LivesBesideTheCalibrationOneEntryPerConfiguration) {
  EXPECT_EQ(DefaultPathCalibrationFile(), (dir_ / "calibration-paths.json").string());
  PathConfig tls, capped;
  capped.transport = "insecure";
  capped.cap_bytes_per_s = 300e6;
  EXPECT_EQ(capped.Key(), "insecure/2/none/300000000B/s");
  auto none = LoadPathCalibration(tls);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  auto a = FitPathCalibration(tls, {MakeRun(true), MakeRun(false)});
  auto b = FitPathCalibration(capped, {MakeRun(true, 2.0), MakeRun(false, 2.0)});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(StorePathCalibration(*a).ok());
  ASSERT_TRUE(StorePathCalibration(*b).ok());
  auto la = LoadPathCalibration(tls), lb = LoadPathCalibration(capped);
  ASSERT_TRUE(la.ok() && lb.ok());
  ASSERT_TRUE(la->has_value() && lb->has_value());
  EXPECT_NEAR((*la)->bytes_per_s, 500e6, 1);
  EXPECT_NEAR((*lb)->bytes_per_s, 250e6, 1);
  EXPECT_EQ((*lb)->config.Key(), capped.Key());
}

TEST_F(PathCalibrationStore, TheProcBackendHasItsOwnEntryAndOldEntriesAreSim) {
  EXPECT_EQ(PathBackendFor("proc:1234"), "proc");
  EXPECT_EQ(PathBackendFor("proc:1234,tracker=hash"), "proc");
  EXPECT_EQ(PathBackendFor("sim:size=64MiB"), "sim");
  EXPECT_EQ(PathBackendFor("shm:/dev/shm/x"), "sim");
  PathConfig sim, proc;
  proc.backend = "proc";
  EXPECT_EQ(sim.Key(), "tls/2/none/uncapped");  // the key files written before backends keep
  EXPECT_EQ(proc.Key(), "tls/2/none/uncapped/proc");

  auto a = FitPathCalibration(sim, {MakeRun(true), MakeRun(false)});
  auto b = FitPathCalibration(proc, {MakeRun(true, 2.0), MakeRun(false, 2.0)});
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(StorePathCalibration(*a).ok());
  auto none = LoadPathCalibration(proc);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value()) << "a sim entry is not the proc backend's";
  ASSERT_TRUE(StorePathCalibration(*b).ok());
  auto la = LoadPathCalibration(sim), lb = LoadPathCalibration(proc);
  ASSERT_TRUE(la.ok() && lb.ok() && la->has_value() && lb->has_value());
  EXPECT_EQ((*la)->config.backend, "sim");
  EXPECT_EQ((*lb)->config.backend, "proc");
  EXPECT_NEAR((*la)->bytes_per_s, 500e6, 1);
  EXPECT_NEAR((*lb)->bytes_per_s, 250e6, 1);

  // An entry written before backends were told apart has no "backend": sim.
  const std::string file = DefaultPathCalibrationFile();
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const std::string field = "\"backend\": \"sim\",";
  for (size_t at; (at = text.find(field)) != std::string::npos;) text.erase(at, field.size());
  ASSERT_EQ(text.find("\"backend\": \"sim\""), std::string::npos) << text;
  { std::ofstream(file) << text; }
  auto old = LoadPathCalibration(sim);
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  ASSERT_TRUE(old->has_value());
  EXPECT_EQ((*old)->config.backend, "sim");
}

TEST_F(PathCalibrationStore, ADamagedFileIsRejectedByName) {
  const std::string file = DefaultPathCalibrationFile();
  { std::ofstream(file) << "{ half"; }
  auto r = LoadPathCalibration(PathConfig{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(file), std::string::npos) << r.status().message();

  auto c = FitPathCalibration(PathConfig{}, {MakeRun(true), MakeRun(false)});
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(StorePathCalibration(*c).ok());  // a damaged cache is replaced
  std::ifstream in(file);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("\"fixed_ms\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 10, "\"fixed_ms\": -5, \"x\"");
  { std::ofstream(file) << text; }
  auto bad = LoadPathCalibration(PathConfig{});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tls/2/none/uncapped"), std::string::npos) << bad.status().message();
}

RegionProfile Region(uint32_t id, double size, std::vector<double> t, std::vector<double> bytes) {
  RegionProfile r;
  std::string name = "r";
  name += std::to_string(id);
  r.info = RegionInfo{id, std::move(name), static_cast<uint64_t>(size), 4096, RegionHint::kDynamic};
  r.dirty.window_s = std::move(t);
  r.dirty.low_bytes = r.dirty.mid_bytes = r.dirty.high_bytes = std::move(bytes);
  return r;
}

ModelParams Params(double bw) {
  ModelParams p;
  p.bandwidth_low = p.bandwidth_mid = p.bandwidth_high = bw;
  p.fixed_cost = 20ms;
  p.downtime_target = 300ms;
  return p;
}

// 1 GB of weights and a KV cache appending 100 MB/s at 1 GB/s: round 0 takes 1 s
// and dirties 100 MB. With the path's figures the stun is 20 ms + 100 MB at
// 250 MB/s = 420 ms, not the engine's 100 MB / 1 GB/s + 20 ms = 120 ms.
// A shm device's hash tracker reads the whole device at every sync: 80 ms where
// the calibration's sim synced in 0.1 ms. The stun's final sync and every round
// after round 0 take the difference longer; the engine's rule (its fixed cost
// as `migrate` loads it) decides as before.
TEST(PathTimingModel, ASlowerDirtySyncThanTheCalibrationDevicesLengthensTheStunAndLaterRounds) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, {0.01, 1}, {1e6, 100e6}));
  ModelParams params = Params(1e9);
  params.path.fixed_ms[1] = 20;
  params.path.final_bytes_per_s[1] = 250e6;
  params.path.round_overhead_s = 0.004;
  params.downtime_target = 100ms;  // round 0's 100 MB (400 ms at the final rate) needs more rounds
  ModelRun base = RunModel(p, params, B::kMid, 1e9);
  params.path.sync_extra_ms = 80;
  ModelRun slow = RunModel(p, params, B::kMid, 1e9);
  ASSERT_GE(base.rounds.size(), 2u);
  EXPECT_NEAR(slow.rounds[1].seconds, base.rounds[1].seconds + 0.080, 1e-9);
  EXPECT_GT(slow.final_bytes, base.final_bytes) << "longer rounds dirty more";
  EXPECT_NEAR(slow.stun_ms, 20 + 80 + slow.final_bytes / 250e6 * 1e3, 1e-6);
}

TEST(PathCalibrationFit, KeepsTheCalibrationDevicesFinalSync) {
  std::vector<PathRun> runs{MakeRun(true), MakeRun(false), MakeRun(true), MakeRun(false)};
  runs[0].final_sync_ms = 0.2;
  runs[1].final_sync_ms = 0.4;
  runs[2].final_sync_ms = 0.3;
  runs[3].final_sync_ms = 9;  // one slow
  auto c = FitPathCalibration(PathConfig{}, runs);
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->final_sync_ms, 0.35);
}

// 1 GB at 1 GB/s dirtying 100 MB in round 0 (a 300 ms target): the likely run
// switches after round 0 with 100 MB to send. The pessimistic run (a 0.5 GB/s
// link) dirties 200 MB in its 2 s round 0 and runs a round more, ending with a
// small final round: it is not the high end of the stun. The likely outcome's
// 100 MB at the path's slowest final rate is.
TEST(PathTimingModel, TheRangeHoldsTheLikelyFinalRoundAtTheSlowestAndFastestFinalRate) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, {0.01, 1}, {1e6, 100e6}));
  ModelParams params = Params(1e9);
  params.bandwidth_low = 0.5e9;
  params.fixed_cost = 2ms;
  params.path.fixed_ms[0] = params.path.fixed_ms[1] = params.path.fixed_ms[2] = 2;
  params.path.final_bytes_per_s[0] = 1e9;
  params.path.final_bytes_per_s[1] = 0.8e9;
  params.path.final_bytes_per_s[2] = 0.6e9;
  Prediction pr = Predict(p, params);
  ASSERT_EQ(pr.mid.rounds.size(), 1u);
  EXPECT_GT(pr.high.rounds.size(), 1u) << "the slow link's run decides otherwise";
  EXPECT_LT(pr.high.stun_ms, pr.mid.stun_ms);
  EXPECT_NEAR(pr.mid.stun_ms, 2 + 100e6 / 0.8e9 * 1e3, 1e-6);
  EXPECT_NEAR(pr.stun_high_ms, 2 + 100e6 / 0.6e9 * 1e3, 1e-6);
}

TEST(PathTimingModel, TheStunIsFixedPlusTheFinalRoundAtItsOwnRate) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, {0.01, 1}, {1e6, 100e6}));
  ModelParams params = Params(1e9);
  ModelRun plain = RunModel(p, params, B::kMid, 1e9);
  ASSERT_EQ(plain.rounds.size(), 1u);
  EXPECT_NEAR(plain.stun_ms, 120.0, 1e-6);
  params.path.fixed_ms[1] = 20;
  params.path.final_bytes_per_s[1] = 250e6;
  ModelRun path = RunModel(p, params, B::kMid, 1e9);
  ASSERT_EQ(path.rounds.size(), 1u);  // the engine's rule decides as before
  EXPECT_NEAR(path.stun_ms, 420.0, 1e-6);
}

// Each later round costs 50 ms beyond its bytes: the engine's recent rate falls,
// its predicted stun rises, and the dirty set of a longer round is larger.
TEST(PathTimingModel, RoundOverheadLengthensRoundsAndTheRuleSeesIt) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, {0.01, 1}, {2e6, 200e6}));
  ModelParams params = Params(1e9);
  params.downtime_target = 50ms;
  ModelRun without = RunModel(p, params, B::kMid, 1e9);
  params.path.round_overhead_s = 0.05;
  params.path.fixed_ms[1] = 20;
  params.path.final_bytes_per_s[1] = 1e9;
  ModelRun with = RunModel(p, params, B::kMid, 1e9);
  ASSERT_GE(with.rounds.size(), 2u);
  EXPECT_NEAR(with.rounds[1].seconds, without.rounds[1].seconds + 0.05, 1e-9);
  EXPECT_GT(with.final_bytes, without.final_bytes);
}

// A decision within 20% of the target: the other outcome is modelled and the
// range holds it, the likely one stays the prediction.
TEST(PathTimingModel, ADecisionNearTheTargetWidensTheRangeToTheOtherOutcome) {
  DeviceProfile p;
  // 1 GB at 1 GB/s dirties 280 MB in round 0: 280 ms + 2 ms is within 300 ms, barely.
  p.regions.push_back(Region(0, 1000e6, {0.01, 1}, {2.8e6, 280e6}));
  ModelParams params = Params(1e9);
  params.fixed_cost = 2ms;
  Prediction pr = Predict(p, params);
  ASSERT_EQ(pr.mid.rounds.size(), 1u);
  EXPECT_TRUE(pr.marginal);
  ASSERT_TRUE(pr.alternative.has_value());
  EXPECT_EQ(pr.alternative->rounds.size(), 2u);
  EXPECT_LT(pr.alternative->stun_ms, pr.mid.stun_ms);
  EXPECT_LE(pr.stun_low_ms, pr.alternative->stun_ms);
  // Far from the target: no alternative.
  DeviceProfile calm;
  calm.regions.push_back(Region(0, 1000e6, {0.01, 1}, {0.1e6, 10e6}));
  Prediction c = Predict(calm, params);
  EXPECT_FALSE(c.marginal);
  EXPECT_FALSE(c.alternative.has_value());
}

// 200 MB dirtied in round 0: a predicted 202 ms, a third under the 300 ms target.
// With the rate known to +-10% that is no coin toss; where this host's
// migrations have run at 0.8x to 1.25x their calibration's rate, the engine's
// predicted stun (the dirty set over the rate: 1/r^2) can reach 316 ms, and the
// round more is modelled and held by the range.
TEST(PathTimingModel, TheMeasuredRateSpreadDecidesHowNearTheTargetIsNear) {
  DeviceProfile p;
  p.regions.push_back(Region(0, 1000e6, {0.01, 1}, {2e6, 200e6}));
  ModelParams params = Params(1e9);
  params.fixed_cost = 2ms;
  params.bandwidth_low = 0.9e9;
  params.bandwidth_high = 1.1e9;
  Prediction narrow = Predict(p, params);
  ASSERT_EQ(narrow.mid.rounds.size(), 1u);
  EXPECT_FALSE(narrow.marginal);
  params.bandwidth_low = 0.8e9;
  params.bandwidth_high = 1.25e9;
  Prediction wide = Predict(p, params);
  ASSERT_EQ(wide.mid.rounds.size(), 1u) << "the likely outcome stays the mid's";
  EXPECT_TRUE(wide.marginal);
  ASSERT_TRUE(wide.alternative.has_value());
  EXPECT_EQ(wide.alternative->rounds.size(), 2u);
  EXPECT_LE(wide.stun_low_ms, wide.alternative->stun_ms);
  // The round more at the fastest rate: a shorter round 1, a smaller final
  // round; the range holds that too, not only the other outcome's mid.
  EXPECT_LT(wide.stun_low_ms, wide.alternative->stun_ms - 1);
}

}  // namespace
}  // namespace gpumigrate
