// Stun at the bandwidth a migration gets: the engine's own model re-run from the
// measured profile, the estimate scaled by link / share, or a stop-and-copy of
// the frame buffer; and what the plan says about it.
#include "engine/planner/stun.h"
#include "tests/unit/planner/planner_fixtures.h"

namespace gpumigrate::planner::testing {
namespace {

using namespace std::chrono_literals;

// A 40 GB device: 30 GB of static weights and a 10 GB KV cache whose dirty set
// grows with the window, as `gpumigrate estimate --json` writes it.
J ProfileEstimate() {
  J regions = J::array();
  regions.push_back({{"id", 0}, {"name", "weights"}, {"size_bytes", 30'000'000'000ull}, {"nonzero_fraction", 1.0},
                     {"codec", "none"}, {"compression_ratio", 1.0},
                     {"dirty_working_set", J::array()}});
  regions.push_back({{"id", 1}, {"name", "kv"}, {"size_bytes", 10'000'000'000ull}, {"nonzero_fraction", 0.5},
                     {"codec", "none"}, {"compression_ratio", 1.0},
                     {"dirty_working_set", J::array({J{{"window_ms", 100}, {"low_bytes", 1e8}, {"mid_bytes", 2e8},
                                                       {"high_bytes", 3e8}},
                                                     J{{"window_ms", 1000}, {"low_bytes", 1e9}, {"mid_bytes", 2e9},
                                                       {"high_bytes", 3e9}}})}});
  return {{"decision", "live-migrate"}, {"predicted_stun_ms", 1234}, {"predicted_total_ms", 40000},
          {"link", "100Gbit"}, {"fixed_cost_ms", 5.0}, {"device_state_bytes", 1'000'000},
          {"downtime_target_ms", 300.0}, {"max_stun_ms", 100000.0}, {"regions", regions}};
}

Vm ParseOne(const J& estimate) {
  J inv = Inv(J::array({MigHost("gpu-a", 1)}),
              J::array({VmJ("v", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, estimate)}));
  auto parsed = ParseInventory(inv.dump());
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  return parsed.ok() ? parsed->vms[0] : Vm{};
}

TEST(PlannerStun, ProfileReRunsTheEnginesModelAtTheShare) {
  Vm vm = ParseOne(ProfileEstimate());
  ASSERT_TRUE(vm.estimate.profile.has_value());
  StunAt full = PredictStunAt(vm, 12.5e9, 100s);
  StunAt half = PredictStunAt(vm, 6.25e9, 100s);
  EXPECT_EQ(full.basis, "profile");
  // Model-derived, not the estimate's figures scaled: a slower link means longer
  // rounds, a larger dirty set and so more than twice the stun.
  EXPECT_GT(half.stun_ms, 2 * full.stun_ms);
  EXPECT_GT(half.total_ms, 2 * full.total_ms * 0.99);
  // The same as the estimator's model on the same profile.
  ModelParams params = vm.estimate.params;
  params.bandwidth_low = params.bandwidth_mid = params.bandwidth_high = 6.25e9;
  params.max_stun = 100s;
  ModelRun run = RunModel(*vm.estimate.profile, params, WorkingSetCurve::Bound::kMid, 6.25e9);
  EXPECT_DOUBLE_EQ(half.stun_ms, run.stun_ms);
}

// A target whose content store holds the VM's weights (host "models", VM
// "model"): the static regions go as 32-byte digests, at the offer rate the
// estimate measured; the estimate's own held shares are kept for other targets.
TEST(PlannerStun, ATargetHoldingTheWeightsIsModelledWithoutSendingThem) {
  J est = ProfileEstimate();
  est["regions"][0]["hint"] = "static";
  est["regions"][0]["page_size"] = 4096;
  est["offer_bytes_per_s"] = 2e9;
  Vm vm = ParseOne(est);
  ASSERT_TRUE(vm.estimate.profile.has_value());
  EXPECT_EQ(vm.estimate.profile->regions[0].info.hint, RegionHint::kStatic);
  EXPECT_EQ(vm.estimate.profile->offer_bytes_per_s, 2e9);
  const double bw = 12.5e9;  // 100 Gbit
  StunAt plain = PredictStunAt(vm, bw, 100s);
  StunAt held = PredictStunAt(vm, bw, 100s, /*target_holds=*/true);
  // Round 0: 35 GB at 12.5 GB/s (2.8 s) plain; held: 5 GB + 30 GB / 4096 x 32 at
  // 12.5 GB/s plus 30 GB hashed at 2 GB/s (15 s): at 100 Gbit hashing on one
  // core costs more than sending.
  EXPECT_GT(held.total_ms, plain.total_ms);
  // On a 10 Gbit link (1.25 GB/s) sending 30 GB takes 24 s: holding them pays.
  EXPECT_LT(PredictStunAt(vm, 1.25e9, 100s, true).total_ms, PredictStunAt(vm, 1.25e9, 100s).total_ms);
}

TEST(PlannerStun, WithoutAProfileTheEstimateScalesWithTheLink) {
  Vm vm = ParseOne(Est(8000, 40000, "100Gbit"));
  StunAt half = PredictStunAt(vm, 6.25e9, 100s);
  EXPECT_EQ(half.basis, "scaled");
  EXPECT_DOUBLE_EQ(half.stun_ms, 16000);
  EXPECT_DOUBLE_EQ(half.total_ms, 80000);
  // Both ways (docs/planner.md: "scaled from estimate.link"): four times the
  // estimate's bandwidth is a quarter of its stun and time.
  StunAt fast = PredictStunAt(vm, 50e9, 100s);
  EXPECT_DOUBLE_EQ(fast.stun_ms, 2000);
  EXPECT_DOUBLE_EQ(fast.total_ms, 10000);
  EXPECT_NE(BasisText(vm, half).find("scaled from the estimate at 100 Gbit"), std::string::npos);
}

TEST(PlannerStun, NoEstimateIsAStopAndCopy) {
  Vm vm = ParseOne(nullptr);
  StunAt s = PredictStunAt(vm, 12.5e9, 100s);
  EXPECT_EQ(s.basis, "frame-buffer");
  EXPECT_DOUBLE_EQ(s.stun_ms, 3200);
  EXPECT_DOUBLE_EQ(s.total_ms, 3200);
}

TEST(PlannerStun, PlanSaysWhichBasisItUsed) {
  J inv = Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1)}),
              J::array({VmJ("p", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, ProfileEstimate())}));
  Plan p = PlanOf(inv, "gpu-a");
  const auto& a = ActionOf(p, "p");
  EXPECT_EQ(a.action, Action::kLiveMigrate);
  EXPECT_EQ(a.stun_basis, "profile");
  EXPECT_NE(a.reason.find("re-predicted from the measured profile"), std::string::npos) << a.reason;
}

// Each live migration carries its time budget (evacuate's --max-total): the
// policy's factor times its planned duration, never under the policy's minimum.
TEST(PlannerStun, EachMigrationGetsItsTimeBudget) {
  J vms = J::array({VmJ("big", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, Est(8000, 40000))});
  J hosts = J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1)});
  Plan p = PlanOf(Inv(hosts, vms), "gpu-a");
  const auto& a = ActionOf(p, "big");
  ASSERT_EQ(a.action, Action::kLiveMigrate);
  ASSERT_EQ(a.end_ms - a.start_ms, 40000);
  EXPECT_EQ(a.budget_ms, 120000);  // the default factor 3
  EXPECT_NE(PlanToJson(p).find("\"budget_ms\": 120000"), std::string::npos) << PlanToJson(p);
  Plan q = PlanOf(Inv(hosts, vms, J::array(), {{"max_stun", "100s"}, {"budget_factor", 1.5}}), "gpu-a");
  EXPECT_EQ(ActionOf(q, "big").budget_ms, 60000);
  // A short migration gets the minimum: a few seconds of noise must not abort it.
  Plan r = PlanOf(Inv(hosts, vms, J::array(), {{"max_stun", "100s"}, {"budget_min", "200s"}}), "gpu-a");
  EXPECT_EQ(ActionOf(r, "big").budget_ms, 200000);
  // Below 1 the budget would be shorter than the plan itself: refused, naming the key.
  auto bad = ParseInventory(Inv(hosts, vms, J::array(), {{"budget_factor", 0.5}}).dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("policy.budget_factor"), std::string::npos)
      << bad.status().message();
}

// A link carries its rate less the headers' share (policy.link_efficiency):
// the plan's shares are of that payload rate, and its stuns and times follow.
TEST(PlannerStun, PlansAtTheLinksPayloadRate) {
  J vms = J::array({VmJ("big", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, Est(8000, 40000))});
  J hosts = J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1)});
  const PlannedAction whole = ActionOf(PlanOf(Inv(hosts, vms), "gpu-a"), "big");
  const PlannedAction half =
      ActionOf(PlanOf(Inv(hosts, vms, J::array(), {{"max_stun", "100s"}, {"link_efficiency", 0.5}}), "gpu-a"), "big");
  ASSERT_EQ(half.action, Action::kLiveMigrate);
  EXPECT_DOUBLE_EQ(half.bandwidth_bytes_per_s, whole.bandwidth_bytes_per_s / 2);
  EXPECT_GT(half.predicted_stun_ms, whole.predicted_stun_ms);
  EXPECT_GT(half.end_ms - half.start_ms, whole.end_ms - whole.start_ms);
  // The default: 0.95.
  J no_key = J::parse(Inv(hosts, vms).dump());
  no_key["policy"].erase("link_efficiency");
  auto parsed = ParseInventory(no_key.dump());
  ASSERT_TRUE(parsed.ok());
  EXPECT_DOUBLE_EQ(parsed->policy.link_efficiency, 0.95);
  for (double bad : {0.0, 1.5}) {
    auto r = ParseInventory(Inv(hosts, vms, J::array(), {{"link_efficiency", bad}}).dump());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(std::string(r.status().message()).find("policy.link_efficiency"), std::string::npos)
        << r.status().message();
  }
}

TEST(PlannerStun, Formats) {
  EXPECT_EQ(Gbit(6.25e9), "50 Gbit");
  EXPECT_EQ(Gbit(12.5e9), "100 Gbit");
  EXPECT_EQ(Gbit(1e8), "800 Mbit");
  EXPECT_EQ(Seconds(9100), "9.1 s");
  EXPECT_EQ(Seconds(100000), "100 s");
  EXPECT_EQ(Seconds(350), "350 ms");
  // Above 100 s too the text keeps the tenth the JSON's milliseconds carry, and
  // a comparison never reads "100 s > 100 s".
  EXPECT_EQ(Seconds(150400), "150.4 s");
  EXPECT_EQ(StunOver(100040, 100000), "100.04 s > 100 s");
  EXPECT_EQ(StunOver(140000, 100000), "140 s > 100 s");
}

}  // namespace
}  // namespace gpumigrate::planner::testing
