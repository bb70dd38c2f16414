// `gpumigrate migrate` and `gpumigrate receive`: a migration between two
// processes (two hosts) over TCP. TLS is not built yet, so both commands
// require --insecure-no-tls, whose name says what it is.
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/source_flags.h"

namespace gpumigrate::cli {

struct MigrateFlags {
  std::string device = "sim:llm";
  std::string to;
  SourceFlags src;
  std::string warmup = "500ms";
  std::string connect_timeout = "10s";
  std::string sample = "1s";
  bool dry_run = false;
  bool insecure = false;
  bool json = false;
};

struct ReceiveFlags {
  std::string device = "sim:llm";
  std::string listen;
  std::string accept_timeout = "300s";
  std::string port_file;
  std::string run_after = "500ms";
  bool insecure = false;
  bool json = false;
};

CLI::App* AddMigrateCommand(CLI::App& app, MigrateFlags& f);
CLI::App* AddReceiveCommand(CLI::App& app, ReceiveFlags& f);
int RunMigrate(const MigrateFlags& f, const std::atomic<bool>& cancel);
int RunReceive(const ReceiveFlags& f, const std::atomic<bool>& cancel);

}  // namespace gpumigrate::cli
