// PlanToJson: docs/planner.md's plan format. Keys beyond it are additions (the format
// is extended only by adding keys); integers for every time, so the output is
// byte-for-byte deterministic.
#include <nlohmann/json.hpp>

#include "gpumigrate/planner.h"

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

}  // namespace gpumigrate::planner
