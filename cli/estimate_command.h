// `gpumigrate estimate`: a dry run that only observes the device, then predicts
// rounds, total time and stun with ranges, and decides: live-migrate,
// drain-and-replace or cannot-converge.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/source_flags.h"
#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::cli {

struct EstimateFlags {
  std::string device = "sim:llm";
  std::string link;
  std::string sample = "2s";
  std::string interval = "10ms";
  LimitFlags limits;
  std::string project;  // "640GB" or "8x80GB"
  std::string project_dirty = "scale";
  bool project_per_gpu = false;     // the measured device is one GPU
  std::string kv_rate_per_gpu;      // explicit workload: KV cache append rate per GPU
  double static_fraction = 0.7;     // explicit workload: never-written share per GPU
  bool project_table = false;
  std::string table_gpus = "1,2,4,8";
  std::string table_links = "25Gbit,100Gbit,400Gbit";
  std::string plot;                 // PNG of the prediction; with --project-table, SVG of the table
  std::string target;               // host profile file measured on the target
  uint32_t cores = 0;               // 0: the profile's
  uint32_t streams = 0;             // 0: the migration's default
  std::string nic, per_stream;
  uint32_t threads = 0;             // the source's workers (migrate --threads); 0: as migrate picks for --cores
  int destination_threads = -1;     // the destination's workers (receive --threads); -1: as receive picks
  std::string read_rate;            // one core's device read rate; "": memcpy
  bool shared_host = false;         // source and destination share the target's cores (loopback)
  std::string warmup = "500ms";
  std::string codec = "none";
  std::string transport = "tls";    // the path to calibrate: tls, insecure, in-process
  bool recalibrate = false;
  bool json = false;
  std::string qemu;                 // --qemu SRC.qmp: the VM whose device memory --device shm:PATH is
  std::string qemu_dirty_sample = "1s";
  std::string content_store_hint;   // "static", "static=0.9", "weights=1,kv_cache=0.1"
};

CLI::App* AddEstimateCommand(CLI::App& app, EstimateFlags& flags);
int RunEstimate(const EstimateFlags& flags);

// Parses "640GB" (1 x 640GB) or "8x80GB" (count x size per GPU).
struct ProjectedSize {
  uint32_t gpus = 1;
  uint64_t bytes_per_gpu = 0;
};
Result<ProjectedSize> ParseProjectedSize(const std::string& text);
// Builds EstimateOptions from the flags shared with `demo --dry-run`.
Result<EstimateOptions> MakeEstimateOptions(const EstimateFlags& f);
// The estimate a probe (`--dry-run`) runs first: the migration's own options,
// observed for `sample`.
Result<EstimateOptions> ProbeEstimateOptions(const SourceFlags& src, const std::string& sample);
void PrintEstimate(FILE* out, const EstimateReport& r);

}  // namespace gpumigrate::cli
