// docs/planner.md's decision table, one rule at a time.
#include "tests/unit/planner/planner_fixtures.h"

namespace gpumigrate::planner::testing {
namespace {

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// gpu-a (evacuated) and gpu-b (an empty target), both 100 Gbit, max 2 migrations.
J TwoHosts(J vms, J groups = J::array(), J policy = {{"max_stun", "100s"}, {"allow_power_off", false}}) {
  return Inv(J::array({MigHost("gpu-a", 2), MigHost("gpu-b", 2)}), vms, groups, policy);
}

J Chat(int min_serving, const std::string& replica_start = "90s", const std::string& drain = "30s") {
  return J::array({J{{"name", "chat"}, {"min_serving", min_serving}, {"replica_start", replica_start},
                     {"drain", drain}}});
}

TEST(PlannerDecision, LiveMigrateWhenTheStunFitsAtTheShareItGets) {
  // Estimates made at 50 Gbit: on 100 Gbit links two run side by side at 50 Gbit
  // each in the time one takes, so the plan shares the link.
  Plan p = PlanOf(TwoHosts(J::array({VmJ("a", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false,
                                         Est(8000, 40000, "50Gbit")),
                                     VmJ("b", "gpu-a", {1}, "3g.40gb", 0, "inference", nullptr, false,
                                         Est(8000, 40000, "50Gbit"))})),
                  "gpu-a");
  EXPECT_TRUE(p.feasible) << p.reason;
  const auto& a = ActionOf(p, "a");
  EXPECT_EQ(a.action, Action::kLiveMigrate);
  ASSERT_TRUE(a.to.has_value());
  EXPECT_EQ(a.to->host, "gpu-b");
  EXPECT_EQ(a.predicted_stun_ms, 8000);
  EXPECT_EQ(a.end_ms - a.start_ms, 40000);
  EXPECT_EQ(a.link_shared_with, 1u);
  EXPECT_EQ(p.total_ms, 40000);
  EXPECT_TRUE(Has(a.reason, "50 Gbit (link shared with 1 other) is within 100 s")) << a.reason;
  EXPECT_TRUE(Has(a.reason, "scaled from the estimate at 50 Gbit")) << a.reason;
}

TEST(PlannerDecision, TheStunIsScaledToTheShare) {
  // Estimates at 100 Gbit, a 50 Gbit share: twice the stun and the time.
  J inv = TwoHosts(J::array({VmJ("a", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, Est(8000, 40000))}));
  inv["hosts"][1]["link"] = "50Gbit";
  Plan p = PlanOf(inv, "gpu-a");
  EXPECT_EQ(ActionOf(p, "a").predicted_stun_ms, 16000);
  EXPECT_EQ(ActionOf(p, "a").end_ms, 80000);
}

TEST(PlannerDecision, AVmThatOnlyFitsAloneGetsTheLinkAlone) {
  // 60 s at 100 Gbit; at a 50 Gbit share it would be 120 s > 100 s.
  Plan p = PlanOf(TwoHosts(J::array({VmJ("big", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, Est(60000, 90000)),
                                     VmJ("s1", "gpu-a", {1}, "1g.10gb", 0, "inference", nullptr, false, Est(1000, 5000)),
                                     VmJ("s2", "gpu-a", {1}, "1g.10gb", 1, "inference", nullptr, false, Est(1000, 5000))})),
                  "gpu-a");
  EXPECT_TRUE(p.feasible) << p.reason;
  const auto& big = ActionOf(p, "big");
  EXPECT_EQ(big.action, Action::kLiveMigrate);
  EXPECT_TRUE(big.link_alone);
  EXPECT_EQ(big.predicted_stun_ms, 60000);
  EXPECT_DOUBLE_EQ(big.bandwidth_bytes_per_s, 100e9 / 8);
  EXPECT_TRUE(Has(big.reason, "runs alone")) << big.reason;
  for (const char* other : {"s1", "s2"}) {
    const auto& o = ActionOf(p, other);
    EXPECT_TRUE(o.end_ms <= big.start_ms || o.start_ms >= big.end_ms) << other << " overlaps the alone migration";
  }
}

TEST(PlannerDecision, UvmIsBlockedUnlessPowerOffIsAllowed) {
  J inv = TwoHosts(J::array({VmJ("u", "gpu-a", {0}, "1g.10gb", 0, "inference", nullptr, true, Est(10, 100))}));
  Plan blocked = PlanOf(inv, "gpu-a");
  EXPECT_FALSE(blocked.feasible);
  EXPECT_EQ(ActionOf(blocked, "u").action, Action::kBlocked);
  EXPECT_FALSE(ActionOf(blocked, "u").to.has_value());
  EXPECT_TRUE(Has(ActionOf(blocked, "u").reason, "Unified Virtual Memory"));
  EXPECT_TRUE(Has(blocked.reason, "u:"));

  Plan flag = PlanOf(inv, "gpu-a", /*allow_power_off=*/true);
  EXPECT_TRUE(flag.feasible);
  EXPECT_EQ(ActionOf(flag, "u").action, Action::kPowerOff);
  EXPECT_FALSE(ActionOf(flag, "u").to.has_value());

  inv["policy"]["allow_power_off"] = true;
  Plan policy = PlanOf(inv, "gpu-a");
  EXPECT_TRUE(policy.feasible);
  EXPECT_EQ(ActionOf(policy, "u").action, Action::kPowerOff);
  EXPECT_TRUE(Has(ActionOf(policy, "u").reason, "policy.allow_power_off"));
}

TEST(PlannerDecision, MultiGpuVgpuIsPoweredOffNotMigrated) {
  J inv = Inv(J::array({HostJ("gpu-a", {"H100-80GB/vgpu", "H100-80GB/vgpu"}),
                        HostJ("gpu-b", {"H100-80GB/vgpu", "H100-80GB/vgpu"})}),
              J::array({VmJ("mv", "gpu-a", {0, 1}, "vgpu:40GB", nullptr, "training", nullptr, false, Est(10, 100))}));
  Plan p = PlanOf(inv, "gpu-a", true);
  EXPECT_EQ(ActionOf(p, "mv").action, Action::kPowerOff);
  EXPECT_TRUE(Has(ActionOf(p, "mv").reason, "multi-GPU vGPU"));
}

TEST(PlannerDecision, StunOverTheLimitAndNotStatelessIsBlocked) {
  Plan p = PlanOf(TwoHosts(J::array({VmJ("t", "gpu-a", {0}, "7g.80gb", 0, "training", nullptr, false,
                                         Est(140000, 300000))})),
                  "gpu-a");
  EXPECT_FALSE(p.feasible);
  const auto& t = ActionOf(p, "t");
  EXPECT_EQ(t.action, Action::kBlocked);
  EXPECT_EQ(t.predicted_stun_ms, 140000);
  EXPECT_TRUE(Has(t.reason, "140 s > 100 s")) << t.reason;
  EXPECT_TRUE(Has(t.reason, "not a stateless-inference replica")) << t.reason;
}

TEST(PlannerDecision, AStunThatFitsOnlyTheSourcesLinkIsBlockedNamingTheTarget) {
  // 60 s at 100 Gbit; the only target has 25 Gbit: 240 s.
  J inv = Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1, "25Gbit")}),
              J::array({VmJ("t", "gpu-a", {0}, "3g.40gb", 0, "training", nullptr, false, Est(60000, 90000))}));
  Plan p = PlanOf(inv, "gpu-a");
  const auto& t = ActionOf(p, "t");
  EXPECT_EQ(t.action, Action::kBlocked);
  EXPECT_FALSE(t.to.has_value());
  EXPECT_EQ(t.predicted_stun_ms, 240000);
  // gpu-b is no target for it at all (its slot could serve another VM), and the
  // reason says why: the link, not room.
  EXPECT_TRUE(Has(t.reason, "no target with a link fast enough for its stun")) << t.reason;
  EXPECT_TRUE(Has(t.reason, "predicted stun > 100 s even with the link alone on gpu-b (240 s at 25 Gbit)"))
      << t.reason;
  EXPECT_FALSE(Has(t.reason, "best target with room")) << t.reason;
  EXPECT_FALSE(Has(p.reason, "capacity shortfall")) << p.reason;
}

TEST(PlannerDecision, AnEstimateFromASlowerLinkScalesDownOnAFasterOne) {
  // Review case i18: 200 s measured at 25 Gbit is 50 s on 100 Gbit links.
  J inv = Inv(J::array({HostJ("src", {"H100-80GB/passthrough"}), HostJ("b", {"H100-80GB/passthrough"})}),
              J::array({VmJ("f", "src", {0}, "passthrough", nullptr, "training", nullptr, false,
                            Est(200000, 400000, "25Gbit"))}));
  Plan p = PlanOf(inv, "src");
  ASSERT_TRUE(p.feasible) << p.reason;
  const auto& f = ActionOf(p, "f");
  EXPECT_EQ(f.action, Action::kLiveMigrate);
  EXPECT_EQ(f.predicted_stun_ms, 50000);
  EXPECT_EQ(f.end_ms - f.start_ms, 100000);
  EXPECT_TRUE(Has(f.reason, "predicted stun 50 s at 100 Gbit")) << f.reason;
  EXPECT_TRUE(Has(f.reason, "scaled from the estimate at 25 Gbit")) << f.reason;
}

TEST(PlannerDecision, PerVmMaxStunOverridesThePolicy) {
  J inv = TwoHosts(J::array({VmJ("t", "gpu-a", {0}, "3g.40gb", 0, "training", nullptr, false, Est(20000, 60000))}));
  EXPECT_EQ(ActionOf(PlanOf(inv, "gpu-a"), "t").action, Action::kLiveMigrate);
  inv["vms"][0]["max_stun"] = "10s";
  EXPECT_EQ(ActionOf(PlanOf(inv, "gpu-a"), "t").action, Action::kBlocked);
  inv["vms"][0]["max_stun"] = "30s";
  inv["policy"]["max_stun"] = "5s";
  EXPECT_EQ(ActionOf(PlanOf(inv, "gpu-a"), "t").action, Action::kLiveMigrate);
}

TEST(PlannerDecision, StatelessReplicaWithTooLongAStunIsDrained) {
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "stateless-inference", "chat", false, Est(150000, 400000)),
                    VmJ("c2", "gpu-b", {1}, "1g.10gb", 0, "stateless-inference", "chat"),
                    VmJ("c3", "gpu-b", {1}, "1g.10gb", 1, "stateless-inference", "chat")});
  Plan p = PlanOf(TwoHosts(vms, Chat(2)), "gpu-a");
  EXPECT_TRUE(p.feasible) << p.reason;
  const auto& c = ActionOf(p, "c1");
  EXPECT_EQ(c.action, Action::kDrainAndReplace);
  ASSERT_TRUE(c.to.has_value());
  EXPECT_EQ(c.to->host, "gpu-b");
  EXPECT_EQ(c.end_ms - c.start_ms, 120000);  // replica_start 90 s + drain 30 s
  EXPECT_TRUE(Has(c.reason, "150 s > 100 s")) << c.reason;
}

TEST(PlannerDecision, DrainWhenItIsCheaper) {
  // Migrating takes 400 s (stun 5 s is fine); the replacement is ready and drained in 60 s.
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "stateless-inference", "chat", false, Est(5000, 400000)),
                    VmJ("c2", "gpu-b", {1}, "1g.10gb", 0, "stateless-inference", "chat")});
  Plan p = PlanOf(TwoHosts(vms, Chat(1, "45s", "15s")), "gpu-a");
  EXPECT_EQ(ActionOf(p, "c1").action, Action::kDrainAndReplace);
  EXPECT_TRUE(Has(ActionOf(p, "c1").reason, "quicker than migrating")) << ActionOf(p, "c1").reason;
}

TEST(PlannerDecision, MigrateAStatelessReplicaWhenThatIsCheaper) {
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "stateless-inference", "chat", false, Est(2000, 20000)),
                    VmJ("c2", "gpu-b", {1}, "1g.10gb", 0, "stateless-inference", "chat")});
  Plan p = PlanOf(TwoHosts(vms, Chat(1)), "gpu-a");
  EXPECT_EQ(ActionOf(p, "c1").action, Action::kLiveMigrate);
}

TEST(PlannerDecision, AStunThatWouldTakeTheGroupBelowMinServingMeansDrain) {
  // Two replicas, min_serving 2: a stun leaves one serving, a drain keeps two.
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "stateless-inference", "chat", false, Est(2000, 900000)),
                    VmJ("c2", "gpu-b", {1}, "1g.10gb", 0, "stateless-inference", "chat")});
  Plan p = PlanOf(TwoHosts(vms, Chat(2, "90s", "30s")), "gpu-a");
  EXPECT_EQ(ActionOf(p, "c1").action, Action::kDrainAndReplace);
  vms[0]["estimate"] = Est(2000, 20000);  // migrating would be quicker, but its stun breaks min_serving
  Plan q = PlanOf(TwoHosts(vms, Chat(2, "90s", "30s")), "gpu-a");
  EXPECT_EQ(ActionOf(q, "c1").action, Action::kDrainAndReplace);
  EXPECT_TRUE(Has(ActionOf(q, "c1").reason, "below 2")) << ActionOf(q, "c1").reason;
}

TEST(PlannerDecision, AGroupAlreadyBelowMinServingBlocks) {
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "stateless-inference", "chat", false, Est(2000, 20000)),
                    VmJ("c2", "gpu-b", {1}, "1g.10gb", 0, "stateless-inference", "chat")});
  Plan p = PlanOf(TwoHosts(vms, Chat(3)), "gpu-a");
  EXPECT_FALSE(p.feasible);
  EXPECT_EQ(ActionOf(p, "c1").action, Action::kBlocked);
  EXPECT_TRUE(Has(ActionOf(p, "c1").reason, "group chat would stay below 3 serving")) << ActionOf(p, "c1").reason;
}

TEST(PlannerDecision, AStatefulGroupMemberIsNotDrained) {
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "inference", "chat", false, Est(2000, 20000)),
                    VmJ("c2", "gpu-b", {1}, "1g.10gb", 0, "inference", "chat")});
  Plan p = PlanOf(TwoHosts(vms, Chat(2)), "gpu-a");
  EXPECT_EQ(ActionOf(p, "c1").action, Action::kBlocked);
  EXPECT_TRUE(Has(ActionOf(p, "c1").reason, "would fall below 2 serving")) << ActionOf(p, "c1").reason;
}

TEST(PlannerDecision, UvmStatelessReplicaIsDrainedNotPoweredOff) {
  J vms = J::array({VmJ("c1", "gpu-a", {0}, "1g.10gb", 0, "stateless-inference", "chat", true),
                    VmJ("c2", "gpu-b", {1}, "1g.10gb", 0, "stateless-inference", "chat")});
  Plan p = PlanOf(TwoHosts(vms, Chat(1)), "gpu-a", true);
  EXPECT_EQ(ActionOf(p, "c1").action, Action::kDrainAndReplace);
}

TEST(PlannerDecision, PowerOffThatWouldTakeAGroupBelowMinServingBlocks) {
  // No slot for a replacement (gpu-b full), UVM, power-off allowed, but the group needs both replicas.
  J inv = TwoHosts(J::array({VmJ("c1", "gpu-a", {0}, "7g.80gb", 0, "stateless-inference", "chat", true),
                             VmJ("c2", "gpu-b", {0}, "7g.80gb", 0, "stateless-inference", "chat"),
                             VmJ("f", "gpu-b", {1}, "7g.80gb", 0, "training")}),
                   Chat(2));
  Plan p = PlanOf(inv, "gpu-a", true);
  EXPECT_EQ(ActionOf(p, "c1").action, Action::kBlocked);
  EXPECT_TRUE(Has(ActionOf(p, "c1").reason, "powering it off: group chat would fall below 2 serving"))
      << ActionOf(p, "c1").reason;
  inv["groups"][0]["min_serving"] = 1;
  EXPECT_EQ(ActionOf(PlanOf(inv, "gpu-a", true), "c1").action, Action::kPowerOff);
}

TEST(PlannerDecision, NoEstimateMeansStopAndCopyOfTheFrameBuffer) {
  Plan p = PlanOf(TwoHosts(J::array({VmJ("n", "gpu-a", {0}, "3g.40gb", 0)})), "gpu-a");
  const auto& n = ActionOf(p, "n");
  EXPECT_EQ(n.action, Action::kLiveMigrate);
  EXPECT_EQ(n.predicted_stun_ms, 3200);  // 40 GB at 100 Gbit, alone on the link
  EXPECT_EQ(n.stun_basis, "frame-buffer");
  EXPECT_TRUE(Has(n.reason, "no estimate: stop-and-copy of its 40 GB frame buffer")) << n.reason;
}

TEST(PlannerDecision, PowerOffComesLastSoTheVmServesLongest) {
  J inv = TwoHosts(J::array({VmJ("m", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, Est(1000, 30000)),
                             VmJ("u", "gpu-a", {1}, "1g.10gb", 0, "inference", nullptr, true)}));
  Plan p = PlanOf(inv, "gpu-a", true);
  EXPECT_EQ(ActionOf(p, "u").start_ms, p.total_ms);
  EXPECT_EQ(p.total_ms, ActionOf(p, "m").end_ms);
}

TEST(PlannerDecision, UnknownHostToEvacuateIsAnError) {
  auto inv = ParseInventory(TwoHosts(J::array()).dump());
  ASSERT_TRUE(inv.ok());
  PlanOptions o;
  o.evacuate = "gpu-z";
  auto p = MakePlan(*inv, o);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(Has(p.status().message(), "no host 'gpu-z'"));
}

TEST(PlannerDecision, AnEmptyHostIsTriviallyFeasible) {
  Plan p = PlanOf(TwoHosts(J::array({VmJ("x", "gpu-b", {0}, "1g.10gb", 0)})), "gpu-a");
  EXPECT_TRUE(p.feasible);
  EXPECT_TRUE(p.actions.empty());
  EXPECT_EQ(p.total_ms, 0);
}

}  // namespace
}  // namespace gpumigrate::planner::testing
