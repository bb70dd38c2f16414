// `gpumigrate checkpoint` (write; `checkpoint verify`, `checkpoint info`) and
// `gpumigrate restore`: device state to a file and back (gpumigrate/checkpoint/checkpoint.h).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/source_flags.h"

namespace gpumigrate::cli {

struct CheckpointFlags {
  std::string device = "sim:llm";
  std::string to;
  SourceFlags src;
  bool stop_first = false;
  std::string then = "resume";
  std::string key_file;
  std::string base;
  std::string content_store;  // checkpoint and checkpoint verify
  std::string warmup = "500ms";
  bool json = false;
  // checkpoint verify / info
  std::string file;
  std::vector<std::string> base_paths;
  CLI::App* verify_cmd = nullptr;
  CLI::App* info_cmd = nullptr;
};

struct RestoreFlags {
  std::string from;
  std::string device = "sim:llm";
  std::string key_file;
  std::string content_store;
  std::vector<std::string> base_paths;
  std::string run_after = "500ms";
  int threads = -1;  // --threads: the destination's workers; -1: DefaultDestinationWorkers
  bool json = false;
};

CLI::App* AddCheckpointCommand(CLI::App& app, CheckpointFlags& f);
CLI::App* AddRestoreCommand(CLI::App& app, RestoreFlags& f);
int RunCheckpoint(CheckpointFlags& f, const std::atomic<bool>& cancel);
int RunRestore(const RestoreFlags& f, const std::atomic<bool>& cancel);

}  // namespace gpumigrate::cli
