// `gpumigrate migrate` and `gpumigrate receive`: a migration between two
// processes (two hosts) over TCP. The control channel is TLS 1.3 (mutual
// certificates or an external PSK) and data frames are AES-256-GCM with keys
// from the TLS exporter; --insecure-no-tls turns all of that off, by name.
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/qemu_hook.h"
#include "cli/source_flags.h"

namespace gpumigrate::cli {

struct TlsFlags {
  std::string ca, cert, key, psk_file, psk_identity = "gpumigrate";
  bool insecure = false;
};

// How long a side waits on its peer (both commands; SourceOptions says how).
struct LivenessFlags {
  std::string peer_timeout = "60s";
  std::string peer_silence_timeout = "10s";
  std::string keepalive_interval = "1s";
  std::string resume_window = "60s";  // resumable pre-copy; 0: a broken connection ends the migration
};

struct MigrateFlags {
  std::string device = "sim:llm";
  std::string to;
  SourceFlags src;
  std::string warmup = "500ms";
  std::string connect_timeout = "30s";
  std::string sample = "1s";
  bool dry_run = false;
  LivenessFlags live;
  TlsFlags tls;
  QemuFlags qemu;
  bool json = false;
  std::string plot;  // --plot FILE.png
  std::string bandwidth_file;  // --bandwidth-file: a cap that changes while it runs
  std::string phase_file;      // --phase-file: the engine's phase, for the agent
};

struct ReceiveFlags {
  std::string device = "sim:llm";
  std::string listen;
  std::string accept_timeout = "300s";
  std::string port_file;
  std::string phase_file;  // --phase-file: the session's phase, for the agent
  std::string content_store;  // --content-store DIR: fill offered pages from these files
  std::string run_after = "500ms";
  std::string handshake_timeout = "10s";
  int threads = -1;  // --threads: the destination's workers; -1: DefaultDestinationWorkers
  LivenessFlags live;
  TlsFlags tls;
  QemuFlags qemu;
  bool json = false;
};

CLI::App* AddMigrateCommand(CLI::App& app, MigrateFlags& f);
CLI::App* AddReceiveCommand(CLI::App& app, ReceiveFlags& f);
int RunMigrate(const MigrateFlags& f, const std::atomic<bool>& cancel);
int RunReceive(const ReceiveFlags& f, const std::atomic<bool>& cancel);

}  // namespace gpumigrate::cli
