// The schedule: event-driven starts, max_migrations per host as source or target,
// link shares, alone-on-the-link migrations, drains that keep min_serving, and
// the pipelined total beside the batched one.
#include <algorithm>
#include <map>

#include "engine/planner/schedule.h"
#include "tests/unit/planner/planner_fixtures.h"

namespace gpumigrate::planner::testing {
namespace {

// The most migrations active at once that touch `host` (source or target).
int MostConcurrent(const Plan& p, const std::string& source, const std::string& host) {
  std::vector<std::pair<int64_t, int>> ev;
  for (const auto& a : p.actions) {
    if (a.action != Action::kLiveMigrate) continue;
    if (source != host && a.to->host != host) continue;
    ev.push_back({a.start_ms, +1});
    ev.push_back({a.end_ms, -1});
  }
  std::sort(ev.begin(), ev.end());
  int cur = 0, most = 0;
  for (auto [t, d] : ev) most = std::max(most, cur += d);
  return most;
}

J Vms(int n, const std::string& host, const std::vector<double>& totals_ms) {
  J vms = J::array();
  for (int i = 0; i < n; ++i) {  // 1g.10gb instances, 7 per GPU
    double total = totals_ms[i % totals_ms.size()];
    vms.push_back(VmJ(fmt::format("v{}", i), host, {i / 7}, "1g.10gb", i % 7, "inference", nullptr, false,
                      Est(total / 20, total)));
  }
  return vms;
}

TEST(PlannerSchedule, NoHostExceedsMaxMigrations) {
  // Six 3g.40gb leave gpu-a (limit 3) for gpu-b (limit 1) and gpu-c (limit 2).
  J vms = J::array();
  for (int i = 0; i < 6; ++i) {
    vms.push_back(VmJ(fmt::format("v{}", i), "gpu-a", {i / 2}, "3g.40gb", (i % 2) * 4, "inference", nullptr, false,
                      Est(1000, 20000.0 * (1 + i % 3))));
  }
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 3, "100Gbit", 3), MigHost("gpu-b", 2, "100Gbit", 1),
                                MigHost("gpu-c", 2, "100Gbit", 2)}),
                      vms),
                  "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_LE(MostConcurrent(p, "gpu-a", "gpu-a"), 3);
  EXPECT_LE(MostConcurrent(p, "gpu-a", "gpu-b"), 1);
  EXPECT_LE(MostConcurrent(p, "gpu-a", "gpu-c"), 2);
  EXPECT_GE(MostConcurrent(p, "gpu-a", "gpu-a"), 2);  // it does run migrations side by side
}

TEST(PlannerSchedule, ActionsStartAsSoonAsASlotFrees) {
  // Durations 100 s and three of 10 s (at a 50 Gbit share), two at a time: batches
  // wait for the 100 s one, the pipeline runs the short ones beside it.
  J vms = J::array();
  std::vector<double> totals = {50000, 5000, 5000, 5000};  // at 100 Gbit; doubled at the 50 Gbit share
  for (size_t i = 0; i < totals.size(); ++i) {
    vms.push_back(VmJ(fmt::format("v{}", i), "gpu-a", {0}, "1g.10gb", static_cast<int>(i), "inference", nullptr,
                      false, Est(500, totals[i])));
  }
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1, "100Gbit", 4)}), vms), "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_EQ(p.total_ms, 100000);
  EXPECT_EQ(p.batched_total_ms, 110000);
  EXPECT_LT(p.total_ms, p.batched_total_ms);
}

TEST(PlannerSchedule, SharesNeverOversubscribeALink) {
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 1, "100Gbit", 4), MigHost("gpu-b", 1, "40Gbit", 2),
                                MigHost("gpu-c", 1, "200Gbit", 4)}),
                      Vms(6, "gpu-a", {20000, 40000})),
                  "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  std::map<std::string, double> link = {{"gpu-a", 12.5e9}, {"gpu-b", 5e9}, {"gpu-c", 25e9}};
  for (const auto& a : p.actions) {
    for (const std::string& h : {std::string("gpu-a"), a.to->host}) {
      double sum = 0;
      for (const auto& b : p.actions) {
        if ((h == "gpu-a" || b.to->host == h) && b.start_ms <= a.start_ms && a.start_ms < b.end_ms) {
          sum += b.bandwidth_bytes_per_s;
        }
      }
      EXPECT_LE(sum, link[h] * (1 + 1e-9)) << "at " << a.start_ms << " ms on " << h;
    }
  }
}

TEST(PlannerSchedule, DrainsKeepMinServingAndStunsDoNotOverlapBelowIt) {
  // Group of 5, min_serving 4: each live migration's stun takes one replica away,
  // so no two stuns overlap; drains take none away. (Draining takes 70 s, longer
  // than migrating, so the three short ones migrate.)
  J groups = J::array({J{{"name", "g"}, {"min_serving", 4}, {"replica_start", "60s"}, {"drain", "10s"}}});
  J vms = J::array();
  for (int i = 0; i < 3; ++i) {
    vms.push_back(VmJ(fmt::format("m{}", i), "gpu-a", {0}, "1g.10gb", i, "stateless-inference", "g", false,
                      Est(8000, 12000)));
  }
  vms.push_back(VmJ("d0", "gpu-a", {0}, "1g.10gb", 3, "stateless-inference", "g", false, Est(150000, 200000)));
  vms.push_back(VmJ("r", "gpu-c", {0}, "1g.10gb", 0, "stateless-inference", "g"));
  J hosts = J::array({MigHost("gpu-a", 1, "100Gbit", 3), MigHost("gpu-b", 1, "100Gbit", 3),
                      MigHost("gpu-c", 1, "100Gbit", 3)});
  Plan p = PlanOf(Inv(hosts, vms, groups), "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_EQ(ActionOf(p, "d0").action, Action::kDrainAndReplace);
  std::vector<std::pair<int64_t, int64_t>> stuns;
  for (const auto& a : p.actions) {
    if (a.action == Action::kLiveMigrate) stuns.push_back({a.end_ms - a.predicted_stun_ms, a.end_ms});
  }
  ASSERT_EQ(stuns.size(), 3u);
  for (size_t i = 0; i < stuns.size(); ++i) {
    for (size_t j = i + 1; j < stuns.size(); ++j) {
      bool overlap = stuns[i].first < stuns[j].second && stuns[j].first < stuns[i].second;
      EXPECT_FALSE(overlap) << "stuns " << i << " and " << j << " overlap: the group would serve 3 < 4";
    }
  }
}

TEST(PlannerSchedule, DirectPipelinedNeverLongerThanBatched) {
  // The scheduler alone, on a case where back-filling is what helps.
  std::vector<Job> jobs = {{true, 0, 1, false, 100, 5, -1}, {true, 0, 2, false, 10, 1, -1},
                           {true, 0, 1, false, 10, 1, -1},  {true, 0, 2, false, 10, 1, -1},
                           {false, 0, 2, false, 50, 0, -1}};
  ScheduleResult r = Schedule(jobs, {2, 2, 2}, {});
  EXPECT_LE(r.pipelined.total_ms, r.batched.total_ms);
  EXPECT_EQ(r.pipelined.start_ms[4], 0);  // a drain starts at once
  EXPECT_EQ(r.pipelined.total_ms, 100);
}

}  // namespace
}  // namespace gpumigrate::planner::testing
