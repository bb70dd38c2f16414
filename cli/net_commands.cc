#include "cli/net_commands.h"

#include <fstream>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/crash_hook.h"
#include "cli/device_open.h"
#include "cli/estimate_command.h"
#include "cli/progress.h"
#include "cli/report_print.h"
#include "gpumigrate/calibration.h"
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
  fmt::print(stderr, "gpumigrate {}: {}\n", cmd, s.message());
  return 2;
}


}  // namespace

CLI::App* AddMigrateCommand(CLI::App& app, MigrateFlags& f) {
  auto* c = app.add_subcommand("migrate",
                               "Live-migrate a device to a `gpumigrate receive` on another host (or process) over TCP.");
  c->add_option("--device", f.device, "Device spec: sim:llm, sim:key=value,... (see `gpumigrate help demo`), or proc:PID[,tracker=auto|pagemap-scan|sync-wp|hash] for a live process linked with libgpumigrate_shim")
      ->capture_default_str();
  c->add_option("--to", f.to, "The receiver's ADDR:PORT")->required();
  AddSourceFlags(c, f.src);
  c->add_option("--warmup", f.warmup, "Let the workload run this long before migrating")->capture_default_str();
  c->add_option("--connect-timeout", f.connect_timeout, "How long to try reaching the receiver")->capture_default_str();
  c->add_flag("--dry-run", f.dry_run,
              "Probe: estimate first, then pre-copy to the receiver until the switchover decision and abort cleanly "
              "(the source never stops, the receiver discards); report measured vs predicted");
  c->add_option("--sample", f.sample, "With --dry-run: how long the estimator observes first")->capture_default_str();
  AddTlsFlags(c, f.tls);
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout");
  return c;
}

CLI::App* AddReceiveCommand(CLI::App& app, ReceiveFlags& f) {
  auto* c = app.add_subcommand("receive", "Wait for one `gpumigrate migrate` and become the destination device.");
  c->add_option("--listen", f.listen, "ADDR:PORT to listen on (port 0: any free port, see --port-file)")->required();
  c->add_option("--device", f.device, "Destination device spec; must match the source's geometry (proc:PID: a process waiting in adopt mode)")
      ->capture_default_str();
  c->add_option("--accept-timeout", f.accept_timeout, "How long to wait for the source")->capture_default_str();
  c->add_option("--port-file", f.port_file, "Write the port actually listened on to this file");
  c->add_option("--run-after", f.run_after,
                "After the switchover, let the workload run this long here, then pause it and self-check its memory")
      ->capture_default_str();
  AddTlsFlags(c, f.tls);
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout");
  return c;
}

int RunMigrate(const MigrateFlags& f, const std::atomic<bool>& cancel) {
  auto tls = MakeTls(f.tls);
  if (!tls.ok()) return Usage("migrate", tls.status());
  auto to = ParseHostPort(f.to);
  if (!to.ok()) return Usage("migrate", to.status());
  auto opts = MakeSourceOptions(f.src);
  if (!opts.ok()) return Usage("migrate", opts.status());
  auto warmup = ParseDuration(f.warmup);
  auto connect_timeout = ParseDuration(f.connect_timeout);
  if (!warmup.ok() || !connect_timeout.ok()) {
    return Usage("migrate", !warmup.ok() ? warmup.status() : connect_timeout.status());
  }
  SourceOptions o = *opts;
  o.cancel = &cancel;
  o.dry_run = f.dry_run;
  if (auto cal = LoadStoredCalibration(); cal.ok()) {
    o.switchover_fixed_cost = std::chrono::nanoseconds(static_cast<int64_t>(cal->fixed_cost_ms * 1e6));
  }
  auto opened = OpenDevice(f.device, true);
  if (!opened.ok()) return Usage("migrate", opened.status());
  Device* src = opened->device.get();
  ProgressPrinter progress(stderr);
  progress.Note(fmt::format("source: {}, workload running", src->Describe()));
  if (opened->proc != nullptr) {
    progress.Note(fmt::format("dirty tracking: {} ({})", opened->proc->TrackerName(), opened->proc->TrackerReason()));
  }
  std::this_thread::sleep_for(*warmup);

  std::optional<EstimateReport> estimate;
  if (f.dry_run) {
    auto eo = ProbeEstimateOptions(f.src, f.sample);
    if (!eo.ok()) return Usage("migrate", eo.status());
    auto er = EstimateDevice(*src, *eo, SystemClock());
    if (!er.ok()) {
      fmt::print(stderr, "gpumigrate migrate: {}\n", er.status().message());
      return 1;
    }
    estimate = std::move(er).value();
    o.switchover_fixed_cost = estimate->params.fixed_cost;
  }

  auto ns = ConnectSession(*to, f.src.streams, std::chrono::duration_cast<std::chrono::milliseconds>(*connect_timeout),
                           tls->has_value() ? &**tls : nullptr);
  if (!ns.ok()) {
    // Nothing moved: the source never left RUNNING.
    fmt::print(stderr, "gpumigrate migrate: {} (the source keeps running)\n", ns.status().message());
    if (f.json) {
      nlohmann::ordered_json j;
      j["outcome"] = "aborted";
      j["verified"] = false;
      j["error"] = ns.status().message();
      j["failed_phase"] = "connect";
      j["resolution"] = "the source is RUNNING; nothing was sent";
      fmt::print("{}\n", j.dump());
    }
    return 1;
  }
  progress.Note(fmt::format("connected to {} with {} data stream{}: {}", f.to, f.src.streams,
                            f.src.streams == 1 ? "" : "s", ns->security));
  o.session_id = ns->session_id;
  o.aes_key = ns->aes_key;
  o.on_progress = [&](const Progress& p) { progress.Update(p); };
  o.on_phase = WithCrashHook(nullptr);
  MigrationReport r = RunSource(*src, ns->View(), o);
  progress.Finish();
  if (!r.source_cleanup.ok()) {
    fmt::print(stderr, "gpumigrate migrate: after the migration: {}\n", r.source_cleanup.message());
  } else if (opened->proc != nullptr && r.outcome == Outcome::kCompleted) {
    progress.Note(fmt::format("source process {} released: it was told that it moved", opened->proc->pid()));
  }
  if (estimate) {
    if (f.json) {
      auto j = nlohmann::ordered_json::parse(ReportToJson(r));
      j["estimate"] = nlohmann::ordered_json::parse(EstimateToJson(*estimate));
      fmt::print("{}\n", j.dump());
    } else {
      PrintProbe(stdout, "gpumigrate migrate", r, *estimate);
    }
    return r.status.ok() ? 0 : ExitCodeFor(r);
  }
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(ReportToJson(r));
    j["security"] = ns->security;
    fmt::print("{}\n", j.dump());
  } else {
    PrintReport(stdout, "gpumigrate migrate", r);
    fmt::print("  security:   {}\n", ns->security);
  }
  return ExitCodeFor(r);
}

int RunReceive(const ReceiveFlags& f, const std::atomic<bool>& cancel) {
  auto tls = MakeTls(f.tls);
  if (!tls.ok()) return Usage("receive", tls.status());
  auto at = ParseHostPort(f.listen);
  if (!at.ok()) return Usage("receive", at.status());
  auto accept_timeout = ParseDuration(f.accept_timeout);
  auto run_after = ParseDuration(f.run_after);
  if (!accept_timeout.ok() || !run_after.ok()) {
    return Usage("receive", !accept_timeout.ok() ? accept_timeout.status() : run_after.status());
  }
  auto opened = OpenDevice(f.device, false);
  if (!opened.ok()) return Usage("receive", opened.status());
  Device* dst = opened->device.get();
  auto listener = TcpListener::Listen(*at);
  if (!listener.ok()) return Usage("receive", listener.status());
  if (!f.port_file.empty()) {
    std::ofstream pf(f.port_file + ".tmp");
    pf << (*listener)->port() << "\n";
    pf.close();
    std::rename((f.port_file + ".tmp").c_str(), f.port_file.c_str());
  }
  fmt::print(stderr, "receive: listening on {}:{} for {}{}\n", at->host, (*listener)->port(), dst->Describe(),
             tls->has_value() ? "" : " (INSECURE: no TLS)");
  auto ns = AcceptSession(**listener, std::chrono::duration_cast<std::chrono::milliseconds>(*accept_timeout),
                          tls->has_value() ? &**tls : nullptr);
  if (!ns.ok()) {
    fmt::print(stderr, "gpumigrate receive: {}\n", ns.status().message());
    return 1;
  }
  fmt::print(stderr, "receive: session {:016x} joined with {} data streams: {}\n", ns->session_id, ns->data.size(),
             ns->security);
  DestinationOptions o;
  o.aes_key = ns->aes_key;
  o.cancel = &cancel;
  o.on_phase = WithCrashHook([](Phase p, uint32_t round) {
    if (p == Phase::kRoundEnd) fmt::print(stderr, "receive: round {} applied\n", round);
    if (p == Phase::kPreparedSent) fmt::print(stderr, "receive: verified and prepared; waiting for commit\n");
  });
  MigrationReport r = RunDestination(*dst, ns->View(), o);
  ResumeCheck check;
  int rc = ExitCodeFor(r);
  if (r.outcome == Outcome::kCompleted && opened->sim != nullptr) {
    check = RunResumeCheck(*opened->sim, *run_after);
    if (!check.ok) rc = 1;
  } else if (r.outcome == Outcome::kCompleted && opened->proc != nullptr) {
    check.line = fmt::format("  destination: process {} adopted the memory and runs on (it checks its own memory)",
                             opened->proc->pid());
  }
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(ReportToJson(r));
    j["security"] = ns->security;
    if (!check.json.empty()) j["destination"] = nlohmann::ordered_json::parse(check.json);
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("gpumigrate receive: {}{}\n", OutcomeName(r.outcome), r.verified ? ", verified" : "");
    if (!r.status.ok()) fmt::print("  error:      {}\n", r.status.message());
    if (!r.resolution.empty()) fmt::print("  resolution: {}\n", r.resolution);
    fmt::print("  received:   {} in {:.2f} s\n", FormatBytes(static_cast<double>(r.bytes_sent)), r.total_ms / 1e3);
    if (!check.line.empty()) fmt::print("{}\n", check.line);
  }
  return rc;
}

}  // namespace gpumigrate::cli
