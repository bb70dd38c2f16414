// Planner benchmark: one JSON object per result on stdout.
//
//   plan_time   `MakePlan` for a host of 8 GPUs x 7 MIG instances (56 VMs) on
//               generated fleets of 10, 100 and 1,000 hosts of 8 MIG GPUs each,
//               about half full, the median of several runs; beside the limit
//               (interactive: 1 s at 1,000 hosts) and the inventory's parse time.
//   evacuation  the pipelined schedule's total against the batched one (the
//               peer, same actions) on generated fleets of 50 hosts with mixed
//               estimates, a source link as fast as the targets' or faster,
//               beside the floor (the bytes to move over the source's link).
//
//   planner [--seeds N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/planner/planner.h"

namespace {

using J = nlohmann::ordered_json;
using gpumigrate::planner::Action;

struct Mig {
  const char* name;
  int slices;
  std::vector<int> starts;
};
const std::vector<Mig> kMig = {{"1g.10gb", 1, {0, 1, 2, 3, 4, 5, 6}}, {"1g.20gb", 2, {0, 2, 4, 6}},
                               {"2g.20gb", 2, {0, 2, 4}},            {"3g.40gb", 4, {0, 4}},
                               {"4g.40gb", 4, {0}}};

J Host(const std::string& name, int gpus, const std::string& link, int max_migrations) {
  J g = J::array();
  for (int i = 0; i < gpus; ++i) g.push_back({{"index", i}, {"model", "H100-80GB"}, {"mode", "mig"}});
  return {{"name", name}, {"link", link}, {"max_migrations", max_migrations}, {"maintenance", false}, {"gpus", g}};
}

J Vm(const std::string& name, const std::string& host, int gpu, const char* profile, int start, double stun_ms,
     double total_ms) {
  return {{"name", name}, {"host", host}, {"gpus", {gpu}}, {"profile", profile}, {"placement", start},
          {"class", "inference"}, {"group", nullptr}, {"uvm", false},
          {"estimate", {{"link", "100Gbit"}, {"predicted_stun_ms", stun_ms}, {"predicted_total_ms", total_ms}}}};
}

// hosts[0] is evacuated: 8 GPUs of 7 instances each (six 1g.10gb and a 1g.20gb, or
// seven 1g.10gb). The others hold random instances on about half their slices.
J Fleet(int hosts, uint32_t seed, int max_migrations, const std::string& source_link = "100Gbit") {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  J hs = J::array(), vms = J::array();
  int id = 0;
  auto estimate = [&](double gb) {
    double stun = pick(500, 30000);
    double total = gb * 8 / 100 * 1000 * (1.0 + pick(0, 200) / 100.0) + stun;  // a copy at 100 Gbit, plus rounds
    return std::pair(stun, total);
  };
  for (int h = 0; h < hosts; ++h) {
    std::string name = fmt::format("host-{:04d}", h);
    hs.push_back(Host(name, 8, h == 0 ? source_link : h % 3 == 0 ? "100Gbit" : h % 3 == 1 ? "200Gbit" : "50Gbit",
                      h == 0 ? max_migrations : pick(1, 4)));
    for (int g = 0; g < 8; ++g) {
      if (h == 0) {
        bool twenty = g % 2 == 0;
        for (int s = 0; s < (twenty ? 6 : 7); ++s) {
          auto [stun, total] = estimate(10);
          vms.push_back(Vm(fmt::format("vm{}", id++), name, g, "1g.10gb", s, stun, total));
        }
        if (twenty) {
          auto [stun, total] = estimate(20);
          vms.push_back(Vm(fmt::format("vm{}", id++), name, g, "1g.20gb", 6, stun, total));
        }
        continue;
      }
      uint8_t used = 0;
      for (int t = 0; t < 4; ++t) {
        const Mig& m = kMig[pick(0, static_cast<int>(kMig.size()) - 1)];
        int s = m.starts[pick(0, static_cast<int>(m.starts.size()) - 1)];
        uint8_t mask = static_cast<uint8_t>(((1u << m.slices) - 1) << s);
        if (used & mask || __builtin_popcount(used | mask) > 4) continue;
        used |= mask;
        vms.push_back(Vm(fmt::format("vm{}", id++), name, g, m.name, s, 1000, 10000));
      }
    }
  }
  return {{"version", 1}, {"policy", {{"max_stun", "100s"}}}, {"hosts", hs}, {"groups", J::array()}, {"vms", vms}};
}

double Ms(std::chrono::steady_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

int main(int argc, char** argv) {
  int seeds = 5;
  if (argc == 3 && std::string(argv[1]) == "--seeds") seeds = std::max(1, std::atoi(argv[2]));

  for (int hosts : {10, 100, 1000}) {
    std::string text = Fleet(hosts, 1, 2).dump();
    std::vector<double> parse_ms, plan_ms;
    gpumigrate::planner::Plan plan;
    for (int run = 0; run < 5; ++run) {
      auto t0 = std::chrono::steady_clock::now();
      auto inv = gpumigrate::planner::ParseInventory(text);
      auto t1 = std::chrono::steady_clock::now();
      if (!inv.ok()) {
        fmt::print(stderr, "planner: generated inventory rejected: {}\n", inv.status().message());
        return 1;
      }
      gpumigrate::planner::PlanOptions o;
      o.evacuate = "host-0000";
      auto p = gpumigrate::planner::MakePlan(*inv, o);
      auto t2 = std::chrono::steady_clock::now();
      if (!p.ok()) return 1;
      plan = *p;
      parse_ms.push_back(Ms(t1 - t0));
      plan_ms.push_back(Ms(t2 - t1));
    }
    std::sort(parse_ms.begin(), parse_ms.end());
    std::sort(plan_ms.begin(), plan_ms.end());
    J r = {{"benchmark", "planner_plan_time"}, {"hosts", hosts}, {"gpus_per_host", 8}, {"vms_evacuated", plan.actions.size()},
           {"plan_ms", plan_ms[plan_ms.size() / 2]}, {"limit_ms", 1000}, {"parse_ms", parse_ms[parse_ms.size() / 2]},
           {"feasible", plan.feasible}, {"search_exact", plan.search_exact},
           {"search_evaluations", plan.search_evaluations}};
    fmt::print("{}\n", r.dump());
  }

  for (const char* source_link : {"100Gbit", "400Gbit"}) {
    for (int max_migrations : {2, 4, 8}) {
      double sum_total = 0, sum_batched = 0, sum_floor = 0;
      int feasible = 0;
      for (int seed = 1; seed <= seeds; ++seed) {
        auto inv = gpumigrate::planner::ParseInventory(Fleet(50, 100 + seed, max_migrations, source_link).dump());
        if (!inv.ok()) return 1;
        gpumigrate::planner::PlanOptions o;
        o.evacuate = "host-0000";
        auto p = gpumigrate::planner::MakePlan(*inv, o);
        if (!p.ok()) return 1;
        // Floor: the bytes every migration moves (its time at its bandwidth) over the
        // source's link, or the longest single migration at the whole link.
        double bytes = 0, longest_ms = 0;
        for (const auto& a : p->actions) {
          if (a.action != Action::kLiveMigrate) continue;
          double b = static_cast<double>(a.end_ms - a.start_ms) / 1e3 * a.bandwidth_bytes_per_s;
          bytes += b;
          longest_ms = std::max(longest_ms, b / inv->hosts[0].link_bytes_per_s * 1e3);
        }
        sum_total += p->total_ms;
        sum_batched += p->batched_total_ms;
        sum_floor += std::max(longest_ms, bytes / inv->hosts[0].link_bytes_per_s * 1e3);
        feasible += p->feasible;
      }
      J r = {{"benchmark", "planner_evacuation"}, {"hosts", 50}, {"vms_evacuated", 56},
             {"source_link", source_link}, {"target_links", "50/100/200Gbit"},
             {"source_max_migrations", max_migrations}, {"fleets", seeds}, {"feasible", feasible},
             {"pipelined_total_s", sum_total / seeds / 1e3}, {"batched_total_s", sum_batched / seeds / 1e3},
             {"floor_s", sum_floor / seeds / 1e3}, {"batched_over_pipelined", sum_batched / sum_total}};
      fmt::print("{}\n", r.dump());
    }
  }
  return 0;
}
