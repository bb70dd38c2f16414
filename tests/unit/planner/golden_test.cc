// The plan format (docs/planner.md) byte for byte: each inventory under
// tests/data/planner/ is planned and compared with its golden plan. After an
// intended change, regenerate with GPUMIGRATE_UPDATE_GOLDEN=1 and review the diff.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/planner/planner.h"

namespace gpumigrate::planner {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Golden {
  const char* inventory;
  const char* host;
  bool allow_power_off;
  const char* plan;
};

class PlannerGolden : public ::testing::TestWithParam<Golden> {};

TEST_P(PlannerGolden, PlanMatches) {
  const std::string dir = std::string(GPUMIGRATE_SOURCE_DIR) + "/tests/data/planner/";
  std::string text = Read(dir + GetParam().inventory);
  ASSERT_FALSE(text.empty()) << dir + GetParam().inventory;
  auto inv = ParseInventory(text);
  ASSERT_TRUE(inv.ok()) << inv.status().message();
  PlanOptions o;
  o.evacuate = GetParam().host;
  o.allow_power_off = GetParam().allow_power_off;
  auto plan = MakePlan(*inv, o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  std::string got = PlanToJson(*plan) + "\n";
  const std::string golden_path = dir + GetParam().plan;
  if (std::getenv("GPUMIGRATE_UPDATE_GOLDEN")) {
    std::ofstream(golden_path) << got;
  }
  std::string want = Read(golden_path);
  EXPECT_EQ(got, want) << "golden " << golden_path << " differs (GPUMIGRATE_UPDATE_GOLDEN=1 rewrites it)";
  // Whatever the content, the format's own keys are there with their types.
  auto j = nlohmann::json::parse(got);
  for (const char* k : {"version", "host", "feasible", "reason", "total_ms", "batched_total_ms", "actions"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["version"], 1);
  for (const auto& a : j["actions"]) {
    for (const char* k : {"vm", "action", "to", "predicted_stun_ms", "start_ms", "end_ms", "reason"}) {
      EXPECT_TRUE(a.contains(k)) << k;
    }
    EXPECT_TRUE(a["to"].is_null() || (a["to"].contains("host") && a["to"].contains("gpus") &&
                                      a["to"].contains("placement")));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Files, PlannerGolden,
    ::testing::Values(Golden{"example.json", "gpu-a", false, "example.plan.json"},
                      Golden{"example.json", "gpu-a", true, "example.power-off.plan.json"},
                      Golden{"capacity.json", "gpu-a", false, "capacity.plan.json"},
                      Golden{"profile.json", "gpu-a", false, "profile.plan.json"}),
    [](const ::testing::TestParamInfo<Golden>& param_info) {
      std::string n = param_info.param.plan;
      for (char& c : n) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return n;
    });

}  // namespace
}  // namespace gpumigrate::planner
