// The --plot script of an estimate: its data blocks hold the model's figures
// (each predicted round of the three runs, the bytes sent over time, the stun
// predicted at each decision, W(t) as measured), the lines and bands are where
// the prediction says, and a region's name cannot break out of gnuplot's strings.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/estimate_plot.h"
#include "tests/unit/cli/gnuplot_block.h"

namespace gpumigrate::cli {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

ModelRun ModelRunOf(std::vector<PredictedRound> rounds, double final_mib, double stun_ms, std::vector<double> decisions) {
  ModelRun m;
  m.rounds = std::move(rounds);
  m.final_bytes = final_mib * kMiB;
  m.stun_ms = stun_ms;
  m.total_ms = stun_ms;
  for (const auto& x : m.rounds) m.total_ms += x.seconds * 1e3;
  m.decision_stun_ms = std::move(decisions);
  m.stop_reason = StopReason::kConverged;
  return m;
}

RegionProfile Region(const std::string& name, std::vector<double> window_s, std::vector<double> low_mib,
                     std::vector<double> mid_mib, std::vector<double> high_mib) {
  RegionProfile rp;
  rp.info.name = name;
  rp.dirty.window_s = std::move(window_s);
  for (double x : low_mib) rp.dirty.low_bytes.push_back(x * kMiB);
  for (double x : mid_mib) rp.dirty.mid_bytes.push_back(x * kMiB);
  for (double x : high_mib) rp.dirty.high_bytes.push_back(x * kMiB);
  return rp;
}

EstimateReport TwoRounds() {
  EstimateReport r;
  r.measured.sample_s = 2;
  r.modelled.regions = {Region("weights", {0.01, 0.1}, {0, 0}, {0, 0}, {0, 0}),
                        Region("kv_cache", {0.01, 0.1, 1.0}, {0.5, 4, 30}, {1, 5, 40}, {2, 8, 50})};
  r.params.downtime_target = std::chrono::milliseconds(50);
  r.params.max_stun = std::chrono::seconds(100);
  Prediction& p = r.prediction;
  p.mid = ModelRunOf({{0, 1024 * kMiB, 1.0}, {1, 40 * kMiB, 0.05}}, 4, 30, {900, 30});
  p.low = ModelRunOf({{0, 1024 * kMiB, 0.8}}, 3, 20, {25});
  p.high = ModelRunOf({{0, 1024 * kMiB, 1.3}, {1, 50 * kMiB, 0.07}, {2, 9 * kMiB, 0.02}}, 6, 60, {1200, 80, 60});
  p.stun_low_ms = 20;
  p.stun_high_ms = 60;
  p.total_low_ms = 820;
  p.total_high_ms = 1450;
  p.decision = EstimateDecision::kLiveMigrate;
  r.link_source = "the path calibrated between two processes";
  return r;
}

TEST(EstimatePlot, EachPredictedRoundOfEachRunIsALineOfItsBlock) {
  const std::string s = EstimatePlotScript(TwoRounds(), "t");
  // round, label, MiB, seconds, final
  auto mid = Block(s, "mid");
  ASSERT_EQ(mid.size(), 3u);
  EXPECT_EQ(mid[0], "0 \"r0\" 1024.000000 1.000000 0");
  EXPECT_EQ(mid[1], "1 \"r1\" 40.000000 0.050000 0");
  EXPECT_EQ(mid[2], "2 \"stun\" 4.000000 0.030000 1");
  auto low = Block(s, "low");
  ASSERT_EQ(low.size(), 2u);
  EXPECT_EQ(low[1], "1 \"stun\" 3.000000 0.020000 1");
  EXPECT_EQ(Block(s, "high").size(), 4u);
}

TEST(EstimatePlot, TheTimelineAddsUpTheRoundsAndTheStunIsShadedWhereThePreCopyEnds) {
  const std::string s = EstimatePlotScript(TwoRounds(), "t");
  auto t = Block(s, "tmid");
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0], "0.000000 0.000000");
  EXPECT_EQ(t[1], "1.000000 1024.000000");
  EXPECT_EQ(t[2], "1.050000 1064.000000");
  EXPECT_EQ(t[3], "1.080000 1068.000000");
  EXPECT_NE(s.find("set object 1 rect from 1.050000,graph 0 to 1.080000,graph 1"), std::string::npos) << s;
  EXPECT_NE(s.find("total 1.08 s (range 0.82 to 1.45 s)"), std::string::npos);
}

TEST(EstimatePlot, WorkingSetsAreTheMeasuredCurvesAndAQuietRegionIsNamed) {
  const std::string s = EstimatePlotScript(TwoRounds(), "t");
  auto w = Block(s, "w1");
  ASSERT_EQ(w.size(), 3u);
  // window ms, low, mid, high MiB
  EXPECT_EQ(w[0], "10.000 0.500000 1.000000 2.000000");
  EXPECT_EQ(w[2], "1000.000 30.000000 40.000000 50.000000");
  EXPECT_EQ(s.find("$w0 << EOD"), std::string::npos) << "weights were never written: no curve";
  EXPECT_NE(s.find("never written: weights"), std::string::npos);
  EXPECT_NE(s.find("title \"kv_cache\""), std::string::npos);
  // The likely run's round lengths, 1000 ms and 50 ms, marked on the window axis.
  EXPECT_NE(s.find("from first 1000.000,graph 0 to first 1000.000,graph 1"), std::string::npos);
  EXPECT_NE(s.find("from first 50.000,graph 0 to first 50.000,graph 1"), std::string::npos);
}

TEST(EstimatePlot, TheRuleDrawsEachDecisionAgainstTheTargetAndTheStunRange) {
  EstimateReport r = TwoRounds();
  std::string s = EstimatePlotScript(r, "t");
  auto dec = Block(s, "dec");
  ASSERT_EQ(dec.size(), 2u);
  EXPECT_EQ(dec[0], "0 900.000");
  EXPECT_EQ(dec[1], "1 30.000");
  EXPECT_NE(s.find("rect from graph 0,first 20.000 to graph 1,first 60.000"), std::string::npos) << "the range";
  EXPECT_NE(s.find("downtime target 50 ms"), std::string::npos);
  EXPECT_EQ(s.find("max stun"), std::string::npos) << "100 s is far off this axis";
  EXPECT_EQ(s.find("$alt"), std::string::npos);
  // Near the target, the other outcome is drawn too, and a max stun that is on the axis.
  r.prediction.alternative = ModelRunOf({{0, 1024 * kMiB, 1.0}}, 40, 45, {45});
  r.params.max_stun = std::chrono::milliseconds(500);
  s = EstimatePlotScript(r, "t");
  ASSERT_EQ(Block(s, "alt").size(), 1u);
  EXPECT_NE(s.find("or 45.0 ms near the target"), std::string::npos);
  EXPECT_NE(s.find("max stun 500 ms"), std::string::npos);
}

TEST(EstimatePlot, ARegionsNameCannotBreakOutOfItsString) {
  EstimateReport r = TwoRounds();
  r.modelled.regions[1].info.name = "kv\"x";
  const std::string s = EstimatePlotScript(r, "a \"quoted\" title");
  EXPECT_NE(s.find("title \"kv\\\"x\""), std::string::npos) << s;
  EXPECT_NE(s.find("a \\\"quoted\\\" title"), std::string::npos);
}

}  // namespace
}  // namespace gpumigrate::cli
