// Inventories for the planner's tests, written as docs/planner.md's JSON (the tests go
// through ParseInventory like every user does), and helpers to plan them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/planner/planner.h"

namespace gpumigrate::planner::testing {

using J = nlohmann::ordered_json;

// GPUs as "model/mode", e.g. {"H100-80GB/mig", "H100-80GB/vgpu"}; indices 0, 1, ...
inline J HostJ(const std::string& name, const std::vector<std::string>& gpus, const std::string& link = "100Gbit",
               int max_migrations = 2, bool maintenance = false) {
  J g = J::array();
  for (size_t i = 0; i < gpus.size(); ++i) {
    auto slash = gpus[i].find('/');
    g.push_back({{"index", i}, {"model", gpus[i].substr(0, slash)}, {"mode", gpus[i].substr(slash + 1)}});
  }
  return {{"name", name}, {"link", link}, {"max_migrations", max_migrations}, {"maintenance", maintenance},
          {"agent", fmt::format("{}:7070", name)}, {"gpus", g}};
}

inline J MigHost(const std::string& name, int gpus, const std::string& link = "100Gbit", int max_migrations = 2,
                 bool maintenance = false, const std::string& model = "H100-80GB") {
  return HostJ(name, std::vector<std::string>(gpus, model + "/mig"), link, max_migrations, maintenance);
}

inline J Est(double stun_ms, double total_ms, const std::string& link = "100Gbit") {
  return {{"link", link}, {"predicted_stun_ms", stun_ms}, {"predicted_total_ms", total_ms}};
}

inline J VmJ(const std::string& name, const std::string& host, std::vector<int> gpus, const std::string& profile,
             J placement, const std::string& cls = "inference", J group = nullptr, bool uvm = false,
             J estimate = nullptr) {
  J v = {{"name", name}, {"host", host}, {"gpus", gpus}, {"profile", profile}, {"placement", placement},
         {"class", cls}, {"group", group}, {"uvm", uvm}};
  if (!estimate.is_null()) v["estimate"] = estimate;
  return v;
}

// The fixtures' policy has no migration overhead, no start interval and links
// that carry their whole rate unless a test gives them, so their durations are
// the model's alone.
inline J Inv(J hosts, J vms, J groups = J::array(), J policy = {{"max_stun", "100s"}, {"allow_power_off", false}}) {
  if (!policy.contains("migration_overhead")) policy["migration_overhead"] = "0s";
  if (!policy.contains("start_interval")) policy["start_interval"] = "0s";
  if (!policy.contains("link_efficiency")) policy["link_efficiency"] = 1;
  return {{"version", 1}, {"policy", policy}, {"hosts", hosts}, {"groups", groups}, {"vms", vms}};
}

inline Plan PlanOf(const J& inv, const std::string& host, bool allow_power_off = false) {
  auto parsed = ParseInventory(inv.dump());
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  if (!parsed.ok()) return {};
  PlanOptions o;
  o.evacuate = host;
  o.allow_power_off = allow_power_off;
  auto plan = MakePlan(*parsed, o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return plan.ok() ? *plan : Plan{};
}

inline const PlannedAction& ActionOf(const Plan& p, const std::string& vm) {
  for (const auto& a : p.actions) {
    if (a.vm == vm) return a;
  }
  static PlannedAction none;
  ADD_FAILURE() << "no action for " << vm;
  return none;
}

}  // namespace gpumigrate::planner::testing
