// docs/planner.md's placement rules: MIG start slices and fragmentation, the
// 7-instance limit, equal-size vGPU, passthrough counts, same model, hosts in
// maintenance, capacity refusal; and the preferences (least fragmentation,
// replicas spread across hosts).
#include "tests/unit/planner/planner_fixtures.h"

namespace gpumigrate::planner::testing {
namespace {

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

J Small(const std::string& name, const std::string& host, std::vector<int> gpus, const std::string& profile,
        J placement, const std::string& cls = "inference", J group = nullptr) {
  return VmJ(name, host, gpus, profile, placement, cls, group, false, Est(1000, 10000));
}

TEST(PlannerPlacement, DoesNotStrandA3gBehindA1gAtSlice4) {
  // gpu-b GPU 0: 4g.40gb at 0 (slices 4-7 free: exactly one 3g.40gb start);
  // GPU 1: 3g.40gb at 0 and 1g.10gb at 4 (slices 5-7 free: 1g only).
  // First fit would put the 1g.10gb at GPU 0 slice 4 and strand the 3g.40gb.
  J inv = Inv(J::array({MigHost("gpu-a", 2), MigHost("gpu-b", 2)}),
              J::array({Small("small", "gpu-a", {0}, "1g.10gb", 0), Small("large", "gpu-a", {1}, "3g.40gb", 0),
                        Small("x", "gpu-b", {0}, "4g.40gb", 0), Small("y", "gpu-b", {1}, "3g.40gb", 0),
                        Small("z", "gpu-b", {1}, "1g.10gb", 4)}));
  Plan p = PlanOf(inv, "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  const auto& large = ActionOf(p, "large");
  const auto& small = ActionOf(p, "small");
  EXPECT_EQ(large.to->gpus, std::vector<uint32_t>{0});
  EXPECT_EQ(large.to->placement, 4u);
  EXPECT_EQ(small.to->gpus, std::vector<uint32_t>{1});
  EXPECT_GE(*small.to->placement, 5u);
}

TEST(PlannerPlacement, PrefersTheSliceThatKeepsLargeProfilesPlaceable) {
  // Only a 1g.10gb moves. GPU 0 has 4g.40gb at 0 (a 3g.40gb still fits at 4); GPU 1
  // has a 1g.10gb at 0 (a 3g.40gb fits at 4, 2g.20gb at 2). Any 1g on GPU 0 kills
  // its 3g start; on GPU 1 slice 1 it costs only one 1g slot.
  J inv = Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 2)}),
              J::array({Small("small", "gpu-a", {0}, "1g.10gb", 0), Small("x", "gpu-b", {0}, "4g.40gb", 0),
                        Small("y", "gpu-b", {1}, "1g.10gb", 0)}));
  Plan p = PlanOf(inv, "gpu-a");
  const auto& small = ActionOf(p, "small");
  ASSERT_TRUE(small.to.has_value());
  EXPECT_EQ(small.to->gpus, std::vector<uint32_t>{1});
  EXPECT_EQ(small.to->placement, 1u);
}

TEST(PlannerPlacement, FillsAUsedGpuBeforeOpeningAnEmptyOne) {
  J inv = Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 2)}),
              J::array({Small("small", "gpu-a", {0}, "2g.20gb", 0), Small("y", "gpu-b", {1}, "3g.40gb", 0)}));
  Plan p = PlanOf(inv, "gpu-a");
  const auto& small = ActionOf(p, "small");
  EXPECT_EQ(small.to->gpus, std::vector<uint32_t>{1});  // GPU 0 stays whole for a 7g.80gb
  EXPECT_EQ(small.to->placement, 4u);
}

// A target whose content store holds the VM's weights is preferred where it
// fits; where it does not, the VM goes elsewhere as before.
TEST(PlannerPlacement, PrefersATargetThatHoldsTheVmsWeights) {
  J vm = Small("chat", "gpu-a", {0}, "3g.40gb", 0);
  vm["model"] = "llama-3-70b";
  J holder = MigHost("gpu-c", 1);
  holder["models"] = J::array({"llama-3-70b", "mistral-7b"});
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1), holder}), J::array({vm})), "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_EQ(ActionOf(p, "chat").to->host, "gpu-c");
  // Without the model said, the first equal target.
  J anon = Small("chat", "gpu-a", {0}, "3g.40gb", 0);
  p = PlanOf(Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1), holder}), J::array({anon})), "gpu-a");
  EXPECT_EQ(ActionOf(p, "chat").to->host, "gpu-b");
  // The holder full: the VM still moves, to gpu-b.
  p = PlanOf(Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1), holder}),
                 J::array({vm, Small("full", "gpu-c", {0}, "7g.80gb", 0)})),
             "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_EQ(ActionOf(p, "chat").to->host, "gpu-b");
}

TEST(PlannerPlacement, HostModelsMustBeNamesAndAVmModelAString) {
  J host = MigHost("gpu-b", 1);
  host["models"] = J::array({"llama", ""});
  auto bad = ParseInventory(Inv(J::array({MigHost("gpu-a", 1), host}), J::array()).dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Has(bad.status().message(), "hosts[1].models[1]: expected a model name")) << bad.status().message();
  host["models"] = "llama";
  bad = ParseInventory(Inv(J::array({MigHost("gpu-a", 1), host}), J::array()).dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Has(bad.status().message(), "expected an array of model names")) << bad.status().message();
  host["models"] = J::array({"llama"});
  auto ok = ParseInventory(Inv(J::array({MigHost("gpu-a", 1), host}), J::array()).dump());
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_TRUE(ok->hosts[1].Holds("llama"));
  EXPECT_FALSE(ok->hosts[1].Holds(""));
}

TEST(PlannerPlacement, ValidStartsOnly) {
  // Slices 0-1 and 3 used on the only target GPU: a 2g.20gb may start at 4 (not 2).
  J inv = Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1)}),
              J::array({Small("m", "gpu-a", {0}, "2g.20gb", 0), Small("x", "gpu-b", {0}, "1g.20gb", 0),
                        Small("y", "gpu-b", {0}, "1g.10gb", 3)}));
  Plan p = PlanOf(inv, "gpu-a");
  EXPECT_EQ(ActionOf(p, "m").to->placement, 4u);
}

TEST(PlannerPlacement, SevenInstancesFillAGpu) {
  // The target GPU holds 1g.10gb at 0..6: slice 7 is free but a GPU holds at most 7
  // instances (and no profile starts at 7).
  J vms = J::array({Small("m", "gpu-a", {0}, "1g.10gb", 0)});
  for (int s = 0; s < 7; ++s) vms.push_back(Small(fmt::format("f{}", s), "gpu-b", {0}, "1g.10gb", s));
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1)}), vms), "gpu-a");
  EXPECT_FALSE(p.feasible);
  EXPECT_EQ(ActionOf(p, "m").action, Action::kBlocked);
  EXPECT_TRUE(Has(ActionOf(p, "m").reason, "7-instance limit")) << ActionOf(p, "m").reason;
  EXPECT_TRUE(Has(p.reason, "capacity shortfall")) << p.reason;
}

TEST(PlannerPlacement, VgpuSizesAreEqualPerGpuAndWithinMemory) {
  // gpu-b GPU 0 holds 3 x 20 GB: room for one more 20 GB, none for a 10 GB.
  J hosts = J::array({HostJ("gpu-a", {"H100-80GB/vgpu", "H100-80GB/vgpu"}), HostJ("gpu-b", {"H100-80GB/vgpu"})});
  J vms = J::array({Small("d20", "gpu-a", {0}, "vgpu:20GB", nullptr, "graphics"),
                    Small("d10", "gpu-a", {1}, "vgpu:10GB", nullptr, "graphics")});
  for (int i = 0; i < 3; ++i) vms.push_back(Small(fmt::format("b{}", i), "gpu-b", {0}, "vgpu:20GB", nullptr));
  Plan p = PlanOf(Inv(hosts, vms), "gpu-a");
  EXPECT_EQ(ActionOf(p, "d20").action, Action::kLiveMigrate);
  EXPECT_EQ(ActionOf(p, "d20").to->placement, std::nullopt);
  EXPECT_EQ(ActionOf(p, "d10").action, Action::kBlocked);
  EXPECT_TRUE(Has(ActionOf(p, "d10").reason, "vGPU")) << ActionOf(p, "d10").reason;
  // A fifth 20 GB does not fit in 80 GB.
  vms.push_back(Small("b3", "gpu-b", {0}, "vgpu:20GB", nullptr));
  Plan q = PlanOf(Inv(hosts, vms), "gpu-a");
  EXPECT_EQ(ActionOf(q, "d20").action, Action::kBlocked);
}

TEST(PlannerPlacement, PassthroughNeedsNFreeGpusOnOneHost) {
  J hosts = J::array({HostJ("gpu-a", {"H100-80GB/passthrough", "H100-80GB/passthrough"}),
                      HostJ("gpu-b", {"H100-80GB/passthrough", "H100-80GB/passthrough"}),
                      HostJ("gpu-c", {"H100-80GB/passthrough", "H100-80GB/passthrough", "H100-80GB/passthrough"})});
  // gpu-b has 1 free, gpu-c has 2 free (GPU 1 taken): the 2-GPU VM goes to gpu-c GPUs 0 and 2.
  J vms = J::array({VmJ("t", "gpu-a", {0, 1}, "passthrough", nullptr, "training", nullptr, false, Est(1000, 50000)),
                    Small("b", "gpu-b", {0}, "passthrough", nullptr), Small("c", "gpu-c", {1}, "passthrough", nullptr)});
  Plan p = PlanOf(Inv(hosts, vms), "gpu-a");
  const auto& t = ActionOf(p, "t");
  ASSERT_EQ(t.action, Action::kLiveMigrate) << t.reason;
  EXPECT_EQ(t.to->host, "gpu-c");
  EXPECT_EQ(t.to->gpus, (std::vector<uint32_t>{0, 2}));
  vms.push_back(Small("c2", "gpu-c", {2}, "passthrough", nullptr));
  Plan q = PlanOf(Inv(hosts, vms), "gpu-a");
  EXPECT_EQ(ActionOf(q, "t").action, Action::kBlocked);
  EXPECT_TRUE(Has(ActionOf(q, "t").reason, "2 free H100-80GB passthrough GPUs")) << ActionOf(q, "t").reason;
}

TEST(PlannerPlacement, SameModelOnly) {
  J inv = Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 2, "100Gbit", 2, false, "A100-80GB")}),
              J::array({Small("m", "gpu-a", {0}, "1g.10gb", 0)}));
  Plan p = PlanOf(inv, "gpu-a");
  EXPECT_FALSE(p.feasible);
  EXPECT_TRUE(Has(ActionOf(p, "m").reason, "no H100-80GB GPU in mig mode")) << ActionOf(p, "m").reason;
}

TEST(PlannerPlacement, HostsInMaintenanceAreNoTargets) {
  J hosts = J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1, "100Gbit", 2, true), MigHost("gpu-c", 1)});
  J vms = J::array({Small("m", "gpu-a", {0}, "7g.80gb", 0)});
  EXPECT_EQ(ActionOf(PlanOf(Inv(hosts, vms), "gpu-a"), "m").to->host, "gpu-c");
  hosts[2]["maintenance"] = true;
  Plan p = PlanOf(Inv(hosts, vms), "gpu-a");
  EXPECT_EQ(ActionOf(p, "m").action, Action::kBlocked);
  EXPECT_TRUE(Has(ActionOf(p, "m").reason, "no target host")) << ActionOf(p, "m").reason;
}

TEST(PlannerPlacement, RefusesWhenTheRestCannotAbsorbTheLoad) {
  // Three 3g.40gb leave gpu-a; gpu-b has room for two.
  J vms = J::array({Small("a", "gpu-a", {0}, "3g.40gb", 0), Small("b", "gpu-a", {0}, "3g.40gb", 4),
                    Small("c", "gpu-a", {1}, "3g.40gb", 0)});
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 2), MigHost("gpu-b", 1)}), vms), "gpu-a");
  EXPECT_FALSE(p.feasible);
  int blocked = 0;
  for (const auto& a : p.actions) blocked += a.action == Action::kBlocked;
  EXPECT_EQ(blocked, 1);  // as many as fit are placed; one is short
  EXPECT_TRUE(Has(p.reason, "capacity shortfall: the hosts that remain cannot absorb 1 of gpu-a's VMs")) << p.reason;
}

TEST(PlannerPlacement, SpreadsReplicasOfAGroupAcrossHosts) {
  J groups = J::array({J{{"name", "chat"}, {"min_serving", 1}, {"replica_start", "10s"}, {"drain", "5s"}}});
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "stateless-inference", "chat", false, Est(1000, 200000)),
                    VmJ("c2", "gpu-a", {0}, "1g.10gb", 1, "stateless-inference", "chat", false, Est(1000, 200000))});
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1), MigHost("gpu-c", 1)}), vms, groups),
                  "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_NE(ActionOf(p, "c1").to->host, ActionOf(p, "c2").to->host);
}

TEST(PlannerPlacement, ExactSearchFindsTheOnlyFullAssignment) {
  // Free: gpu-b and gpu-d slices 0-3, gpu-c slices 4-7. Moving 4g.40gb, 3g.40gb and
  // two 2g.20gb fits only as 4g on one of b/d, 3g on c, both 2g on the other of b/d:
  // a 3g.40gb on b or d (its first valid start) strands the 2g.20gb pair.
  J hosts = J::array({MigHost("gpu-a", 3), MigHost("gpu-b", 1), MigHost("gpu-c", 1), MigHost("gpu-d", 1)});
  J vms = J::array({Small("g4", "gpu-a", {0}, "4g.40gb", 0), Small("g3", "gpu-a", {1}, "3g.40gb", 0),
                    Small("h1", "gpu-a", {2}, "2g.20gb", 0), Small("h2", "gpu-a", {2}, "2g.20gb", 2),
                    Small("b", "gpu-b", {0}, "3g.40gb", 4), Small("c", "gpu-c", {0}, "4g.40gb", 0),
                    Small("d", "gpu-d", {0}, "3g.40gb", 4)});
  Plan p = PlanOf(Inv(hosts, vms), "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_TRUE(p.search_exact);
}

// Review case i13: one VM's stun fits only the 100 Gbit target. Whatever order
// the inventory lists the VMs in, it gets that target and the other one the
// 25 Gbit one, and the evacuation is feasible.
TEST(PlannerPlacement, AVmWhoseStunFitsOnlyTheFastLinkGetsItInEitherOrder) {
  J hosts = J::array({HostJ("src", {"H100-80GB/passthrough", "H100-80GB/passthrough"}),
                      HostJ("slow", {"H100-80GB/passthrough"}, "25Gbit"),
                      HostJ("fast", {"H100-80GB/passthrough"}, "100Gbit")});
  J easy = VmJ("easy", "src", {0}, "passthrough", nullptr, "training", nullptr, false, Est(4000, 20000));
  J hard = VmJ("hard", "src", {1}, "passthrough", nullptr, "training", nullptr, false, Est(30000, 60000));
  for (J vms : {J::array({easy, hard}), J::array({hard, easy})}) {
    Plan p = PlanOf(Inv(hosts, vms), "src");
    ASSERT_TRUE(p.feasible) << p.reason;
    EXPECT_EQ(ActionOf(p, "hard").to->host, "fast");
    EXPECT_EQ(ActionOf(p, "easy").to->host, "slow");
    EXPECT_EQ(ActionOf(p, "hard").action, Action::kLiveMigrate);
    EXPECT_EQ(ActionOf(p, "easy").action, Action::kLiveMigrate);
  }
}

// Review cases i12 and i21: the same on MIG, and with more VMs than fast slots.
TEST(PlannerPlacement, LinkSpeedDecidesPlacementOnMigAndWithManyVms) {
  J hosts = J::array({MigHost("src", 1), MigHost("slow", 1, "25Gbit"), MigHost("fast", 1, "100Gbit")});
  J vms = J::array({Small("so", "slow", {0}, "3g.40gb", 0), Small("fo", "fast", {0}, "3g.40gb", 0)});
  J easy = VmJ("easy", "src", {0}, "3g.40gb", 0, "inference", nullptr, false, Est(4000, 20000));
  J hard = VmJ("hard", "src", {0}, "3g.40gb", 4, "inference", nullptr, false, Est(30000, 60000));
  for (J order : {J::array({easy, hard}), J::array({hard, easy})}) {
    J all = vms;
    for (const J& v : order) all.push_back(v);
    Plan p = PlanOf(Inv(hosts, all), "src");
    ASSERT_TRUE(p.feasible) << p.reason;
    EXPECT_EQ(ActionOf(p, "hard").to->host, "fast");
  }
  // Four passthrough VMs, two fast and two slow slots; only the last needs a fast one.
  J phosts = J::array(
      {HostJ("src", std::vector<std::string>(4, "H100-80GB/passthrough"), "100Gbit", 4),
       HostJ("slow", std::vector<std::string>(2, "H100-80GB/passthrough"), "25Gbit", 1),
       HostJ("fast", std::vector<std::string>(2, "H100-80GB/passthrough"), "100Gbit", 1)});
  J pvms = J::array();
  for (int i = 0; i < 4; ++i) {
    pvms.push_back(VmJ(fmt::format("p{}", i), "src", {i}, "passthrough", nullptr, "training", nullptr, false,
                       i == 3 ? Est(30000, 60000) : Est(4000, 20000)));
  }
  Plan q = PlanOf(Inv(phosts, pvms), "src");
  ASSERT_TRUE(q.feasible) << q.reason;
  EXPECT_EQ(ActionOf(q, "p3").to->host, "fast");
}

// Review case i14: the only free slices of the target cannot hold a 4g.40gb,
// whose one start (slice 0) is taken; the reason says so.
TEST(PlannerPlacement, NoSlotReasonNamesTheTakenStart) {
  J groups = J::array({J{{"name", "chat"}, {"min_serving", 1}, {"replica_start", "90s"}}});
  J vms = J::array({VmJ("r1", "src", {0}, "4g.40gb", 0, "stateless-inference", "chat", false, Est(150000, 200000)),
                    VmJ("bo", "b", {0}, "3g.40gb", 0, "stateless-inference", "chat")});
  Plan p = PlanOf(Inv(J::array({MigHost("src", 1), MigHost("b", 1)}), vms, groups), "src");
  const auto& r = ActionOf(p, "r1");
  EXPECT_EQ(r.action, Action::kBlocked);
  EXPECT_TRUE(Has(r.reason, "4g.40gb starts only at slice 0; taken on b gpu 0 (slices 0 1 2 3 in use)")) << r.reason;
  EXPECT_FALSE(Has(r.reason, "stranded")) << r.reason;
}

// Review cases i3 and i5: a host in maintenance with the model, and a vGPU GPU
// holding another size, are named when they are why no target was found.
TEST(PlannerPlacement, NoSlotReasonNamesMaintenanceAndTheEqualSizeRule) {
  J hosts = J::array({MigHost("src", 1), MigHost("maint", 1, "100Gbit", 2, true),
                      MigHost("a100", 1, "100Gbit", 2, false, "A100-80GB")});
  Plan p = PlanOf(Inv(hosts, J::array({Small("llm", "src", {0}, "3g.40gb", 0)})), "src");
  EXPECT_TRUE(Has(ActionOf(p, "llm").reason, "maint has H100-80GB GPUs but is in maintenance, so not a target"))
      << ActionOf(p, "llm").reason;

  J vhosts = J::array({HostJ("src", {"H100-80GB/vgpu"}), HostJ("b", {"H100-80GB/vgpu"})});
  J vvms = J::array({Small("v", "src", {0}, "vgpu:20GB", nullptr, "graphics"),
                     Small("b1", "b", {0}, "vgpu:10GB", nullptr, "graphics")});
  Plan q = PlanOf(Inv(vhosts, vvms), "src");
  EXPECT_TRUE(Has(ActionOf(q, "v").reason, "every vGPU on one GPU has the same size, and b gpu 0 holds 10 GB vGPUs"))
      << ActionOf(q, "v").reason;
}

}  // namespace
}  // namespace gpumigrate::planner::testing
