// The --plot script of a migration: its data blocks hold each round's figures
// from the report (not made up), the stun is shaded where it happened, the
// predicted stun is drawn when there is one, and text from outside (the title,
// an error) cannot break out of gnuplot's strings.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli/gnuplot.h"
#include "cli/migration_plot.h"
#include "tests/unit/cli/gnuplot_block.h"

namespace gpumigrate::cli {
namespace {

MigrationReport ThreeRounds() {
  MigrationReport r;
  r.outcome = Outcome::kCompleted;
  r.device_bytes = 64ull << 20;
  RoundReport r0{.round = 0, .bytes = 64ull << 20, .dirty_bytes = 64ull << 20, .ms = 500, .start_ms = 10};
  RoundReport r1{.round = 1, .bytes = 8ull << 20, .dirty_bytes = 10ull << 20, .ms = 100, .start_ms = 510};
  RoundReport fin{.round = 2, .final = true, .bytes = 1ull << 20, .dirty_bytes = 2ull << 20, .ms = 20,
                  .start_ms = 612};
  r.rounds = {r0, r1, fin};
  r.stun_start_ms = 610;
  r.stun_ms = 40;
  r.stun_breakdown_ms.stop_device_ms = 1.5;
  r.stun_breakdown_ms.final_data_ms = 20;
  r.stun_breakdown_ms.commit_resume_ms = 2.25;
  r.predicted_stun_ms = 35;
  r.bytes_sent = 73ull << 20;
  r.bandwidth_bytes_per_s = 134e6;
  r.total_ms = 700;
  return r;
}

TEST(MigrationPlot, EachRoundOfTheReportIsALineOfTheRoundsBlock) {
  const std::string s = MigrationPlotScript(ThreeRounds(), {}, "t");
  auto rounds = Block(s, "rounds");
  ASSERT_EQ(rounds.size(), 3u);
  // round, label, MiB sent, MiB dirty, ms, start s, average MB/s, final
  EXPECT_EQ(rounds[0], "0 \"r0\" 64.000000 64.000000 500.000 0.010000 134.218 0");
  EXPECT_EQ(rounds[1], "1 \"r1\" 8.000000 10.000000 100.000 0.510000 83.886 0");
  EXPECT_EQ(rounds[2], "2 \"stun\" 1.000000 2.000000 20.000 0.612000 52.429 1");
}

TEST(MigrationPlot, TheStunIsShadedWhereItHappenedAndItsPhasesAreTheBreakdown) {
  const std::string s = MigrationPlotScript(ThreeRounds(), {}, "t");
  EXPECT_NE(s.find("set object 1 rect from 0.610000,graph 0 to 0.650000,graph 1"), std::string::npos) << s;
  auto stun = Block(s, "stun");
  ASSERT_EQ(stun.size(), 3u);
  EXPECT_EQ(stun[0], "\"stop_device\" 1.500");
  EXPECT_EQ(stun[1], "\"final_data\" 20.000");
  EXPECT_EQ(stun[2], "\"commit_resume\" 2.250");
  EXPECT_NE(s.find("Stun 40.0 ms, predicted 35.0 ms"), std::string::npos);
  EXPECT_NE(s.find("first 35.000"), std::string::npos) << "the predicted stun's line";
  EXPECT_NE(s.find("set yrange [0:40.250]"), std::string::npos) << "the stun's axis holds the predicted stun";
  EXPECT_NE(s.find("using 6:7:($5 / 1000.0):(0) with vectors"), std::string::npos) << "a step: start, length";
  EXPECT_NE(s.find("first 134.000"), std::string::npos) << "the measured bandwidth's line";
}

TEST(MigrationPlot, TheSampledRateIsTheBytesBetweenProgressSamples) {
  std::vector<ProgressSample> trace = {{0.1, 0, 0}, {0.2, 10'000'000, 0}, {0.4, 30'000'000, 1}};
  auto lines = Block(MigrationPlotScript(ThreeRounds(), trace, "t"), "trace");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "0.200000 100.000");
  EXPECT_EQ(lines[1], "0.400000 100.000");
}

TEST(MigrationPlot, ARolledBackMigrationWithoutAStunSaysSo) {
  MigrationReport r = ThreeRounds();
  r.rounds.pop_back();
  r.outcome = Outcome::kAborted;
  r.status = Aborted("destination aborted: \"disk\" full");
  r.stun_start_ms = 0;
  r.stun_ms = 0;
  r.stun_breakdown_ms = {};
  r.predicted_stun_ms = -1;
  const std::string s = MigrationPlotScript(r, {}, "t");
  EXPECT_EQ(s.find("set object 1 rect"), std::string::npos);
  EXPECT_NE(s.find("no stun: the source never stopped"), std::string::npos);
  EXPECT_NE(s.find("aborted: destination aborted: \\\"disk\\\" full"), std::string::npos) << s;
  EXPECT_EQ(s.find("predicted"), std::string::npos);
}

TEST(GnuplotText, QuotesBackslashesAndNewlinesStayInsideTheString) {
  EXPECT_EQ(GnuplotText("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(CheckPlotTarget, ANameGnuplotCannotHoldOrADirectoryNobodyCanWriteIsRefused) {
  EXPECT_FALSE(CheckPlotTarget("it's.png").ok());
  EXPECT_FALSE(CheckPlotTarget("a\nb.png").ok());
  Status missing = CheckPlotTarget("/nonexistent-dir/x.png");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("cannot write in /nonexistent-dir"), std::string::npos) << missing.message();
}

}  // namespace
}  // namespace gpumigrate::cli
