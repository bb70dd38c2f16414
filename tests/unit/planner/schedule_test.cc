// The schedule: event-driven starts, max_migrations per host as source or target,
// link shares, alone-on-the-link migrations, drains that keep min_serving, and
// the pipelined total beside the batched one.
#include <algorithm>
#include <cmath>
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
  // The targets' links are slower than the source's: running side by side pays.
  Plan p = PlanOf(Inv(J::array({MigHost("gpu-a", 3, "200Gbit", 3), MigHost("gpu-b", 2, "50Gbit", 1),
                                MigHost("gpu-c", 2, "50Gbit", 2)}),
                      vms),
                  "gpu-a");
  ASSERT_TRUE(p.feasible) << p.reason;
  EXPECT_LE(MostConcurrent(p, "gpu-a", "gpu-a"), 3);
  EXPECT_LE(MostConcurrent(p, "gpu-a", "gpu-b"), 1);
  EXPECT_LE(MostConcurrent(p, "gpu-a", "gpu-c"), 2);
  EXPECT_GE(MostConcurrent(p, "gpu-a", "gpu-a"), 2);  // it does run migrations side by side
}

TEST(PlannerSchedule, ActionsStartAsSoonAsASlotFrees) {
  // Source 20 GB/s (2 at a time), targets 10 GB/s each: 100 GB to one target, three
  // of 10 GB to the other. Pipelined, the small ones follow each other beside the
  // large one (10 s); in batches of two the second batch waits for the large one.
  auto at = [](double gbytes) {
    return [gbytes](double bw) { return Timed{static_cast<int64_t>(gbytes * 1e9 / bw * 1e3), 100}; };
  };
  std::vector<Job> jobs = {{true, 0, 1, false, 100'000, at(100)},
                           {true, 0, 2, false, 100'000, at(10)},
                           {true, 0, 2, false, 100'000, at(10)},
                           {true, 0, 2, false, 100'000, at(10)}};
  ScheduleResult r = Schedule(jobs, {{2, 20e9}, {2, 10e9}, {2, 10e9}}, {});
  EXPECT_EQ(r.pipelined.total_ms, 10'000);
  const auto& j = r.pipelined.jobs;
  EXPECT_EQ(j[2].start_ms, j[1].start_ms + j[1].t.duration_ms);  // as soon as the first small one ends
  EXPECT_EQ(j[3].start_ms, j[2].start_ms + j[2].t.duration_ms);
  EXPECT_EQ(r.batched.total_ms, 12'000);
  EXPECT_FALSE(r.used_batched);
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
  // The scheduler alone: migrations whose time is 1 GB over their bandwidth, and a drain.
  auto gb = [](double gbytes) {
    return [gbytes](double bw) {
      return Timed{static_cast<int64_t>(gbytes * 1e9 / bw * 1e3), static_cast<int64_t>(gbytes * 1e9 / bw * 50)};
    };
  };
  std::vector<Job> jobs;
  for (double size : {100.0, 10.0, 10.0, 10.0}) jobs.push_back({true, 0, static_cast<uint32_t>(1 + jobs.size() % 2), false, 1'000'000, gb(size)});
  Job drain;
  drain.migration = false;
  drain.drain_ms = 5'000;
  jobs.push_back(drain);
  std::vector<HostLimit> hosts = {{2, 10e9}, {2, 10e9}, {2, 10e9}};
  ScheduleResult r = Schedule(jobs, hosts, {});
  EXPECT_LE(r.pipelined.total_ms, r.batched.total_ms);
  EXPECT_EQ(r.pipelined.jobs[4].start_ms, 0);  // a drain starts at once
  // Started at once beside the small ones, the 100 GB one was reserved half the
  // link for 20 s. As the controller runs it (the replay), it takes the whole
  // link once the small ones have ended, so the pipelined order ends at the
  // floor (130 GB over 10 GB/s) too, not later than the batches.
  EXPECT_EQ(r.pipelined.total_ms, 13'000);
  EXPECT_FALSE(r.used_batched);
  EXPECT_DOUBLE_EQ(r.pipelined.jobs[0].bandwidth_bytes_per_s, 5e9);  // the share reserved at its start
  EXPECT_DOUBLE_EQ(r.pipelined.jobs[0].final_bandwidth_bytes_per_s, 10e9);
}

TEST(PlannerSchedule, AMigrationThatNeedsTheWholeLinkWaitsForIt) {
  // Stun 60% of the duration: 100 GB at 5 GB/s is a 12 s stun, over the 10 s
  // limit; at the whole 10 GB/s link it is 6 s. The small ones never run beside it.
  auto at = [](double gbytes) {
    return [gbytes](double bw) {
      int64_t ms = static_cast<int64_t>(gbytes * 1e9 / bw * 1e3);
      return Timed{ms, ms * 6 / 10};
    };
  };
  std::vector<Job> jobs = {{true, 0, 1, false, 10'000, at(100)}, {true, 0, 1, false, 10'000, at(5)},
                           {true, 0, 1, false, 10'000, at(5)}};
  ScheduleResult r = Schedule(jobs, {{2, 10e9}, {2, 10e9}}, {});
  const auto& big = r.pipelined.jobs[0];
  EXPECT_EQ(big.bandwidth_bytes_per_s, 10e9);
  EXPECT_LE(big.t.stun_ms, 10'000);
  for (size_t i = 1; i < 3; ++i) {
    const auto& o = r.pipelined.jobs[i];
    bool overlap = o.start_ms < big.start_ms + big.t.duration_ms && big.start_ms < o.start_ms + o.t.duration_ms;
    EXPECT_FALSE(overlap) << i;
  }
}

// Review cases i3b and i10: with slots free on every host and the link split
// evenly among them, no migration waits (docs/planner.md: "Actions run as soon as
// capacity allows"); before, the last to start got what the earlier ones left
// of the link, below the floor, and waited for one of them to end.
TEST(PlannerSchedule, MigrationsThatFitTogetherAllStartAtOnce) {
  J hosts = J::array({HostJ("src", {"H100-80GB/vgpu"}, "100Gbit", 4), HostJ("b", {"H100-80GB/vgpu"}, "100Gbit", 4),
                      HostJ("c", {"H100-80GB/vgpu", "H100-80GB/vgpu"}, "100Gbit", 4)});
  J vms = J::array({VmJ("v1", "src", {0}, "vgpu:20GB", nullptr, "graphics", nullptr, false, Est(2000, 10000)),
                    VmJ("v2", "src", {0}, "vgpu:20GB", nullptr, "graphics", nullptr, false, Est(2000, 10000)),
                    VmJ("v3", "src", {0}, "vgpu:20GB", nullptr, "graphics")});
  for (int i = 1; i <= 3; ++i) vms.push_back(VmJ(fmt::format("c{}", i), "c", {0}, "vgpu:20GB", nullptr, "graphics"));
  vms.push_back(VmJ("c4", "c", {1}, "vgpu:40GB", nullptr, "graphics"));
  Plan p = PlanOf(Inv(hosts, vms), "src");
  ASSERT_TRUE(p.feasible) << p.reason;
  double on_src = 0;
  for (const auto& a : p.actions) {
    EXPECT_EQ(a.start_ms, 0) << a.vm;
    on_src += a.bandwidth_bytes_per_s;
  }
  EXPECT_LE(on_src, 12.5e9 * (1 + 1e-9));

  // Four estimate-less MIG VMs to two hosts, every limit 4: all start at 0.
  J mig = J::array({MigHost("src", 2, "100Gbit", 4), MigHost("x", 1, "100Gbit", 4), MigHost("y", 1, "100Gbit", 4)});
  J mvms = J::array({VmJ("s1", "src", {0}, "1g.10gb", 0), VmJ("s2", "src", {0}, "1g.10gb", 1),
                     VmJ("m", "src", {0}, "2g.20gb", 2), VmJ("big", "src", {1}, "3g.40gb", 0)});
  Plan q = PlanOf(Inv(mig, mvms), "src");
  ASSERT_TRUE(q.feasible) << q.reason;
  for (const auto& a : q.actions) EXPECT_EQ(a.start_ms, 0) << a.vm;
}

// A migration of `bytes` whose final round is `final_bytes` after a fixed 5 ms
// (bytes/s in, times in ms out), starting with `setup_ms` that moves nothing.
Job Transfer(uint32_t target, double bytes, double final_bytes, int64_t setup_ms = 0) {
  Job j;
  j.source = 0;
  j.target = target;
  j.max_stun_ms = 100'000;
  j.at = [=](double bw) {
    const double stun = 5 + final_bytes / bw * 1e3;
    return Timed{setup_ms + static_cast<int64_t>(std::ceil(bytes / bw * 1e3 + stun)),
                 static_cast<int64_t>(std::ceil(stun)), final_bytes, 5, setup_ms};
  };
  return j;
}

// The stun is predicted at the share the final round gets, not the one the
// migration started with: a long migration whose partner has ended switches
// over with the whole link; a short one whose final round meets the long one's
// bulk gets half of it.
TEST(PlannerSchedule, EachStunIsPredictedAtItsFinalRoundsShare) {
  std::vector<HostLimit> hosts{{2, 1000}, {2, 1000}, {2, 1000}};
  std::vector<Job> jobs{Transfer(1, 8000, 100), Transfer(2, 2000, 100)};
  ScheduleResult r = Schedule(jobs, hosts, {});
  const JobTiming& longer = r.pipelined.jobs[0];
  const JobTiming& shorter = r.pipelined.jobs[1];
  ASSERT_EQ(longer.start_ms, 0);
  ASSERT_EQ(shorter.start_ms, 0);
  EXPECT_DOUBLE_EQ(longer.bandwidth_bytes_per_s, 500);  // both started on half the source's link
  EXPECT_DOUBLE_EQ(longer.final_bandwidth_bytes_per_s, 1000);
  EXPECT_EQ(longer.final_shared_with, 0u);
  EXPECT_EQ(longer.t.stun_ms, 105);  // 5 ms + 100 B at 1000 B/s, not the 205 ms at its start share
  EXPECT_DOUBLE_EQ(shorter.final_bandwidth_bytes_per_s, 500);
  EXPECT_EQ(shorter.final_shared_with, 1u);
  EXPECT_EQ(shorter.t.stun_ms, 205);
}

// The engine judges its switchover at the share it has then (the link's present
// rate, below its rounds' average): a migration alone for most of its rounds
// whose final round would meet another's first bytes runs one more round, as
// the model at that share does, and switches over with that round's smaller
// final bytes; not with the bytes its average rate would have left.
TEST(PlannerSchedule, ASwitchoverJudgedAtALowerShareRunsTheRoundTheEngineWould) {
  std::vector<HostLimit> hosts{{2, 1000}, {2, 1000}, {2, 1000}};
  Job a = Transfer(1, 8000, 0);
  a.at = [](double bw) {  // at under 700 B/s the model runs one more round: a smaller final round
    const double fin = bw > 700 ? 400 : 100;
    const double stun = 5 + fin / bw * 1e3;
    return Timed{static_cast<int64_t>(std::ceil(8000 / bw * 1e3 + stun)), static_cast<int64_t>(std::ceil(stun)), fin,
                 5, 0};
  };
  std::vector<Job> jobs{a, Transfer(2, 8000, 100, 7000)};  // the second moves bytes from 7 s on
  ScheduleResult r = Schedule(jobs, hosts, {});
  const JobTiming& first = r.pipelined.jobs[0];
  EXPECT_DOUBLE_EQ(first.final_bandwidth_bytes_per_s, 500);
  EXPECT_EQ(first.t.stun_ms, 205) << "5 ms + 100 B at 500 B/s, not 400 B at it (805 ms)";
}

// A migration still starting (its processes, its handshakes) moves no bytes:
// another's final round beside it has the link to itself.
TEST(PlannerSchedule, AMigrationStillStartingTakesNoShareOfAFinalRound) {
  std::vector<HostLimit> hosts{{2, 1000}, {2, 1000}, {2, 1000}};
  std::vector<Job> jobs{Transfer(1, 8000, 100, 30'000), Transfer(2, 2000, 100)};
  ScheduleResult r = Schedule(jobs, hosts, {});
  EXPECT_DOUBLE_EQ(r.pipelined.jobs[1].final_bandwidth_bytes_per_s, 1000);
  EXPECT_EQ(r.pipelined.jobs[1].t.stun_ms, 105);
}

// Two migrations that may start at once start a start_gap apart (the
// controller sends one's requests, then the other's): the first switches over
// beside the second's last bytes, the second alone.
TEST(PlannerSchedule, TheControllerStartsOneMigrationAtATime) {
  std::vector<HostLimit> hosts{{2, 1000}, {2, 1000}, {2, 1000}};
  std::vector<Job> jobs{Transfer(1, 2000, 100), Transfer(2, 2000, 100)};
  for (Job& j : jobs) j.start_gap_ms = 100;
  ScheduleResult r = Schedule(jobs, hosts, {});
  const JobTiming& a = r.pipelined.jobs[0];
  const JobTiming& b = r.pipelined.jobs[1];
  EXPECT_EQ(a.start_ms, 0);
  EXPECT_EQ(b.start_ms, 100);
  EXPECT_EQ(a.final_shared_with, 1u);
  EXPECT_EQ(b.final_shared_with, 0u);
  EXPECT_LT(b.t.stun_ms, a.t.stun_ms);
}

// The source's slot frees when its migration's teardown (the target's receive
// finishing) begins: the controller starts the source's next one then.
TEST(PlannerSchedule, TheSourceStartsItsNextMigrationWhileTheTargetFinishes) {
  std::vector<HostLimit> hosts{{1, 1000}, {2, 1000}, {2, 1000}};
  auto with_teardown = [](Job j) {
    auto at = j.at;
    j.at = [at](double bw) {
      Timed t = at(bw);
      t.duration_ms += 700;
      t.teardown_ms = 700;
      return t;
    };
    return j;
  };
  std::vector<Job> jobs{with_teardown(Transfer(1, 2000, 100)), with_teardown(Transfer(2, 2000, 100))};
  ScheduleResult r = Schedule(jobs, hosts, {});
  const JobTiming& first = r.pipelined.jobs[0];
  const JobTiming& second = r.pipelined.jobs[1];
  EXPECT_EQ(first.start_ms, 0);
  EXPECT_EQ(second.start_ms, first.start_ms + first.t.duration_ms - 700);
}

// The policy's migration overhead (process starts, the controller's polls) is
// part of every migration's planned duration, not of its stun.
TEST(PlannerSchedule, EveryMigrationCarriesThePolicysOverhead) {
  J hosts = J::array({MigHost("gpu-a", 1), MigHost("gpu-b", 1)});
  J vms = J::array({VmJ("v", "gpu-a", {0}, "3g.40gb", 0, "inference", nullptr, false, Est(1000, 20000))});
  const PlannedAction bare = ActionOf(PlanOf(Inv(hosts, vms), "gpu-a"), "v");
  const PlannedAction with = ActionOf(
      PlanOf(Inv(hosts, vms, J::array(), {{"max_stun", "100s"}, {"migration_overhead", "1500ms"}}), "gpu-a"), "v");
  EXPECT_EQ(with.end_ms - with.start_ms, bare.end_ms - bare.start_ms + 1500);
  EXPECT_EQ(with.predicted_stun_ms, bare.predicted_stun_ms);
  // Without a policy key, 1.5 s (the default).
  J no_key = J::parse(Inv(hosts, vms).dump());
  no_key["policy"].erase("migration_overhead");
  auto parsed = ParseInventory(no_key.dump());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->policy.migration_overhead, std::chrono::milliseconds(1500));
}

}  // namespace
}  // namespace gpumigrate::planner::testing
