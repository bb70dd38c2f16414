// The host's record of migrations against their path calibration
// (gpumigrate/estimator/path_spread.h): what a run says, how the record is kept in the
// path calibration file beside the entries, the spread drawn from it, and the
// estimate's ranges widened by it.
#include "gpumigrate/estimator/path_spread.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include <gtest/gtest.h>

#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/estimator/estimator.h"
#include "tests/support/calibration_dir.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;

// Round 0 at 500 MB/s past a 10 ms startup; the stun 20 ms + final / 250 MB/s.
PathCalibration SpreadCalibrated(double cap = 0) {
  PathCalibration c;
  c.config.cap_bytes_per_s = cap;
  c.bytes_per_s = c.low_bytes_per_s = c.high_bytes_per_s = 500e6;
  c.round0_startup_ms = 10;
  c.fixed_ms = c.fixed_low_ms = c.fixed_high_ms = 20;
  c.final_bytes_per_s = c.final_low_bytes_per_s = c.final_high_bytes_per_s = 250e6;
  c.wire_ratio = 1;
  return c;
}

PathRun SpreadRun(double round0_rate, double stun_factor) {
  PathRun r;
  r.round0_bytes = r.round0_raw_bytes = 100e6;
  r.round0_ms = 10 + 100e6 / round0_rate * 1e3;
  r.final_bytes = 5e6;
  r.stun_ms = (20 + 5e6 / 250e6 * 1e3) * stun_factor;
  return r;
}

TEST(PathObservation, RatiosOfWhatTheRunMeasuredToWhatItsCalibrationPredicts) {
  auto o = ObservePath(SpreadCalibrated(), SpreadRun(400e6, 1.5), "2026-12-07T00:00:00Z");
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->key, "tls/2/none/uncapped");
  EXPECT_FALSE(o->capped);
  EXPECT_NEAR(o->round0_ratio, 0.8, 1e-9);  // 400 of 500 MB/s past the startup
  EXPECT_NEAR(o->stun_ratio, 1.5, 1e-9);    // 60 ms where 40 ms was predicted for its 5 MB
  EXPECT_TRUE(ObservePath(SpreadCalibrated(300e6), SpreadRun(400e6, 1), "")->capped);

  // A round 0 over before the startup is: its rate says nothing; the stun still does.
  PathRun early = SpreadRun(400e6, 1);
  early.round0_ms = 10.5;
  auto e = ObservePath(SpreadCalibrated(), early, "");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->round0_ratio, 0);
  EXPECT_NEAR(e->stun_ratio, 1, 1e-9);
  PathRun nothing;
  EXPECT_FALSE(ObservePath(SpreadCalibrated(), nothing, "").has_value());
}

PathObservation SpreadObs(bool capped, double round0, double stun) {
  PathObservation o;
  o.key = capped ? "tls/2/none/300000000B/s" : "tls/2/none/uncapped";
  o.capped = capped;
  o.round0_ratio = round0;
  o.stun_ratio = stun;
  return o;
}

TEST(PathSpread, FromThreeRecordsOfTheSameClassAndHoldsTheCalibrationItself) {
  PathConfig uncapped, capped;
  capped.cap_bytes_per_s = 300e6;
  std::vector<PathObservation> obs{SpreadObs(false, 1.2, 0.7), SpreadObs(false, 1.1, 0.9), SpreadObs(true, 0.5, 3.0)};
  EXPECT_FALSE(SpreadFor(uncapped, obs).has_value()) << "two records are no spread";
  obs.push_back(SpreadObs(false, 1.3, 0.8));
  auto s = SpreadFor(uncapped, obs);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->observations, 3);
  EXPECT_EQ(s->pool, "uncapped paths");
  EXPECT_DOUBLE_EQ(s->round0_low, 1.0);  // every run beat the calibration: 1 stays inside
  EXPECT_DOUBLE_EQ(s->round0_high, 1.3);
  EXPECT_DOUBLE_EQ(s->stun_low, 0.7);
  EXPECT_DOUBLE_EQ(s->stun_high, 1.0);
  EXPECT_FALSE(SpreadFor(capped, obs).has_value()) << "a capped path does not borrow uncapped runs";
}

TEST(PathSpread, FromTenRecordsOnTheOutermostAreLeftOut) {
  std::vector<PathObservation> obs;
  for (int i = 0; i < 10; ++i) obs.push_back(SpreadObs(false, 0.9 + 0.02 * i, 1.0));
  obs.push_back(SpreadObs(false, 5.0, 1.0));  // one wild run among eleven
  auto s = SpreadFor(PathConfig{}, obs);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->round0_low, 0.92);
  EXPECT_DOUBLE_EQ(s->round0_high, 1.08);
}

using PathSpreadStore = testing::CalibrationDirTest;

TEST_F(PathSpreadStore, RecordsLiveBesideTheEntriesAndKeepTheLast64) {
  auto none = LoadPathObservations();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  ASSERT_TRUE(StorePathCalibration(SpreadCalibrated()).ok());
  for (int i = 0; i < 70; ++i) ASSERT_TRUE(RecordPathObservation(SpreadObs(false, 1.0 + i / 100.0, 1.0)).ok());
  // Storing a calibration afterwards keeps the records, and the records the entry.
  PathCalibration capped = SpreadCalibrated(300e6);
  ASSERT_TRUE(StorePathCalibration(capped).ok());
  auto obs = LoadPathObservations();
  ASSERT_TRUE(obs.ok()) << obs.status().ToString();
  ASSERT_EQ(obs->size(), 64u);
  EXPECT_DOUBLE_EQ(obs->front().round0_ratio, 1.06);
  EXPECT_DOUBLE_EQ(obs->back().round0_ratio, 1.69);
  auto entry = LoadPathCalibration(PathConfig{});
  ASSERT_TRUE(entry.ok() && entry->has_value());
  EXPECT_DOUBLE_EQ((*entry)->fixed_ms, 20);
}

TEST_F(PathSpreadStore, ProcessesRecordingAtOnceLoseNothing) {
  constexpr int kProcs = 4, kEach = 10;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int bad = 0;
      for (int i = 0; i < kEach; ++i) bad += RecordPathObservation(SpreadObs(false, 1 + p, 1)).ok() ? 0 : 1;
      _exit(bad);
    }
    kids.push_back(pid);
  }
  for (pid_t k : kids) {
    int st = 0;
    ASSERT_EQ(waitpid(k, &st, 0), k);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  auto obs = LoadPathObservations();
  ASSERT_TRUE(obs.ok()) << obs.status().ToString();
  EXPECT_EQ(obs->size(), static_cast<size_t>(kProcs * kEach));
}

TEST_F(PathSpreadStore, ADamagedRecordIsNamed) {
  { std::ofstream(dir_ / "calibration-paths.json") << R"({"version": 1, "paths": {}, "observations": [{"key": 3}]})"; }
  auto obs = LoadPathObservations();
  ASSERT_FALSE(obs.ok());
  EXPECT_NE(obs.status().message().find("observation 0"), std::string::npos) << obs.status().message();
  EXPECT_NE(obs.status().message().find("calibration-paths.json"), std::string::npos) << obs.status().message();
}

// 1 GB of weights and a 300 MB KV region appending 50 MB/s.
DeviceProfile SpreadDevice() {
  DeviceProfile p;
  p.device = "sim:test";
  RegionProfile w;
  w.info = RegionInfo{0, "weights", 700'000'000, 65536, RegionHint::kStatic};
  w.nonzero_fraction = 1;
  RegionProfile kv;
  kv.info = RegionInfo{1, "kv", 300'000'000, 65536, RegionHint::kDynamic};
  kv.nonzero_fraction = 1;
  kv.dirty.window_s = {0.1, 1, 10};
  kv.dirty.low_bytes = kv.dirty.mid_bytes = kv.dirty.high_bytes = {5e6, 50e6, 300e6};
  p.regions = {w, kv};
  return p;
}

TEST(PathSpreadEstimate, TheRangesHoldTheHostsSpreadAndSayWhy) {
  EstimateOptions o;
  o.path = SpreadCalibrated();
  Calibration cal;
  cal.inprocess_bytes_per_s = cal.inprocess_low_bytes_per_s = cal.inprocess_high_bytes_per_s = 1e9;
  auto narrow = EstimateFromProfile(SpreadDevice(), o, cal);
  ASSERT_TRUE(narrow.ok()) << narrow.status().ToString();
  o.path_spread = PathSpread{5, "uncapped paths", 0.8, 1.25, 0.6, 1.5};
  auto wide = EstimateFromProfile(SpreadDevice(), o, cal);
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();

  const Prediction &n = narrow->prediction, &w = wide->prediction;
  EXPECT_NEAR(n.mid.stun_ms, w.mid.stun_ms, 1e-9) << "the spread widens the range, not the prediction";
  EXPECT_NEAR(wide->params.bandwidth_low, 400e6, 1);
  EXPECT_NEAR(wide->params.bandwidth_high, 625e6, 1);
  EXPECT_NEAR(wide->params.path.fixed_ms[2], 30, 1e-9);
  EXPECT_NEAR(wide->params.path.final_bytes_per_s[0], 250e6 / 0.6, 1);
  EXPECT_LT(w.stun_low_ms, n.stun_low_ms);
  EXPECT_GT(w.stun_high_ms, 1.4 * n.stun_high_ms);
  auto says = [](const EstimateReport& r, const std::string& what) {
    for (const auto& a : r.assumptions) {
      if (a.find(what) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(says(*wide, "5 migrations on uncapped paths")) << ::testing::PrintToString(wide->assumptions);
  EXPECT_TRUE(says(*narrow, "the calibration's own runs only")) << ::testing::PrintToString(narrow->assumptions);

  // A capped path never runs above its cap, whatever the spread says.
  o.path = SpreadCalibrated(550e6);
  auto capped = EstimateFromProfile(SpreadDevice(), o, cal);
  ASSERT_TRUE(capped.ok());
  EXPECT_LE(capped->params.bandwidth_high, 550e6 + 1);
}

}  // namespace
}  // namespace gpumigrate
