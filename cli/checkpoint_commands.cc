#include "cli/checkpoint_commands.h"

#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/crash_hook.h"
#include "cli/print.h"
#include "cli/progress.h"
#include "cli/report_print.h"
#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/checkpoint/checkpoint.h"
#include "gpumigrate/devices/open_device.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {
namespace {

int Usage(const char* cmd, const Status& s) {
  Print(stderr, "gpumigrate {}: {}\n", cmd, s.message());
  return 2;
}

// A file refused (damaged, wrong chain) is exit 1; a wrong or missing key, a
// missing file or a device that does not fit is a configuration error, exit 2.
int FileError(const char* cmd, const Status& s) {
  Print(stderr, "gpumigrate {}: {}\n", cmd, s.message());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

// Progress of a verify or restore pass on stderr: a redrawn line on a
// terminal, else a line at most every 2 seconds and at the end of each pass.
std::function<void(std::string_view, uint64_t, uint64_t)> FileProgress(const char* cmd) {
  struct State {
    std::chrono::steady_clock::time_point last{};
    bool tty = isatty(STDERR_FILENO) != 0;
  };
  auto st = std::make_shared<State>();
  return [st, cmd](std::string_view pass, uint64_t done, uint64_t total) {
    const auto now = std::chrono::steady_clock::now();
    const bool end = done >= total;
    if (!end && !st->tty && now - st->last < std::chrono::seconds(2)) return;
    st->last = now;
    const double pct = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
    Print(stderr, "{}{}: {} {:5.1f}% of {}{}", st->tty ? "\r" : "", cmd, pass, pct,
               FormatBytes(static_cast<double>(total)), st->tty && !end ? "" : "\n");
  };
}

Result<std::optional<FileKey>> LoadKey(const std::string& path) {
  if (path.empty()) return std::optional<FileKey>();
  GM_ASSIGN_OR_RETURN(FileKey k, ReadKeyFile(path));
  return std::optional<FileKey>(k);
}

void PrintInfo(const CheckpointInfo& info) {
  Print("checkpoint {}: format {}.{}, {}, {}\n", info.path, info.version_major, info.version_minor,
             FormatBytes(static_cast<double>(info.file_bytes)),
             info.encrypted ? "encrypted (AES-256-GCM)" : "not encrypted (integrity tags only)");
  if (!info.manifest_read) {
    Print("  manifest:   sealed; give --key-file to read it\n");
    return;
  }
  Print("  device:     {}\n", info.device);
  for (const auto& r : info.regions) {
    Print("  region:     {} ({}, {}-byte pages, {})\n", r.name, FormatBytes(static_cast<double>(r.size_bytes)),
               r.page_size, RegionHintName(r.hint));
  }
  Print("  taken:      {}, source then {}\n", info.live ? "live (pre-copied while running)" : "stop-and-copy",
             info.source_fate);
  if (!info.base.empty()) Print("  base:       {} (file {:016x})\n", info.base, info.base_file_id);
  if (!info.content_store.empty()) {
    Print("  content:    pages left to the content store {} (restore --content-store)\n", info.content_store);
  }
  if (info.verified) {
    Print("  verified:   {} records, {} frames, final round {}, device state {} bytes; every tag, digest and "
               "the device state checked\n",
               info.records, info.frames, info.final_round, info.device_state_bytes);
    if (info.chain.size() > 1) Print("  chain:      {}\n", fmt::join(info.chain, " <- "));
  }
}

int RunVerifyOrInfo(const CheckpointFlags& f, bool verify) {
  const char* cmd = verify ? "checkpoint verify" : "checkpoint info";
  auto key = LoadKey(f.key_file);
  if (!key.ok()) return Usage(cmd, key.status());
  Result<CheckpointInfo> info = InvalidArgument("unreached");
  if (verify) {
    RestoreOptions o;
    o.key = *key;
    o.base_paths = f.base_paths;
    o.session.content_store_dir = f.content_store;
    o.on_progress = FileProgress("checkpoint verify");
    info = VerifyCheckpoint(f.file, o);
  } else {
    info = ReadCheckpointInfo(f.file, *key);
  }
  if (!info.ok()) {
    if (f.json) {
      nlohmann::ordered_json j;
      j["path"] = f.file;
      j["verified"] = false;
      j["error"] = info.status().message();
      Print("{}\n", j.dump());
    }
    return FileError(cmd, info.status());
  }
  if (f.json) {
    Print("{}\n", CheckpointInfoToJson(*info));
  } else {
    PrintInfo(*info);
  }
  return 0;
}

}  // namespace

CLI::App* AddCheckpointCommand(CLI::App& app, CheckpointFlags& f) {
  auto* c = app.add_subcommand(
      "checkpoint",
      "Write a device's state to a file, live by default (pre-copy rounds while it runs, a short stun for the final "
      "delta); `checkpoint verify FILE` checks a file, `checkpoint info FILE` prints its manifest.");
  c->require_subcommand(0, 1);
  c->add_option("--device", f.device, "Device spec: sim:llm, sim:key=value,..., proc:PID or cuda:PID (see `gpumigrate help migrate`)")
      ->capture_default_str();
  c->add_option("--to", f.to, "The checkpoint file to write (written as FILE.partial, renamed when complete)");
  AddSourceFlags(c, f.src, false);
  c->add_flag("--stop-first", f.stop_first, "Stop the device first and copy everything during the stun (no pre-copy)");
  c->add_option("--then", f.then,
                "What becomes of the device afterwards: resume (runs on), stop (stays stopped, intact), release "
                "(stays stopped and is released, as after a migration)")
      ->check(CLI::IsMember({"resume", "stop", "release"}))
      ->capture_default_str();
  c->add_option("--key-file", f.key_file, "Encrypt at rest with this 32-byte key (openssl rand 32 > KEY)");
  c->add_option("--base", f.base, "Incremental: write only the pages that differ from this earlier checkpoint");
  c->add_option("--content-store", f.content_store,
                "A content store this host keeps (see `gpumigrate content-store`): pre-copy pages it holds are recorded as "
                "their SHA-256, not their bytes; restore and verify then need the same store (--content-store)");
  c->add_option("--warmup", f.warmup, "Let the workload run this long first")->capture_default_str();
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout");

  f.verify_cmd = c->add_subcommand("verify", "Check every record, frame, digest and the chain of a checkpoint, "
                                             "without a device");
  f.verify_cmd->add_option("file", f.file, "The checkpoint file")->required();
  f.verify_cmd->add_option("--key-file", f.key_file, "Its key, when encrypted");
  f.verify_cmd->add_option("--base-path", f.base_paths,
                           "Where its base is (repeat for deeper bases, nearest first); default: the recorded path");
  f.verify_cmd->add_option("--content-store", f.content_store,
                           "The content store the file left pages to (checkpoint --content-store)");
  f.verify_cmd->add_flag("--json", f.json, "Print one JSON object on stdout");
  f.info_cmd = c->add_subcommand("info", "Print a checkpoint's header and manifest (reads nothing else)");
  f.info_cmd->add_option("file", f.file, "The checkpoint file")->required();
  f.info_cmd->add_option("--key-file", f.key_file, "Its key, when encrypted (the manifest is sealed)");
  f.info_cmd->add_flag("--json", f.json, "Print one JSON object on stdout");
  return c;
}

CLI::App* AddRestoreCommand(CLI::App& app, RestoreFlags& f) {
  auto* c = app.add_subcommand("restore",
                               "Restore a checkpoint onto a device of the same geometry; it runs only once every "
                               "digest matched. The file (and its bases) are verified first: a damaged one never "
                               "reaches the device.");
  c->add_option("--from", f.from, "The checkpoint file")->required();
  c->add_option("--device", f.device,
                "Destination device spec (sim:..., or proc:PID / cuda:PID: a process waiting in adopt mode)")
      ->capture_default_str();
  c->add_option("--key-file", f.key_file, "Its key, when encrypted");
  c->add_option("--base-path", f.base_paths,
                "Where its base is (repeat for deeper bases, nearest first); default: the recorded path");
  c->add_option("--content-store", f.content_store,
                "The content store the file left pages to (checkpoint --content-store): they are filled from it, "
                "each checked against its SHA-256")
      ->check(CLI::ExistingDirectory);
  c->add_option("--run-after", f.run_after,
                "sim: let the restored workload run this long, then pause it and self-check its memory")
      ->capture_default_str();
  c->add_option("--threads", f.threads,
                "Threads that open, decompress and write the file's frames beside each recorded stream's reading "
                "thread, as receive --threads (default: the cores those threads leave, at most 8)")
      ->check(CLI::Range(0, 64));
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout");
  return c;
}

int RunCheckpoint(CheckpointFlags& f, const std::atomic<bool>& cancel) {
  if (*f.verify_cmd) return RunVerifyOrInfo(f, true);
  if (*f.info_cmd) return RunVerifyOrInfo(f, false);
  if (f.to.empty()) return Usage("checkpoint", InvalidArgument("--to FILE is required"));
  auto opts = MakeSourceOptions(f.src);
  if (!opts.ok()) return Usage("checkpoint", opts.status());
  auto warmup = ParseDuration(f.warmup);
  if (!warmup.ok()) return Usage("checkpoint", warmup.status());
  auto key = LoadKey(f.key_file);
  if (!key.ok()) return Usage("checkpoint", key.status());
  CheckpointOptions co;
  co.session = *opts;
  co.session.cancel = &cancel;
  co.session.switchover_fixed_cost = StoredFixedCost(co.session.switchover_fixed_cost);
  co.stop_first = f.stop_first;
  co.then = f.then == "stop" ? SourceFate::kStop : f.then == "release" ? SourceFate::kRelease : SourceFate::kResume;
  co.key = *key;
  co.base = f.base;
  co.content_store = f.content_store;
  auto opened = OpenDevice(f.device, true);
  if (!opened.ok()) return Usage("checkpoint", opened.status());
  Device* dev = opened->device.get();
  ProgressPrinter progress(stderr);
  progress.Note(fmt::format("source: {}, workload running; writing {}{}", dev->Describe(), f.to,
                            f.base.empty() ? "" : fmt::format(" over base {}", f.base)));
  std::this_thread::sleep_for(*warmup);
  co.session.on_progress = [&](const Progress& p) { progress.Update(p); };
  co.session.on_phase = WithCrashHook(nullptr);
  CheckpointReport r = WriteCheckpoint(*dev, f.to, co);
  progress.Finish();
  const MigrationReport& m = r.migration;
  if (!m.source_cleanup.ok()) Print(stderr, "gpumigrate checkpoint: afterwards: {}\n", m.source_cleanup.message());
  if (f.json) {
    Print("{}\n", CheckpointReportToJson(r));
  } else {
    PrintReport(stdout, "gpumigrate checkpoint", m);
    if (m.outcome == Outcome::kCompleted) {
      Print("  file:       {}: {}, {} records, {}{}\n", r.path, FormatBytes(static_cast<double>(r.file_bytes)),
                 r.records, r.encrypted ? "encrypted" : "not encrypted",
                 r.base.empty() ? "" : fmt::format(", incremental over {} (chain depth {})", r.base, r.chain_depth));
      if (!r.content_store.empty()) {
        Print("  store:      the pages filled are left to {}: restore and verify need it (--content-store)\n",
              r.content_store);
      }
      Print("  source:     {}\n", r.fate == "resume"    ? "running on"
                                       : r.fate == "stop" ? "stopped, state intact (gpumigrate resume to run it)"
                                                          : "stopped and released");
    }
  }
  if (m.outcome != Outcome::kCompleted && m.failed_phase.step == Step::kNone && m.rounds.empty() &&
      m.status.code() == StatusCode::kInvalidArgument) {
    return 2;  // nothing started: a bad base, key or path
  }
  return ExitCodeFor(m);
}

int RunRestore(const RestoreFlags& f, const std::atomic<bool>& cancel) {
  auto key = LoadKey(f.key_file);
  if (!key.ok()) return Usage("restore", key.status());
  auto run_after = ParseDuration(f.run_after);
  if (!run_after.ok()) return Usage("restore", run_after.status());
  auto opened = OpenDevice(f.device, false);
  if (!opened.ok()) return Usage("restore", opened.status());
  Device* dev = opened->device.get();
  Print(stderr, "restore: verifying {}, then restoring it onto {}\n", f.from, dev->Describe());
  RestoreOptions o;
  o.key = *key;
  o.base_paths = f.base_paths;
  o.session.content_store_dir = f.content_store;
  if (f.threads >= 0) o.session.workers = static_cast<uint32_t>(f.threads);
  o.session.cancel = &cancel;
  o.session.on_phase = WithCrashHook(nullptr);
  o.on_progress = FileProgress("restore");
  MigrationReport r = RestoreCheckpoint(f.from, *dev, o);
  int rc = r.outcome == Outcome::kCompleted ? 0 : (r.status.code() == StatusCode::kInvalidArgument ? 2 : ExitCodeFor(r));
  std::optional<SimResumeCheck> check;
  if (r.outcome == Outcome::kCompleted && opened->sim != nullptr) {
    check = RunResumeCheck(*opened->sim, *run_after, SystemClock());
    if (!check->ok()) rc = 1;
  }
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(ReportToJson(r));
    j["from"] = f.from;
    if (check) j["destination"] = nlohmann::ordered_json::parse(check->ToJson());
    Print("{}\n", j.dump());
  } else {
    Print("gpumigrate restore: {}{}\n", OutcomeName(r.outcome), r.verified ? ", verified" : "");
    if (!r.status.ok()) Print("  error:      {}\n", r.status.message());
    if (!r.resolution.empty()) Print("  resolution: {}\n", r.resolution);
    Print("  restored:   {} in {:.2f} s\n", FormatBytes(static_cast<double>(r.bytes_sent)), r.total_ms / 1e3);
    if (check) Print("{}\n", check->ToLine());
    if (r.outcome == Outcome::kCompleted && opened->proc != nullptr) {
      Print("  destination: process {} adopted the memory and runs on\n", opened->proc->pid());
    }
  }
  return rc;
}

}  // namespace gpumigrate::cli
