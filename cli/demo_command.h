// `gpumigrate demo`: a whole live migration of a simulated LLM-inference GPU VM
// inside this process, with progress and a report.
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/source_flags.h"

namespace gpumigrate::cli {

struct DemoFlags {
  std::string device = "sim:llm";
  SourceFlags src;
  std::string warmup = "500ms";
  std::string run_after = "500ms";
  bool json = false;
  bool dry_run = false;
  std::string if_not_converging = "abort";
  std::string sample = "1s";
  std::string transport = "tls";
  std::string codec = "none";  // --dry-run: how long the estimator observes first
  std::string plot;             // --plot FILE.png
};

// Registers the subcommand; `flags` must outlive the app.
CLI::App* AddDemoCommand(CLI::App& app, DemoFlags& flags);
int RunDemo(const DemoFlags& flags, const std::atomic<bool>& cancel);

}  // namespace gpumigrate::cli
