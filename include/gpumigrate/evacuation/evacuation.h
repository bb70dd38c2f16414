// The evacuation controller (issue 12; issue 41 moved it out of the CLI): carries
// out the evacuation of one host through the hosts' agents. A plan (given, or
// made from what the agents report now) is run in its order within each host's
// max_migrations; every step is journaled and every target slot reserved in the
// state store (evacuation_store.h), each live migration is paced at the share of
// its links the plan gave it, and the VMs left are planned again when an action
// fails or a link proves slower than the inventory said. A controller killed and
// opened again with the same id continues from the journal: a VM is never
// migrated twice, and one whose fate is unknown is held for an operator.
//
// Everything it learns goes out as lines (`on_line`: what `gpumigrate evacuate`
// prints) and as events (evacuation_events.h); what it ends with is an
// EvacuationSummary. The agents are reached through agent::Client, so the
// controller runs against in-process agents in tests and over mutual TLS in
// `gpumigrate evacuate`.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumigrate/agent/agent.h"
#include "gpumigrate/evacuation/evacuation_events.h"
#include "gpumigrate/evacuation/evacuation_store.h"
#include "gpumigrate/planner/planner.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct EvacuationOptions {
  std::string id;    // the evacuation's name in the store (the CLI's default: evacuate-HOST)
  std::string host;  // the host to evacuate
  std::chrono::milliseconds poll{100};              // how often the agents are asked how their jobs go
  std::chrono::milliseconds agent_timeout{20000};   // one request to an agent
  std::string bandwidth;      // cap on every migration's rate, as migrate's --bandwidth reads it ("": none)
  std::string resume_window;  // passed to every migrate ("": its default)
  bool batched = false;          // the plan's batched schedule: a batch starts once the one before has ended
  bool allow_power_off = false;  // the plan may power off VMs that cannot move
  bool no_pace = false;          // leave a shared link's division to TCP
};

// What became of one VM.
enum class VmResult {
  kCompleted,  // it runs at its target (or was replaced and drained, or powered off)
  kFailed,     // the action failed; the VM runs where it was
  kInDoubt,    // it failed after the point of no return, or nobody can say: an operator resolves it
  kBlocked,    // the plan found no way to move it
  kLeft,       // not tried (interrupted, no action, power-off left to an operator)
};
std::string_view VmResultName(VmResult r);  // "completed", "failed", "in-doubt", "blocked", "left"

struct EvacuationOutcome {
  std::string vm;
  std::string action;  // planner::ActionName, or "-" for a VM in no action
  std::string target;  // "" when there is none
  VmResult result = VmResult::kLeft;
  std::string detail;
  int64_t predicted_stun_ms = -1;  // -1: none
  double measured_stun_ms = -1;    // -1: none
  bool final = false;              // decided before the last re-plan: not tried again
};

struct EvacuationSummary {
  // 0: every VM left the host; 1: some could not (they run where they were), or
  // the plan is not feasible (nothing moved); 2: the evacuation could not run
  // (`error` says why: the store, the host's agent); 3: some VM is in doubt.
  int exit_code = 0;
  std::string error;
  std::vector<EvacuationOutcome> vms;
};

class Evacuation {
 public:
  // `inventory_text`: the fleet (docs/planner.md inventory, every host with its
  // "agent" ADDR:PORT); the VMs themselves are read from the agents. `agents`
  // outlives the Evacuation. InvalidArgument for an inventory the planner
  // refuses, a host without an agent, or options.host not in it.
  static Result<std::unique_ptr<Evacuation>> Open(const std::string& inventory_text, EvacuationOptions options,
                                                  agent::Client& agents);
  ~Evacuation();

  // Each line of what happens, as it happens (default: none).
  void OnLine(std::function<void(const std::string&)> on_line);

  // The plan from what the agents report now (an unreachable agent of the host
  // being evacuated is an error; one of a target makes that host no target).
  Result<planner::Plan> PlanNow();

  // Runs the evacuation: `given` when this id has no journal yet (else a plan
  // made now), to its end or until `cancel` (actions not started are left, those
  // under way followed to their end). `events` may be null.
  EvacuationSummary Run(std::optional<planner::Plan> given, EvacuationStore& store, EvacuationEvents* events,
                        const std::atomic<bool>& cancel);

 private:
  class Impl;
  explicit Evacuation(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpumigrate
