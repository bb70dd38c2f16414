// --phase-file's contents: the phase, and from the source's progress the bytes
// sent and the rate over about the last second (not since the start).
#include "engine/agent/phase_file.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

namespace gpumigrate::agent {
namespace {

nlohmann::json Read(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(PhaseFile, KeepsThePhaseAndTheRateOverTheLastSecond) {
  const std::string path = (std::filesystem::temp_directory_path() / ("gm-phase-" + std::to_string(getpid()))).string();
  PhaseFile f(path);
  f.OnPhase(Phase::kRoundStart, 0);
  auto j = Read(path);
  EXPECT_EQ(j["phase"], "round-start");
  EXPECT_EQ(j["round"], 0);
  EXPECT_FALSE(j.contains("bytes_sent")) << "no progress yet";
  // 100 MB/s for 2 s, then 10 MB/s: the rate follows within about a second.
  Progress p;
  p.phase = Phase::kRoundStart;
  p.round_bytes_total = 500'000'000;
  for (int i = 0; i <= 20; ++i) {
    p.elapsed_s = i * 0.1;
    p.bytes_sent = static_cast<uint64_t>(i) * 10'000'000;
    f.OnProgress(p);
  }
  j = Read(path);
  EXPECT_EQ(j["bytes_sent"], 200'000'000u);
  EXPECT_NEAR(j["bytes_per_s"].get<double>(), 100e6, 1e6);
  EXPECT_EQ(j["round_bytes_total"], 500'000'000u);
  for (int i = 21; i <= 35; ++i) {
    p.elapsed_s = i * 0.1;
    p.bytes_sent += 1'000'000;
    f.OnProgress(p);
  }
  j = Read(path);
  EXPECT_NEAR(j["bytes_per_s"].get<double>(), 10e6, 1e6) << j.dump();
  f.OnPhase(Phase::kSwitchover, 3);
  j = Read(path);
  EXPECT_EQ(j["phase"], "switchover");
  EXPECT_EQ(j["round"], 3);
  EXPECT_EQ(j["bytes_sent"], 215'000'000u) << "progress kept across a phase change";
  std::filesystem::remove(path);
}

// The destination's file counts bytes applied, not sent.
TEST(PhaseFile, TheDestinationsCountsBytesApplied) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gm-phase-in-" + std::to_string(getpid()))).string();
  PhaseFile f(path, /*applied=*/true);
  f.OnPhase(Phase::kRoundEnd, 1);
  Progress p;
  p.elapsed_s = 1;
  p.bytes_sent = 1000;
  f.OnProgress(p);
  p.elapsed_s = 2;
  p.bytes_sent = 3000;
  f.OnProgress(p);
  auto j = Read(path);
  EXPECT_EQ(j["phase"], "round-end");
  EXPECT_EQ(j["bytes_applied"], 3000u);
  EXPECT_EQ(j["bytes_per_s"], 2000);
  EXPECT_FALSE(j.contains("bytes_sent"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gpumigrate::agent
