#include "cli/net_commands.h"

#include <fstream>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/crash_hook.h"
#include "cli/estimate_command.h"
#include "cli/gnuplot.h"
#include "cli/migration_plot.h"
#include "cli/path_calibration.h"
#include "cli/net_flags.h"
#include "cli/print.h"
#include "engine/agent/phase_file.h"
#include "cli/progress.h"
#include "cli/report_print.h"
#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/estimator/path_calibration.h"
#include "gpumigrate/common/rate_file.h"
#include "gpumigrate/devices/open_device.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/units.h"
#include "engine/session/net_reconnect.h"
#include "transport/net/session_connect.h"

namespace gpumigrate::cli {

CLI::App* AddMigrateCommand(CLI::App& app, MigrateFlags& f) {
  auto* c = app.add_subcommand("migrate",
                               "Live-migrate a device to a `gpumigrate receive` on another host (or process) over TCP.");
  c->add_option("--device", f.device, "Device spec: sim:llm, sim:key=value,... (see `gpumigrate help demo`), proc:PID[,tracker=auto|pagemap-scan|sync-wp|hash] for a live process linked with libgpumigrate_shim, cuda:PID[,page=SIZE][,hash=auto|gpu|host] for the CUDA device memory such a process registered, or vfio:/dev/vfio/devices/vfioN[,/dev/vfio/devices/vfioM...] for the device(s) of one VM with VFIO migration v2, or shm:PATH[,page=SIZE] for a QEMU guest's device memory (with --qemu)")
      ->capture_default_str();
  c->add_option("--to", f.to, "The receiver's ADDR:PORT")->required();
  AddSourceFlags(c, f.src);
  c->add_option("--bandwidth-file", f.bandwidth_file,
                "Follow the rate cap this file holds (e.g. 12MB/s, 0 for none), re-read every 20 ms while the "
                "migration runs: the agent paces an evacuation's migrations at their shares of the link this way "
                "(overrides --bandwidth)");
  c->add_option("--phase-file", f.phase_file,
                "Keep the session's phase and progress in this file as they change ({\"phase\": \"round-start\", "
                "\"round\": 2, \"bytes_sent\": ..., \"bytes_per_s\": ...}, replaced whole): the agent reports "
                "them (status, /metrics), and an evacuation's controller paces by the phase");
  c->add_option("--warmup", f.warmup, "Let the workload run this long before migrating")->capture_default_str();
  c->add_option("--connect-timeout", f.connect_timeout, "How long to try reaching the receiver")->capture_default_str();
  c->add_flag("--dry-run", f.dry_run,
              "Probe: estimate first, then pre-copy to the receiver until the switchover decision and abort cleanly "
              "(the source never stops, the receiver discards); report measured vs predicted");
  c->add_option("--sample", f.sample, "With --dry-run: how long the estimator observes first")->capture_default_str();
  AddLivenessFlags(c, f.live);
  AddQemuSourceFlags(c, f.qemu);
  AddTlsFlags(c, f.tls);
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout");
  AddMigrationPlotFlag(c, f.plot);
  return c;
}

namespace {

// The report of a migration that never reached the receiver: the source never
// left RUNNING.
MigrationReport ConnectFailed(const Status& why) {
  MigrationReport r;
  r.outcome = Outcome::kAborted;
  r.status = why;
  r.failed_phase = {Step::kConnect};
  r.resolution = "the source is RUNNING; nothing was sent";
  return r;
}

void PrintMigrateReport(const MigrateFlags& f, const MigrationReport& r, const std::string& security,
                        QemuGuest* guest) {
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(ReportToJson(r));
    j["security"] = security;
    if (guest != nullptr) AddQemuToJson(*guest, j);
    Print("{}\n", j.dump());
  } else {
    PrintReport(stdout, "gpumigrate migrate", r);
    Print("  security:   {}\n", security);
    if (guest != nullptr) PrintQemuLines(*guest, stdout);
  }
}

}  // namespace

namespace {

// What `migrate` was asked, parsed and checked before anything moves.
struct MigrateSetup {
  std::optional<TlsConfig> tls;
  HostPort to;
  SourceOptions o;
  std::chrono::nanoseconds warmup{}, connect_timeout{};
  std::unique_ptr<RateFile> rate_file;  // --bandwidth-file
  std::string transport;                // "tls" or "insecure": the path calibration's key
  PathConfig path;
  std::optional<PathCalibration> stored_path;  // this path's calibration, when `estimate` stored one
  std::optional<EstimateOptions> probe;        // --dry-run: how the estimate it is judged against is made
};

// Every usage error of `migrate` (exit 2), before anything moves.
Result<MigrateSetup> ParseMigrate(const MigrateFlags& f, const std::atomic<bool>& cancel) {
  MigrateSetup m;
  GM_ASSIGN_OR_RETURN(m.tls, MakeTls(f.tls));
  GM_ASSIGN_OR_RETURN(m.to, ParseHostPort(f.to));
  GM_ASSIGN_OR_RETURN(m.o, MakeSourceOptions(f.src));
  if (!f.plot.empty()) GM_RETURN_IF_ERROR(CheckPlotTarget(f.plot));  // never a migration only to fail at its picture
  GM_ASSIGN_OR_RETURN(m.warmup, ParseDuration(f.warmup));
  GM_ASSIGN_OR_RETURN(m.connect_timeout, ParseDuration(f.connect_timeout));
  GM_ASSIGN_OR_RETURN(LivenessLimits live, ParseLiveness(f.live));
  ApplyLiveness(live, m.o);
  m.o.cancel = &cancel;
  if (!f.bandwidth_file.empty()) {
    auto rf = RateFile::Open(f.bandwidth_file);
    if (!rf.ok()) return rf.status().WithContext("--bandwidth-file");
    m.rate_file = std::move(*rf);
    // The pace replaces the cap from the first frame on; the codec choice and
    // the path calibration's key stay those of --bandwidth (the path `estimate`
    // calibrated), since a share changes while the migration runs.
    m.o.bandwidth_now = m.rate_file->rate();
  }
  m.o.dry_run = f.dry_run;
  if (f.dry_run) {
    GM_ASSIGN_OR_RETURN(m.probe, ProbeEstimateOptions(f.src, f.sample));
  }
  // The switchover rule's fixed cost: this path's, as `estimate` measured it
  // between two processes, else the in-process calibration's.
  m.transport = m.tls ? "tls" : "insecure";
  m.path = PathConfigFor(m.transport, f.src.streams, m.o.codec, m.o.bandwidth_limit_bytes_per_s, f.device);
  m.stored_path = StoredPathFor(m.path);
  m.o.switchover_fixed_cost = SwitchoverFixedCostFor(m.stored_path, m.o.switchover_fixed_cost);
  GM_RETURN_IF_ERROR(CheckQemuUse(f.qemu, f.device, true));
  if (f.dry_run && !f.qemu.qmp.empty()) {
    return InvalidArgument("--dry-run with --qemu would start QEMU's own migration, which pauses the guest and ends "
                           "the destination QEMU: use `gpumigrate estimate --qemu` to predict without moving anything");
  }
  return m;
}

// --dry-run: the estimate the probe is judged against, made before it moves
// anything; nullopt (the error printed) when it cannot be made.
std::optional<EstimateReport> ProbeEstimate(const MigrateFlags& f, MigrateSetup& m, Device& src) {
  if (Status st = AttachPathCalibration(m.transport, f.src.streams, f.device, *m.probe, PathPrograms("migrate"));
      !st.ok()) {
    Print(stderr, "gpumigrate migrate: {}\n", st.message());
    return std::nullopt;
  }
  auto er = EstimateForProbe(src, *m.probe, m.o, SystemClock());
  if (!er.ok()) {
    Print(stderr, "gpumigrate migrate: {}\n", er.status().message());
    return std::nullopt;
  }
  return std::move(er).value();
}

// Progress to the terminal, the plot's trace and the agent's phase file.
void WireProgress(const MigrateFlags& f, SourceOptions& o, ProgressPrinter& progress, ProgressTrace& trace,
                  std::optional<agent::PhaseFile>& phase_file) {
  if (!f.phase_file.empty()) phase_file.emplace(f.phase_file);
  o.on_progress = [&progress, &trace, &phase_file](const Progress& p) {
    progress.Update(p);
    trace.Add(p);
    if (phase_file) phase_file->OnProgress(p);
  };
  std::function<void(Phase, uint32_t)> on_phase;
  if (phase_file) on_phase = [&phase_file](Phase p, uint32_t round) { phase_file->OnPhase(p, round); };
  o.on_phase = WithCrashHook(on_phase);
}

// What a completed migration measured against its path's calibration joins the
// host's record the estimator's ranges are drawn from (path_spread.h): one at a
// steady cap, without QEMU's own stop in its stun, on a path calibrated for its
// own backend.
void RecordRun(const MigrateFlags& f, const MigrateSetup& m, const MigrationReport& r, const QemuGuest* guest) {
  if (!m.stored_path || m.stored_path->config.Key() != m.path.Key() || r.outcome != Outcome::kCompleted ||
      f.dry_run || guest != nullptr || m.rate_file) {
    return;
  }
  if (Status s = RecordAgainstPath(*m.stored_path, r); !s.ok()) {
    Print(stderr, "gpumigrate migrate: recording the run against its path calibration: {}\n", s.message());
  }
}

// The report (or the probe's, beside its estimate) and the plot; the exit code.
int FinishMigrate(const MigrateFlags& f, const MigrationReport& r, const std::string& security, QemuGuest* guest,
                  const std::optional<EstimateReport>& estimate, const ProgressTrace& trace) {
  const std::string title = fmt::format("gpumigrate migrate{} to {}: {}", f.dry_run ? " --dry-run" : "", f.to,
                                        f.device);
  if (!estimate) {
    PrintMigrateReport(f, r, security, guest);
    DrawMigrationPlot(f.plot, r, trace, title);
    return ExitCodeFor(r);
  }
  if (f.json) {
    Print("{}\n", ProbeReportToJson(r, *estimate));
  } else {
    PrintProbe(stdout, "gpumigrate migrate", r, *estimate);
  }
  DrawMigrationPlot(f.plot, r, trace, title);
  return r.status.ok() ? 0 : ExitCodeFor(r);
}

}  // namespace

int RunMigrate(const MigrateFlags& f, const std::atomic<bool>& cancel) {
  auto setup = ParseMigrate(f, cancel);
  if (!setup.ok()) return NetUsage("migrate", setup.status());
  MigrateSetup& m = *setup;
  SourceOptions& o = m.o;
  const TlsConfig* tls = m.tls ? &*m.tls : nullptr;
  auto opened = OpenDevice(f.device, true);
  if (!opened.ok()) return NetUsage("migrate", opened.status());
  ProgressPrinter progress(stderr);
  QemuGuest* guest = nullptr;
  if (Status q = AttachQemu(f.qemu, *opened, true, &o, &progress, &guest); !q.ok()) return NetUsage("migrate", q);
  Device* src = opened->device.get();
  progress.Note(fmt::format("source: {}, workload running", src->Describe()));
  if (opened->proc != nullptr) {
    progress.Note(fmt::format("dirty tracking: {} ({})", opened->proc->TrackerName(), opened->proc->TrackerReason()));
  }
  std::this_thread::sleep_for(m.warmup);
  std::optional<EstimateReport> estimate;
  if (f.dry_run && !(estimate = ProbeEstimate(f, m, *src))) return 1;
  // The receiver may still be starting: refused connections are retried until the timeout.
  auto ns = ConnectSession(m.to, f.src.streams, std::chrono::duration_cast<std::chrono::milliseconds>(m.connect_timeout),
                           tls);
  if (!ns.ok()) {
    Print(stderr, "gpumigrate migrate: {} (the source keeps running)\n", ns.status().message());
    if (f.json) Print("{}\n", ReportToJson(ConnectFailed(ns.status())));
    return 1;
  }
  progress.Note(fmt::format("connected to {} with {} data stream{}: {}", f.to, f.src.streams,
                            f.src.streams == 1 ? "" : "s", ns->security));
  o.session_id = ns->session_id;
  o.aes_key = ns->aes_key;
  ProgressTrace trace;
  std::optional<agent::PhaseFile> phase_file;
  WireProgress(f, o, progress, trace, phase_file);
  if (guest != nullptr) guest->WireInto(o);
  std::vector<NetSession> links;
  links.push_back(std::move(ns).value());
  if (o.resume_window > std::chrono::nanoseconds(0)) {
    o.reconnect = SourceReconnect(m.to, f.src.streams, tls, links,
                                  [&progress](const std::string& line) { progress.Note(line); });
  }
  const std::string security = links.front().security;
  MigrationReport r = RunSource(*src, links.front().View(), o);
  progress.Finish();
  if (!r.source_cleanup.ok()) {
    Print(stderr, "gpumigrate migrate: after the migration: {}\n", r.source_cleanup.message());
  } else if (opened->proc != nullptr && r.outcome == Outcome::kCompleted) {
    progress.Note(fmt::format("source process {} released: it was told that it moved", opened->proc->pid()));
  }
  RecordRun(f, m, r, guest);
  return FinishMigrate(f, r, security, guest, estimate, trace);
}

}  // namespace gpumigrate::cli
