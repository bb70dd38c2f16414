// PlanToJson: docs/planner.md's plan format. Keys beyond it are additions (the format
// is extended only by adding keys); integers for every time, so the output is
// byte-for-byte deterministic. PlanFromJson reads it back (`evacuate --plan`).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/planner/planner.h"

namespace gpumigrate::planner {

std::string PlanToJson(const Plan& p) {
  using J = nlohmann::ordered_json;
  J actions = J::array();
  for (const PlannedAction& a : p.actions) {
    J to = nullptr;
    if (a.to) {
      to = {{"host", a.to->host},
            {"gpus", a.to->gpus},
            {"placement", a.to->placement ? J(*a.to->placement) : J(nullptr)}};
    }
    J x = {{"vm", a.vm},
           {"action", std::string(ActionName(a.action))},
           {"to", to},
           {"predicted_stun_ms", a.predicted_stun_ms},
           {"start_ms", a.start_ms},
           {"end_ms", a.end_ms},
           {"reason", a.reason}};
    if (a.action == Action::kLiveMigrate) {
      x["bandwidth_bytes_per_s"] = static_cast<int64_t>(a.bandwidth_bytes_per_s);
      x["link_shared_with"] = a.link_shared_with;
      x["final_bandwidth_bytes_per_s"] = static_cast<int64_t>(a.final_bandwidth_bytes_per_s);
      x["final_shared_with"] = a.final_shared_with;
      x["link_alone"] = a.link_alone;
      x["stun_basis"] = a.stun_basis;
      x["budget_ms"] = a.budget_ms;
    }
    actions.push_back(std::move(x));
  }
  J j = {{"version", 1},
         {"host", p.host},
         {"feasible", p.feasible},
         {"reason", p.reason},
         {"total_ms", p.total_ms},
         {"batched_total_ms", p.batched_total_ms},
         {"actions", actions},
         {"schedule", p.used_batched ? "batched" : "pipelined"},
         {"placement_search", {{"exact", p.search_exact}, {"evaluations", p.search_evaluations}}}};
  return j.dump(2);
}

Result<Plan> PlanFromJson(std::string_view text, const std::string& host) {
  using J = nlohmann::ordered_json;
  J j = J::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("the plan is not a JSON object");
  try {
    Plan p;
    p.host = j.at("host").get<std::string>();
    if (p.host != host) return InvalidArgument(fmt::format("the plan evacuates {}, not --host {}", p.host, host));
    p.feasible = j.at("feasible").get<bool>();
    p.reason = j.value("reason", "");
    p.total_ms = j.value("total_ms", int64_t{0});
    p.batched_total_ms = j.value("batched_total_ms", int64_t{0});
    size_t i = 0;
    for (const auto& a : j.at("actions")) {
      PlannedAction pa;
      pa.vm = a.at("vm").get<std::string>();
      const std::string name = a.at("action").get<std::string>();
      bool known = false;
      for (auto kind : {Action::kLiveMigrate, Action::kDrainAndReplace, Action::kPowerOff,
                        Action::kBlocked}) {
        if (ActionName(kind) == name) {
          pa.action = kind;
          known = true;
        }
      }
      if (!known) return InvalidArgument(fmt::format("actions[{}].action: unknown action '{}'", i, name));
      if (a.contains("to") && !a["to"].is_null()) {
        Target t;
        t.host = a["to"].at("host").get<std::string>();
        t.gpus = a["to"].at("gpus").get<std::vector<uint32_t>>();
        if (a["to"].contains("placement") && !a["to"]["placement"].is_null()) t.placement = a["to"]["placement"].get<uint32_t>();
        pa.to = t;
      } else if (pa.action == Action::kLiveMigrate || pa.action == Action::kDrainAndReplace) {
        return InvalidArgument(fmt::format("actions[{}].to: missing for {}", i, name));
      }
      pa.predicted_stun_ms = a.value("predicted_stun_ms", int64_t{0});
      pa.start_ms = a.value("start_ms", int64_t{0});
      pa.end_ms = a.value("end_ms", int64_t{0});
      pa.reason = a.value("reason", "");
      pa.link_alone = a.value("link_alone", false);
      pa.bandwidth_bytes_per_s = a.value("bandwidth_bytes_per_s", 0.0);
      pa.budget_ms = a.value("budget_ms", int64_t{0});
      p.actions.push_back(pa);
      ++i;
    }
    return p;
  } catch (const J::exception& e) {
    return InvalidArgument(fmt::format("the plan has a missing key or one of the wrong type: {}", e.what()));
  }
}

}  // namespace gpumigrate::planner
