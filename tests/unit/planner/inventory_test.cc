// ParseInventory: what a well-formed inventory reads as, and every kind of
// malformed or inconsistent input, each rejected with its key path.
#include <functional>

#include "tests/unit/planner/planner_fixtures.h"

namespace gpumigrate::planner::testing {
namespace {

J Base() {
  return Inv(J::array({HostJ("gpu-a", {"H100-80GB/mig", "H100-80GB/vgpu", "H100-80GB/passthrough"}),
                       HostJ("gpu-b", {"H100-80GB/mig", "A100-80GB/mig"})}),
             J::array({VmJ("llm-1", "gpu-a", {0}, "3g.40gb", 4, "inference", nullptr, false, Est(8200, 41000)),
                       VmJ("llm-2", "gpu-a", {0}, "1g.10gb", 0),
                       VmJ("desk-1", "gpu-a", {1}, "vgpu:20GB", nullptr, "graphics"),
                       VmJ("train-1", "gpu-a", {2}, "passthrough", nullptr, "training")}),
             J::array({J{{"name", "chat"}, {"min_serving", 2}, {"replica_start", "90s"}}}));
}

TEST(PlannerInventory, ReadsTheDocumentedFormat) {
  auto inv = ParseInventory(Base().dump());
  ASSERT_TRUE(inv.ok()) << inv.status().message();
  ASSERT_EQ(inv->hosts.size(), 2u);
  EXPECT_DOUBLE_EQ(inv->hosts[0].link_bytes_per_s, 100e9 / 8);
  EXPECT_EQ(inv->hosts[0].max_migrations, 2u);
  ASSERT_EQ(inv->vms.size(), 4u);
  EXPECT_EQ(inv->vms[0].kind, SlotKind::kMig);
  EXPECT_EQ(inv->vms[0].placement, 4u);
  EXPECT_TRUE(inv->vms[0].estimate.present);
  EXPECT_DOUBLE_EQ(inv->vms[0].estimate.stun_ms, 8200);
  EXPECT_EQ(inv->vms[2].kind, SlotKind::kVgpu);
  EXPECT_EQ(inv->vms[2].bytes_per_gpu, 20'000'000'000u);
  EXPECT_EQ(inv->vms[3].kind, SlotKind::kPassthrough);
  EXPECT_EQ(FrameBufferBytes(inv->vms[3]), 80'000'000'000u);
  EXPECT_EQ(inv->groups[0].replica_start, std::chrono::seconds(90));
  EXPECT_EQ(inv->policy.max_stun, std::chrono::seconds(100));
}

TEST(PlannerInventory, UnknownKeysAreIgnored) {
  J j = Base();
  j["vendor_extension"] = {{"x", 1}};
  j["vms"][0]["owner"] = "team-a";
  EXPECT_TRUE(ParseInventory(j.dump()).ok());
}

TEST(PlannerInventory, MultiGpuVgpuIsUvm) {
  J j = Inv(J::array({HostJ("h", {"H100-80GB/vgpu", "H100-80GB/vgpu"})}),
            J::array({VmJ("v", "h", {0, 1}, "vgpu:40GB", nullptr, "training", nullptr, false)}));
  auto inv = ParseInventory(j.dump());
  ASSERT_TRUE(inv.ok()) << inv.status().message();
  EXPECT_TRUE(inv->vms[0].uvm);
  EXPECT_TRUE(inv->vms[0].uvm_implied);
}

struct Bad {
  const char* name;
  std::function<void(J&)> damage;
  const char* key;      // the key path the message must start with
  const char* because;  // and a word of the cause
};

class PlannerInventoryMalformed : public ::testing::TestWithParam<Bad> {};

TEST_P(PlannerInventoryMalformed, IsRejectedNamingTheKey) {
  J j = Base();
  GetParam().damage(j);
  auto inv = ParseInventory(j.dump());
  ASSERT_FALSE(inv.ok()) << GetParam().name << " was accepted";
  EXPECT_EQ(inv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(inv.status().message().rfind(fmt::format("{}:", GetParam().key), 0), 0u)
      << "message: " << inv.status().message();
  EXPECT_NE(inv.status().message().find(GetParam().because), std::string::npos)
      << "message: " << inv.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PlannerInventoryMalformed,
    ::testing::Values(
        Bad{"overlap", [](J& j) { j["vms"][1]["placement"] = 5; }, "vms[1].placement", "overlap"},
        Bad{"invalid start", [](J& j) { j["vms"][0]["placement"] = 2; }, "vms[0].placement",
            "not a valid start for 3g.40gb"},
        Bad{"start 5 for 3g", [](J& j) { j["vms"][0]["placement"] = 5; }, "vms[0].placement", "slot 5"},
        Bad{"no placement on MIG", [](J& j) { j["vms"][0].erase("placement"); }, "vms[0].placement", "missing"},
        Bad{"placement off MIG", [](J& j) { j["vms"][2]["placement"] = 0; }, "vms[2].placement", "only a MIG"},
        Bad{"unknown host", [](J& j) { j["vms"][1]["host"] = "gpu-z"; }, "vms[1].host", "unknown host 'gpu-z'"},
        Bad{"unknown GPU", [](J& j) { j["vms"][1]["gpus"] = {7}; }, "vms[1].gpus[0]", "no GPU 7"},
        Bad{"profile vs mode", [](J& j) { j["vms"][2]["gpus"] = {0}; }, "vms[2].profile", "needs a vgpu GPU"},
        Bad{"mig profile on passthrough", [](J& j) { j["vms"][1]["gpus"] = {2}; }, "vms[1].profile",
            "needs a mig GPU"},
        Bad{"unknown profile", [](J& j) { j["vms"][1]["profile"] = "5g.50gb"; }, "vms[1].profile",
            "unknown profile"},
        Bad{"unknown model", [](J& j) { j["hosts"][1]["gpus"][1]["model"] = "Z9000"; }, "hosts[1].gpus[1].model",
            "unknown GPU model"},
        Bad{"unknown mode", [](J& j) { j["hosts"][0]["gpus"][0]["mode"] = "sliced"; }, "hosts[0].gpus[0].mode",
            "unknown mode"},
        Bad{"negative vgpu size", [](J& j) { j["vms"][2]["profile"] = "vgpu:-20GB"; }, "vms[2].profile",
            "positive size"},
        Bad{"vgpu too large", [](J& j) { j["vms"][2]["profile"] = "vgpu:100GB"; }, "vms[2].profile",
            "larger than a H100-80GB (80 GB)"},
        Bad{"mixed vgpu sizes",
            [](J& j) { j["vms"].push_back(VmJ("desk-2", "gpu-a", {1}, "vgpu:10GB", nullptr, "graphics")); },
            "vms[4].profile", "already holds vGPUs of 20 GB: every vGPU on a time-sliced GPU has the same size"},
        Bad{"vgpu over memory",
            [](J& j) {
              for (int i = 0; i < 4; ++i) {
                j["vms"].push_back(VmJ(fmt::format("d{}", i), "gpu-a", {1}, "vgpu:20GB", nullptr, "graphics"));
              }
            },
            "vms[7].profile", "would hold 5 vGPUs of 20 GB: more than its 80 GB"},
        Bad{"eight MIG instances",
            [](J& j) {
              j["vms"] = J::array();
              for (int s = 0; s < 8; ++s) j["vms"].push_back(VmJ(fmt::format("m{}", s), "gpu-b", {0}, "1g.10gb", s));
            },
            "vms[7].placement", "not a valid start"},
        Bad{"passthrough shared",
            [](J& j) { j["vms"].push_back(VmJ("train-2", "gpu-a", {2}, "passthrough", nullptr, "training")); },
            "vms[4].gpus", "already passed through"},
        Bad{"negative max_migrations", [](J& j) { j["hosts"][0]["max_migrations"] = -1; },
            "hosts[0].max_migrations", "out of range"},
        Bad{"bad link", [](J& j) { j["hosts"][0]["link"] = "fast"; }, "hosts[0].link", "not a link rate"},
        Bad{"missing link", [](J& j) { j["hosts"][0].erase("link"); }, "hosts[0].link", "missing"},
        Bad{"negative stun", [](J& j) { j["vms"][0]["estimate"]["predicted_stun_ms"] = -5; },
            "vms[0].estimate.predicted_stun_ms", "less than 0"},
        Bad{"estimate without link", [](J& j) { j["vms"][0]["estimate"].erase("link"); }, "vms[0].estimate.link",
            "missing"},
        Bad{"negative min_serving", [](J& j) { j["groups"][0]["min_serving"] = -2; }, "groups[0].min_serving",
            "out of range"},
        Bad{"bad replica_start", [](J& j) { j["groups"][0]["replica_start"] = "soon"; }, "groups[0].replica_start",
            "not a duration"},
        Bad{"unknown group", [](J& j) { j["vms"][1]["group"] = "search"; }, "vms[1].group", "unknown group"},
        Bad{"unknown class", [](J& j) { j["vms"][1]["class"] = "batch"; }, "vms[1].class", "unknown class"},
        Bad{"duplicate host", [](J& j) { j["hosts"][1]["name"] = "gpu-a"; }, "hosts[1].name", "twice"},
        Bad{"duplicate VM", [](J& j) { j["vms"][1]["name"] = "llm-1"; }, "vms[1].name", "twice"},
        Bad{"duplicate GPU index", [](J& j) { j["hosts"][1]["gpus"][1]["index"] = 0; }, "hosts[1].gpus[1].index",
            "already has a GPU 0"},
        Bad{"uvm not bool", [](J& j) { j["vms"][1]["uvm"] = "yes"; }, "vms[1].uvm", "true or false"},
        Bad{"bad policy max_stun", [](J& j) { j["policy"]["max_stun"] = "long"; }, "policy.max_stun",
            "not a duration"},
        Bad{"bad version", [](J& j) { j["version"] = 2; }, "version", "not supported"},
        Bad{"hosts not an array", [](J& j) { j["hosts"] = "gpu-a"; }, "hosts", "array"},
        Bad{"profile of a region", [](J& j) { j["vms"][0]["estimate"]["regions"] = {{{"id", 0}}}; },
            "vms[0].estimate.regions[0].size_bytes", "missing"}),
    [](const ::testing::TestParamInfo<Bad>& param_info) {
      std::string n = param_info.param.name;
      for (char& c : n) {
        if (!isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return n;
    });

TEST(PlannerInventory, NotJsonSaysSo) {
  auto inv = ParseInventory("{\"version\": 1, \"hosts\": [");
  ASSERT_FALSE(inv.ok());
  EXPECT_NE(inv.status().message().find("not JSON"), std::string::npos);
}

}  // namespace
}  // namespace gpumigrate::planner::testing
