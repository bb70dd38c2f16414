#include "cli/evacuate_command.h"

#include <unistd.h>

#include <iostream>

#include <fmt/format.h>

#include "cli/plan_command.h"
#include "cli/plan_print.h"
#include "cli/print.h"
#include "gpumigrate/evacuation/evacuation.h"
#include "gpumigrate/evacuation/evacuation_events.h"
#include "gpumigrate/evacuation/evacuation_store.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

CLI::App* AddEvacuateCommand(CLI::App& app, EvacuateFlags& f) {
  auto* c = app.add_subcommand(
      "evacuate",
      "Evacuate one host through the hosts' agents: run a plan (--plan, or made now from --inventory and --host), "
      "journal every step in a state store, reserve each target slot, re-plan the VMs left when an action fails, "
      "and continue from the journal when started again with the same --id.");
  c->add_option("--inventory", f.inventory,
                "The fleet (docs/planner.md inventory; every host's \"agent\" ADDR:PORT): the VMs themselves are read "
                "from the agents")
      ->required();
  c->add_option("--host", f.host, "The host to evacuate")->required();
  c->add_option("--plan", f.plan, "A plan from `gpumigrate plan --json` (else one is made now and confirmed)");
  c->add_option("--store", f.store, "The state store: a directory on this machine (one controller or several here)");
  c->add_option("--etcd", f.etcd, "The state store: etcd at http://HOST:PORT (controllers on several machines)");
  c->add_option("--etcd-prefix", f.etcd_prefix, "Every key under this prefix")->capture_default_str();
  c->add_option("--id", f.id, "This evacuation's name in the store (default evacuate-HOST); the same --id continues it");
  c->add_option("--poll", f.poll, "How often to ask the agents how their jobs go")->capture_default_str();
  c->add_option("--agent-timeout", f.agent_timeout, "How long one request to an agent may take")->capture_default_str();
  c->add_option("--bandwidth", f.bandwidth, "Cap every migration's sending rate (emulate a slower link), e.g. 1Gbit");
  c->add_flag("--no-pace", f.no_pace,
              "Leave the division of a shared link to TCP (default: each migration is paced at the share of its "
              "links the plan gives it, re-paced as migrations start and end, so its stun is the one predicted)");
  c->add_option("--resume-window", f.resume_window,
                "How long each migration waits for a broken connection to come back before it rolls back (migrate's "
                "--resume-window; its default when not given)");
  c->add_flag("--dry-run", f.dry_run,
              "Only print the plan made from what the agents report now (with --json: docs/planner.md's plan JSON); "
              "exit 0 when it is feasible, 1 when not; nothing moves");
  c->add_flag("--batched", f.batched,
              "Run in fixed batches (each starts when the one before has ended) instead of starting each action as "
              "soon as capacity allows: the plan's batched_total_ms schedule, for comparison");
  c->add_flag("--yes", f.yes, "Do not ask for confirmation of a plan made now");
  c->add_flag("--allow-power-off", f.allow_power_off, "Let the plan power off VMs that cannot move (an operator does it)");
  c->add_flag("--json", f.json, "Print the outcome as one JSON object on stdout");
  c->add_option("--events", f.events,
                "Write every state change as one JSON object per line to FILE (appended to), or to stdout with -: "
                "plan, action-started, phase, paced, hook, outcome, done, each with \"v\": 1 (the schema: "
                "include/gpumigrate/evacuation/evacuation_events.h)");
  AddAgentTlsFlags(c, f.tls);
  return c;
}

namespace {

int Usage(const std::string& message) {
  Print(stderr, "gpumigrate evacuate: {}\n", message);
  return 2;
}

// The plan from what the agents report now; the error is printed.
Result<planner::Plan> PlanNow(Evacuation& e) {
  Result<planner::Plan> p = e.PlanNow();
  if (!p.ok()) Print(stderr, "gpumigrate evacuate: {}\n", p.status().message());
  return p;
}

// The plan to run: --plan's, or one made now and confirmed (unless --yes);
// nullopt with --yes (the controller plans). *rc is set when there is none to run.
std::optional<planner::Plan> PlanToRun(Evacuation& e, const EvacuateFlags& f, int* rc) {
  if (!f.plan.empty()) {
    std::string text, error;
    if (!ReadWholeFile(f.plan, &text, &error)) {
      *rc = Usage("--plan " + error);
      return std::nullopt;
    }
    auto p = planner::PlanFromJson(text, f.host);
    if (!p.ok()) *rc = Usage(fmt::format("{}: {}", f.plan, p.status().message()));
    return p.ok() ? std::optional<planner::Plan>(*p) : std::nullopt;
  }
  if (f.yes) return std::nullopt;
  // A plan made now is shown and confirmed first; nothing moves before.
  auto p = PlanNow(e);
  if (!p.ok()) {
    *rc = 2;
    return std::nullopt;
  }
  PrintPlan(f.events == "-" ? stderr : stdout, *p);
  if (!p->feasible) {
    Print(stderr, "gpumigrate evacuate: the plan is not feasible ({}); nothing was moved\n", p->reason);
    *rc = 1;
    return std::nullopt;
  }
  Print(stderr, "Evacuate {} as planned above? [y/N] ", f.host);
  std::string answer;
  if (!isatty(STDIN_FILENO) || !std::getline(std::cin, answer) || (answer != "y" && answer != "yes")) {
    Print(stderr, "\ngpumigrate evacuate: not confirmed (--yes confirms without asking); nothing was moved\n");
    *rc = 1;
    return std::nullopt;
  }
  return *p;
}

// The outcome table (stdout, or stderr when stdout holds JSON), and with --json the object.
void PrintSummary(const EvacuationSummary& s, const EvacuateFlags& f, const std::string& id) {
  FILE* table = f.json || f.events == "-" ? stderr : stdout;
  Print(table, "{:<14} {:<18} {:<8} {:<10} {:>10} {:>10}\n", "vm", "action", "target", "outcome", "pred. stun", "stun");
  agent::Json vms = agent::Json::array();
  for (const auto& o : s.vms) {
    Print(table, "{:<14} {:<18} {:<8} {:<10} {:>10} {:>10}\n", o.vm, o.action, o.target.empty() ? "-" : o.target,
          VmResultName(o.result),
          o.predicted_stun_ms >= 0 && o.action == "live-migrate" ? fmt::format("{} ms", o.predicted_stun_ms) : "-",
          o.measured_stun_ms >= 0 ? fmt::format("{:.1f} ms", o.measured_stun_ms) : "-");
    agent::Json v = {{"vm", o.vm}, {"action", o.action}, {"target", o.target}, {"outcome", VmResultName(o.result)},
                     {"detail", o.detail}};
    if (o.predicted_stun_ms >= 0) v["predicted_stun_ms"] = o.predicted_stun_ms;
    if (o.measured_stun_ms >= 0) v["stun_ms"] = o.measured_stun_ms;
    vms.push_back(v);
  }
  if (f.json) {
    agent::Json out = {{"evacuation", id}, {"host", f.host}, {"exit_code", s.exit_code}, {"vms", vms}};
    Print("{}\n", out.dump(-1, ' ', false, agent::Json::error_handler_t::replace));
  }
}

}  // namespace

int RunEvacuate(const EvacuateFlags& f, const std::atomic<bool>& cancel) {
  const std::string id = f.id.empty() ? "evacuate-" + f.host : f.id;
  if (!f.dry_run && f.store.empty() == f.etcd.empty()) {
    return Usage("name one state store: --store DIR or --etcd http://HOST:PORT");
  }
  if (f.events == "-" && f.json) return Usage("--events - and --json both want stdout: give --events a file");
  auto poll = ParseDuration(f.poll);
  auto at = ParseDuration(f.agent_timeout);
  if (!poll.ok() || !at.ok()) return Usage(std::string((!poll.ok() ? poll.status() : at.status()).message()));
  std::string text, error;
  if (!ReadWholeFile(f.inventory, &text, &error)) return Usage("--inventory " + error);
  EvacuationOptions o;
  o.id = id;
  o.host = f.host;
  o.poll = std::chrono::duration_cast<std::chrono::milliseconds>(*poll);
  o.agent_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*at);
  o.bandwidth = f.bandwidth;
  o.resume_window = f.resume_window;
  o.batched = f.batched;
  o.allow_power_off = f.allow_power_off;
  o.no_pace = f.no_pace;
  auto agents = agent::MakeTlsClient(f.tls);
  auto e = Evacuation::Open(text, o, *agents);
  if (!e.ok()) return Usage(fmt::format("{}: {}", f.inventory, e.status().message()));
  if (f.dry_run) {  // the plan from what the agents report now, and nothing else
    auto p = PlanNow(**e);
    if (!p.ok()) return 2;
    if (f.json) {
      Print("{}\n", planner::PlanToJson(*p));
    } else {
      PrintPlan(stdout, *p);
    }
    return p->feasible ? 0 : 1;
  }
  auto store = f.store.empty() ? OpenEtcdStore(f.etcd, f.etcd_prefix) : OpenFileStore(f.store);
  if (!store.ok()) return Usage("state store: " + std::string(store.status().message()));
  int rc = -1;
  std::optional<planner::Plan> given = PlanToRun(**e, f, &rc);
  if (rc >= 0) return rc;
  std::unique_ptr<EvacuationEvents> events;
  if (!f.events.empty()) {
    auto ev = EvacuationEvents::Open(f.events, id, f.host);
    if (!ev.ok()) return Usage(std::string(ev.status().message()));
    events = std::move(ev).value();
  }
  (*e)->OnLine([](const std::string& line) { Print(stderr, "gpumigrate evacuate: {}\n", line); });
  const EvacuationSummary s = (*e)->Run(given, **store, events.get(), cancel);
  if (s.exit_code == 2) return Usage(s.error);
  PrintSummary(s, f, id);
  return s.exit_code;
}

}  // namespace gpumigrate::cli
