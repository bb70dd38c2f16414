// `gpumigrate estimate`: a dry run that only observes the device, then predicts
// rounds, total time and stun with ranges, and decides: live-migrate,
// drain-and-replace or cannot-converge.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/source_flags.h"
#include "gpumigrate/estimator.h"
#include "gpumigrate/status.h"

namespace gpumigrate::cli {

struct EstimateFlags {
  std::string device = "sim:llm";
  std::string link;
  std::string sample = "2s";
  std::string interval = "10ms";
  std::string downtime_target = "300ms";
  std::string max_stun = "100s";
  uint32_t max_rounds = 30;
  std::string project;  // "640GB" or "8x80GB"
  std::string project_dirty = "scale";
  std::string warmup = "500ms";
  std::string codec = "none";
  bool recalibrate = false;
  bool json = false;
};

CLI::App* AddEstimateCommand(CLI::App& app, EstimateFlags& flags);
int RunEstimate(const EstimateFlags& flags);

// Parses "640GB" or "8x80GB" (count x size).
Result<uint64_t> ParseProjectedSize(const std::string& text);
// Builds EstimateOptions from the flags shared with `demo --dry-run`.
Result<EstimateOptions> MakeEstimateOptions(const EstimateFlags& f);
// The estimate a probe (`--dry-run`) runs first: the migration's own options,
// observed for `sample`.
Result<EstimateOptions> ProbeEstimateOptions(const SourceFlags& src, const std::string& sample);
void PrintEstimate(FILE* out, const EstimateReport& r);

}  // namespace gpumigrate::cli
