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
#include "cli/print.h"
#include "cli/phase_file.h"
#include "cli/progress.h"
#include "cli/report_print.h"
#include "gpumigrate/calibration.h"
#include "gpumigrate/path_calibration.h"
#include "gpumigrate/rate_file.h"
#include "gpumigrate/open_device.h"
#include "gpumigrate/proc.h"
#include "gpumigrate/sim.h"
#include "gpumigrate/units.h"
#include "transport/net/session_connect.h"

namespace gpumigrate::cli {
namespace {

constexpr const char* kInsecureHelp =
    "Run the control channel and data unencrypted and unauthenticated (frames keep an integrity tag): only on a "
    "trusted network or for tests";

void AddTlsFlags(CLI::App* c, TlsFlags& f) {
  c->add_option("--tls-ca", f.ca, "CA certificate (PEM) that signs the peer's certificate (see scripts/make-test-certs)");
  c->add_option("--tls-cert", f.cert, "This side's certificate chain (PEM)");
  c->add_option("--tls-key", f.key, "This side's private key (PEM)");
  c->add_option("--psk-file", f.psk_file,
                "Instead of certificates: a file with a pre-shared key of at least 32 bytes as hex "
                "(openssl rand -hex 32), the same on both sides");
  c->add_option("--psk-identity", f.psk_identity, "The PSK's identity, the same on both sides")->capture_default_str();
  c->add_flag("--insecure-no-tls", f.insecure, kInsecureHelp);
}

// nullopt: insecure mode, asked for by name.
Result<std::optional<TlsConfig>> MakeTls(const TlsFlags& f) {
  bool any = !f.ca.empty() || !f.cert.empty() || !f.key.empty() || !f.psk_file.empty();
  if (f.insecure) {
    if (any) return InvalidArgument("--insecure-no-tls cannot be combined with TLS options");
    return std::optional<TlsConfig>();
  }
  TlsConfig cfg;
  cfg.ca_file = f.ca;
  cfg.cert_file = f.cert;
  cfg.key_file = f.key;
  cfg.psk_file = f.psk_file;
  cfg.psk_identity = f.psk_identity;
  if (!any) {
    return InvalidArgument(
        "TLS needs --tls-ca/--tls-cert/--tls-key (scripts/make-test-certs makes a test set) or --psk-file; "
        "--insecure-no-tls runs without it on a trusted network");
  }
  if (std::string p = cfg.Problem(); !p.empty()) return InvalidArgument(p);
  return std::optional<TlsConfig>(cfg);
}

int Usage(const char* cmd, const Status& s) {
  Print(stderr, "gpumigrate {}: {}\n", cmd, s.message());
  return 2;
}

void AddLivenessFlags(CLI::App* c, LivenessFlags& f) {
  c->add_option("--peer-timeout", f.peer_timeout,
                "Longest wait on the peer while it makes no progress (it keeps sending keepalives but gets no work "
                "done); a peer that gets work done is never cut off")
      ->capture_default_str();
  c->add_option("--peer-silence-timeout", f.peer_silence_timeout,
                "Fail when nothing, not even a keepalive, has come from the peer for this long, or a control write "
                "has been blocked this long: the peer or the link is down")
      ->capture_default_str();
  c->add_option("--keepalive-interval", f.keepalive_interval,
                "How often this side tells the peer it is alive (less than half the peer's silence timeout)")
      ->capture_default_str();
  c->add_option("--resume-window", f.resume_window,
                "When the connection breaks during pre-copy: how long to keep the session and try to carry it on "
                "over a new connection (the source reconnects, proving it is the same session; the destination "
                "waits) instead of starting again; 0 ends the migration at once (rolled back)")
      ->capture_default_str();
}

struct LivenessLimits {
  std::chrono::nanoseconds peer_timeout, silence, interval, resume_window;
};

Result<LivenessLimits> ParseLiveness(const LivenessFlags& f) {
  GM_ASSIGN_OR_RETURN(auto peer, ParseDuration(f.peer_timeout));
  GM_ASSIGN_OR_RETURN(auto silence, ParseDuration(f.peer_silence_timeout));
  GM_ASSIGN_OR_RETURN(auto interval, ParseDuration(f.keepalive_interval));
  GM_ASSIGN_OR_RETURN(auto window, ParseDuration(f.resume_window));
  LivenessLimits l{std::chrono::duration_cast<std::chrono::nanoseconds>(peer),
             std::chrono::duration_cast<std::chrono::nanoseconds>(silence),
             std::chrono::duration_cast<std::chrono::nanoseconds>(interval),
             std::chrono::duration_cast<std::chrono::nanoseconds>(window)};
  if (l.resume_window < std::chrono::nanoseconds(0)) return InvalidArgument("--resume-window must not be negative");
  if (l.peer_timeout <= std::chrono::nanoseconds(0) || l.interval <= std::chrono::nanoseconds(0)) {
    return InvalidArgument("--peer-timeout and --keepalive-interval must be positive");
  }
  if (l.silence < 2 * l.interval) {
    return InvalidArgument(fmt::format("--peer-silence-timeout {} must be at least twice --keepalive-interval {}: a "
                                       "live peer would be taken for dead",
                                       f.peer_silence_timeout, f.keepalive_interval));
  }
  return l;
}

template <typename Options>
void Apply(const LivenessLimits& l, Options& o) {
  o.peer_timeout = l.peer_timeout;
  o.peer_silence_timeout = l.silence;
  o.keepalive_interval = l.interval;
  o.resume_window = l.resume_window;
}

// Resumable pre-copy, source side: connections of one session (the first join
// and each resumption), kept alive until the session returns.
Reconnect SourceReconnect(const HostPort& to, uint32_t streams, const TlsConfig* tls,
                          std::vector<NetSession>& links, ProgressPrinter& progress) {
  return [&to, streams, tls, &links, &progress](std::chrono::nanoseconds window) -> Result<Reconnected> {
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + window;
    progress.Note(fmt::format("connection to the receiver lost: resuming the session (up to {:.0f} s)",
                              std::chrono::duration<double>(window).count()));
    // Since when every attempt was refused (a plain time point and a flag: g++
    // took an optional's value here for maybe-uninitialized).
    std::chrono::steady_clock::time_point refused_since{};
    bool refused = false;
    Status last = Unavailable("no attempt was made");
    int attempts = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      auto ns = ConnectSession(to, streams, std::min(left, std::chrono::milliseconds(5000)), tls, &links.front().resume);
      ++attempts;
      if (ns.ok()) {
        links.push_back(std::move(ns).value());
        progress.Note(fmt::format("resumed over a new connection after {:.1f} s ({} attempt{})",
                                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                                  attempts, attempts == 1 ? "" : "s"));
        return Reconnected{links.back().View(), links.back().aes_key};
      }
      last = ns.status();
      // The receiver refused this session: it no longer holds it. Trying again cannot help.
      if (last.code() == StatusCode::kFailedPrecondition) return last;
      // Nobody listens there any more: a receiver that is gone cannot resume either
      // (a short grace covers a listener that is briefly busy).
      if (last.message().find("refused") != std::string::npos) {
        const auto now = std::chrono::steady_clock::now();
        if (!refused) refused_since = now;
        refused = true;
        if (now - refused_since > std::chrono::seconds(3)) {
          return Unavailable(fmt::format("the receiver refuses connections, so it is gone: {}", last.message()));
        }
      } else {
        refused = false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return Status(StatusCode::kDeadlineExceeded, fmt::format("{} attempts, the last: {}", attempts, last.message()));
  };
}

// Resumable pre-copy, destination side: waits on the same listener for the
// source of this session, refusing (and naming) every other connection.
Reconnect DestinationReaccept(TcpListener& listener, const TlsConfig* tls, std::chrono::milliseconds handshake_timeout,
                              std::vector<NetSession>& links) {
  return [&listener, tls, handshake_timeout, &links](std::chrono::nanoseconds window) -> Result<Reconnected> {
    Print(stderr, "receive: connection lost; waiting up to {:.0f} s for the source to resume\n",
          std::chrono::duration<double>(window).count());
    std::vector<std::string> refused;
    auto ns = AcceptSession(listener, std::chrono::duration_cast<std::chrono::milliseconds>(window), tls,
                            handshake_timeout, &links.front().resume, &refused);
    for (const auto& why : refused) Print(stderr, "receive: refused a connection while waiting: {}\n", why);
    if (!ns.ok()) return ns.status();
    links.push_back(std::move(ns).value());
    Print(stderr, "receive: the source resumed session {:016x}\n", links.back().session_id);
    return Reconnected{links.back().View(), links.back().aes_key};
  };
}


}  // namespace

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

CLI::App* AddReceiveCommand(CLI::App& app, ReceiveFlags& f) {
  auto* c = app.add_subcommand("receive", "Wait for one `gpumigrate migrate` and become the destination device.");
  c->add_option("--listen", f.listen, "ADDR:PORT to listen on (port 0: any free port, see --port-file)")->required();
  c->add_option("--device", f.device, "Destination device spec; must match the source's geometry (proc:PID or cuda:PID: a process waiting in adopt mode; vfio:PATH[,PATH...]: devices of the same kind, in the same order; shm:PATH: the destination QEMU's device-memory file, with --qemu)")
      ->capture_default_str();
  c->add_option("--accept-timeout", f.accept_timeout, "How long to wait for the source")->capture_default_str();
  c->add_option("--port-file", f.port_file, "Write the port actually listened on to this file");
  c->add_option("--phase-file", f.phase_file,
                "Keep the session's phase in this file as it changes ({\"phase\": \"round-end\", \"round\": 2}, "
                "replaced whole): the agent reports it");
  c->add_option("--content-store", f.content_store,
                "A directory of files this host already holds (weights, region dumps; see `gpumigrate content-store`): "
                "pages the source offers by SHA-256 are filled from it instead of crossing the link")
      ->check(CLI::ExistingDirectory);
  c->add_option("--run-after", f.run_after,
                "After the switchover, let the workload run this long here, then pause it and self-check its memory")
      ->capture_default_str();
  c->add_option("--handshake-timeout", f.handshake_timeout,
                "Once a connection arrives: how long its TLS handshake and session join may take (a silent stranger "
                "is dropped after this, not after --accept-timeout)")
      ->capture_default_str();
  AddLivenessFlags(c, f.live);
  AddQemuDestinationFlags(c, f.qemu);
  AddTlsFlags(c, f.tls);
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout");
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

int RunMigrate(const MigrateFlags& f, const std::atomic<bool>& cancel) {
  auto tls = MakeTls(f.tls);
  if (!tls.ok()) return Usage("migrate", tls.status());
  auto to = ParseHostPort(f.to);
  if (!to.ok()) return Usage("migrate", to.status());
  auto opts = MakeSourceOptions(f.src);
  if (!opts.ok()) return Usage("migrate", opts.status());
  if (!f.plot.empty()) {  // before anything moves: never a migration only to fail at its picture
    if (Status p = CheckPlotTarget(f.plot); !p.ok()) return Usage("migrate", p);
  }
  auto warmup = ParseDuration(f.warmup);
  auto connect_timeout = ParseDuration(f.connect_timeout);
  if (!warmup.ok() || !connect_timeout.ok()) {
    return Usage("migrate", !warmup.ok() ? warmup.status() : connect_timeout.status());
  }
  auto live = ParseLiveness(f.live);
  if (!live.ok()) return Usage("migrate", live.status());
  SourceOptions o = *opts;
  Apply(*live, o);
  o.cancel = &cancel;
  std::unique_ptr<RateFile> rate_file;
  if (!f.bandwidth_file.empty()) {
    auto rf = RateFile::Open(f.bandwidth_file);
    if (!rf.ok()) return Usage("migrate", rf.status().WithContext("--bandwidth-file"));
    rate_file = std::move(*rf);
    // The pace replaces the cap from the first frame on; the codec choice and
    // the path calibration's key stay those of --bandwidth (the path `estimate`
    // calibrated), since a share changes while the migration runs.
    o.bandwidth_now = rate_file->rate();
  }
  o.dry_run = f.dry_run;
  // The switchover rule's fixed cost: this path's, as `estimate` measured it
  // between two processes, else the in-process calibration's.
  const std::string transport = tls->has_value() ? "tls" : "insecure";
  const PathConfig path = PathConfigFor(transport, f.src.streams, o.codec, o.bandwidth_limit_bytes_per_s, f.device);
  const std::optional<PathCalibration> stored_path = StoredPathFor(path);
  if (stored_path) {
    o.switchover_fixed_cost = std::chrono::nanoseconds(static_cast<int64_t>(stored_path->fixed_ms * 1e6));
  } else {
    o.switchover_fixed_cost = StoredFixedCost(o.switchover_fixed_cost);
  }
  if (Status q = CheckQemuUse(f.qemu, f.device, true); !q.ok()) return Usage("migrate", q);
  if (f.dry_run && !f.qemu.qmp.empty()) {
    return Usage("migrate", InvalidArgument("--dry-run with --qemu would start QEMU's own migration, which pauses "
                                            "the guest and ends the destination QEMU: use `gpumigrate estimate --qemu` "
                                            "to predict without moving anything"));
  }
  auto opened = OpenDevice(f.device, true);
  if (!opened.ok()) return Usage("migrate", opened.status());
  ProgressPrinter progress(stderr);
  QemuGuest* guest = nullptr;
  if (Status q = AttachQemu(f.qemu, *opened, true, &o, &progress, &guest); !q.ok()) return Usage("migrate", q);
  Device* src = opened->device.get();
  progress.Note(fmt::format("source: {}, workload running", src->Describe()));
  if (opened->proc != nullptr) {
    progress.Note(fmt::format("dirty tracking: {} ({})", opened->proc->TrackerName(), opened->proc->TrackerReason()));
  }
  std::this_thread::sleep_for(*warmup);

  std::optional<EstimateReport> estimate;
  if (f.dry_run) {
    auto eo = ProbeEstimateOptions(f.src, f.sample);
    if (!eo.ok()) return Usage("migrate", eo.status());
    if (Status s = AttachPathCalibration(transport, f.src.streams, f.device, *eo); !s.ok()) {
      Print(stderr, "gpumigrate migrate: {}\n", s.message());
      return 1;
    }
    auto er = EstimateForProbe(*src, *eo, o, SystemClock());
    if (!er.ok()) {
      Print(stderr, "gpumigrate migrate: {}\n", er.status().message());
      return 1;
    }
    estimate = std::move(er).value();
  }

  // The receiver may still be starting: refused connections are retried until the timeout.
  auto ns = ConnectSession(*to, f.src.streams, std::chrono::duration_cast<std::chrono::milliseconds>(*connect_timeout),
                           tls->has_value() ? &**tls : nullptr);
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
  std::optional<PhaseFile> phase_file;
  if (!f.phase_file.empty()) phase_file.emplace(f.phase_file);
  o.on_progress = [&](const Progress& p) {
    progress.Update(p);
    trace.Add(p);
    if (phase_file) phase_file->OnProgress(p);
  };
  std::function<void(Phase, uint32_t)> on_phase;
  if (phase_file) on_phase = [&phase_file](Phase p, uint32_t round) { phase_file->OnPhase(p, round); };
  o.on_phase = WithCrashHook(on_phase);
  if (guest != nullptr) guest->WireInto(o);
  std::vector<NetSession> links;
  links.push_back(std::move(ns).value());
  if (o.resume_window > std::chrono::nanoseconds(0)) {
    o.reconnect = SourceReconnect(*to, f.src.streams, tls->has_value() ? &**tls : nullptr, links, progress);
  }
  const std::string security = links.front().security;
  MigrationReport r = RunSource(*src, links.front().View(), o);
  progress.Finish();
  if (!r.source_cleanup.ok()) {
    Print(stderr, "gpumigrate migrate: after the migration: {}\n", r.source_cleanup.message());
  } else if (opened->proc != nullptr && r.outcome == Outcome::kCompleted) {
    progress.Note(fmt::format("source process {} released: it was told that it moved", opened->proc->pid()));
  }
  // What this migration measured against its path's calibration joins the
  // host's record the estimator's ranges are drawn from (path_spread.h): a
  // completed one at a steady cap, without QEMU's own stop in its stun, on a
  // path calibrated for its own backend.
  if (stored_path && stored_path->config.Key() == path.Key() && r.outcome == Outcome::kCompleted && !f.dry_run && guest == nullptr && !rate_file) {
    if (Status s = RecordAgainstPath(*stored_path, r); !s.ok()) {
      Print(stderr, "gpumigrate migrate: recording the run against its path calibration: {}\n", s.message());
    }
  }
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

namespace {

void PrintReceiveReport(const ReceiveFlags& f, const MigrationReport& r, const std::string& security,
                        const std::optional<SimResumeCheck>& check, const std::string& proc_line, QemuGuest* guest) {
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(ReportToJson(r));
    j["security"] = security;
    if (check) j["destination"] = nlohmann::ordered_json::parse(check->ToJson());
    if (guest != nullptr) AddQemuToJson(*guest, j);
    Print("{}\n", j.dump());
    return;
  }
  Print("gpumigrate receive: {}{}\n", OutcomeName(r.outcome), r.verified ? ", verified" : "");
  if (!r.status.ok()) Print("  error:      {}\n", r.status.message());
  if (!r.resolution.empty()) Print("  resolution: {}\n", r.resolution);
  Print("  received:   {} in {:.2f} s\n", FormatBytes(static_cast<double>(r.bytes_sent)), r.total_ms / 1e3);
  PrintResumptions(stdout, r);
  if (check) Print("{}\n", check->ToLine());
  if (!proc_line.empty()) Print("{}\n", proc_line);
  if (guest != nullptr) PrintQemuLines(*guest, stdout);
}

}  // namespace

int RunReceive(const ReceiveFlags& f, const std::atomic<bool>& cancel) {
  auto tls = MakeTls(f.tls);
  if (!tls.ok()) return Usage("receive", tls.status());
  auto at = ParseHostPort(f.listen);
  if (!at.ok()) return Usage("receive", at.status());
  auto accept_timeout = ParseDuration(f.accept_timeout);
  auto run_after = ParseDuration(f.run_after);
  auto handshake_timeout = ParseDuration(f.handshake_timeout);
  if (!accept_timeout.ok() || !run_after.ok() || !handshake_timeout.ok()) {
    return Usage("receive", !accept_timeout.ok() ? accept_timeout.status()
                            : !run_after.ok()    ? run_after.status()
                                                 : handshake_timeout.status());
  }
  auto live = ParseLiveness(f.live);
  if (!live.ok()) return Usage("receive", live.status());
  // Listen first: a source that connects while the device is being allocated
  // waits in the backlog instead of being refused.
  auto listener = TcpListener::Listen(*at);
  if (!listener.ok()) return Usage("receive", listener.status());
  // SIGTERM (an agent's cancel) ends every wait for the source: the first
  // connection and a resumption's alike.
  (*listener)->SetCancel(&cancel);
  if (!f.port_file.empty()) {
    std::ofstream pf(f.port_file + ".tmp");
    pf << (*listener)->port() << "\n";
    pf.close();
    std::rename((f.port_file + ".tmp").c_str(), f.port_file.c_str());
  }
  if (Status q = CheckQemuUse(f.qemu, f.device, false); !q.ok()) return Usage("receive", q);
  auto opened = OpenDevice(f.device, false);
  if (!opened.ok()) return Usage("receive", opened.status());
  QemuGuest* guest = nullptr;
  if (Status q = AttachQemu(f.qemu, *opened, false, nullptr, nullptr, &guest); !q.ok()) return Usage("receive", q);
  Device* dst = opened->device.get();
  Print(stderr, "receive: listening on {}:{} for {}{}\n", at->host, (*listener)->port(), dst->Describe(),
             tls->has_value() ? "" : " (INSECURE: no TLS)");
  auto ns = AcceptSession(**listener, std::chrono::duration_cast<std::chrono::milliseconds>(*accept_timeout),
                          tls->has_value() ? &**tls : nullptr,
                          std::chrono::duration_cast<std::chrono::milliseconds>(*handshake_timeout));
  if (!ns.ok()) {
    Print(stderr, "gpumigrate receive: {}\n", ns.status().message());
    return 1;
  }
  Print(stderr, "receive: session {:016x} joined with {} data streams: {}\n", ns->session_id, ns->data.size(),
             ns->security);
  DestinationOptions o;
  Apply(*live, o);
  o.aes_key = ns->aes_key;
  o.content_store_dir = f.content_store;
  std::vector<NetSession> links;
  links.push_back(std::move(ns).value());
  if (o.resume_window > std::chrono::nanoseconds(0)) {
    o.reaccept = DestinationReaccept(**listener, tls->has_value() ? &**tls : nullptr,
                                     std::chrono::duration_cast<std::chrono::milliseconds>(*handshake_timeout), links);
  }
  o.cancel = &cancel;
  std::optional<PhaseFile> phase_file;
  if (!f.phase_file.empty()) {
    phase_file.emplace(f.phase_file, /*applied=*/true);
    o.on_progress = [&phase_file](const Progress& p) { phase_file->OnProgress(p); };
  }
  o.on_phase = WithCrashHook([&phase_file](Phase p, uint32_t round) {
    if (p == Phase::kRoundEnd) Print(stderr, "receive: round {} applied\n", round);
    if (p == Phase::kPreparedSent) Print(stderr, "receive: verified and prepared; waiting for commit\n");
    if (phase_file) phase_file->OnPhase(p, round);
  });
  MigrationReport r = RunDestination(*dst, links.front().View(), o);
  int rc = ExitCodeFor(r);
  std::optional<SimResumeCheck> check;
  std::string proc_line;
  if (r.outcome == Outcome::kCompleted && opened->sim != nullptr) {
    check = RunResumeCheck(*opened->sim, *run_after, SystemClock());
    if (!check->ok()) rc = 1;
  } else if (r.outcome == Outcome::kCompleted && opened->proc != nullptr) {
    proc_line = fmt::format("  destination: process {} adopted the memory and runs on (it checks its own memory)",
                            opened->proc->pid());
  }
  PrintReceiveReport(f, r, links.front().security, check, proc_line, guest);
  return rc;
}

}  // namespace gpumigrate::cli
