#include "cli/plan_command.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include <fmt/format.h>

#include "cli/gnuplot.h"
#include "cli/plan_print.h"
#include "cli/print.h"
#include "gpumigrate/planner/planner.h"

namespace gpumigrate::cli {

bool ReadWholeFile(const std::string& path, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = fmt::format("{}: cannot be opened", path);
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags& f) {
  auto* c = app.add_subcommand(
      "plan",
      "Plan the evacuation of a host: for every VM on it decide live-migrate, drain-and-replace, power-off or "
      "blocked, place it on the other hosts (MIG slices, vGPU, passthrough) and schedule the whole evacuation. "
      "Exit 0: it can be evacuated; 1: it cannot (the plan says why); 2: the inventory is malformed.");
  c->add_option("--inventory", f.inventory, "Inventory JSON (format: docs/planner.md)")->required();
  c->add_option("--evacuate", f.evacuate, "The host to empty")->required();
  c->add_flag("--json", f.json, "Print the plan as one JSON object on stdout");
  c->add_flag("--allow-power-off", f.allow_power_off,
              "VMs that use Unified Virtual Memory may be powered off (as policy.allow_power_off)");
  c->add_option("--plot", f.plot, "Also draw the timeline to this PNG (needs gnuplot)");
  return c;
}

namespace {

int Plot(const planner::Plan& plan, const std::string& png) {
  if (Status s = RunGnuplot(PlanGnuplotScript(plan), png); !s.ok()) {
    Print(stderr, "gpumigrate plan: {}\n", s.message());
    return 2;
  }
  Print(stderr, "timeline drawn to {}\n", png);
  return 0;
}

}  // namespace

int RunPlan(const PlanFlags& f) {
  if (!f.plot.empty()) {
    if (Status s = CheckPlotTarget(f.plot); !s.ok()) {
      Print(stderr, "gpumigrate plan: {}\n", s.message());
      return 2;
    }
  }
  std::string text, error;
  if (!ReadWholeFile(f.inventory, &text, &error)) {
    Print(stderr, "gpumigrate plan: --inventory {}\n", error);
    return 2;
  }
  auto inv = planner::ParseInventory(text);
  if (!inv.ok()) {
    Print(stderr, "gpumigrate plan: {}: {}\n", f.inventory, inv.status().message());
    return 2;
  }
  planner::PlanOptions o;
  o.evacuate = f.evacuate;
  o.allow_power_off = f.allow_power_off;
  auto plan = planner::MakePlan(*inv, o);
  if (!plan.ok()) {
    Print(stderr, "gpumigrate plan: {}\n", plan.status().message());
    return 2;
  }
  if (f.json) {
    Print("{}\n", planner::PlanToJson(*plan));
  } else {
    PrintPlan(stdout, *plan);
  }
  if (!f.plot.empty()) {
    int rc = Plot(*plan, f.plot);
    if (rc != 0) return rc;
  }
  return plan->feasible ? 0 : 1;
}

}  // namespace gpumigrate::cli
