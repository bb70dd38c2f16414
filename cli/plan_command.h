// `gpumigrate plan`: read an inventory, plan the evacuation of one host, print
// the plan as a table and a timeline (or docs/planner.md's JSON with --json), and
// optionally draw the timeline with gnuplot. Exit 0: the host can be evacuated;
// 1: it cannot (the plan still prints, with each blocking reason); 2: the
// inventory is malformed or inconsistent (the message names the key path).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace gpumigrate::cli {

struct PlanFlags {
  std::string inventory;
  std::string evacuate;
  bool json = false;
  bool allow_power_off = false;
  std::string plot;
};

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags& flags);
int RunPlan(const PlanFlags& flags);

// Reads a whole file; errors name the path.
bool ReadWholeFile(const std::string& path, std::string* out, std::string* error);

}  // namespace gpumigrate::cli
