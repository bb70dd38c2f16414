// `gpumigrate receive`: the destination of a migration between two processes
// (cli/net_commands.h).
#include <cstdio>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/crash_hook.h"
#include "cli/net_commands.h"
#include "cli/net_flags.h"
#include "engine/agent/phase_file.h"
#include "cli/print.h"
#include "cli/report_print.h"
#include "engine/session/net_reconnect.h"
#include "gpumigrate/devices/open_device.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/units.h"
#include "transport/net/session_connect.h"

namespace gpumigrate::cli {

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
  c->add_option("--threads", f.threads,
                "Threads that open, decompress and write frames beside each data stream's receiving thread (default: "
                "the cores the streams' threads leave, at most 8; 0: each stream's thread does it all)")
      ->check(CLI::Range(0, 64));
  AddLivenessFlags(c, f.live);
  AddQemuDestinationFlags(c, f.qemu);
  AddTlsFlags(c, f.tls);
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout");
  return c;
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

// After a completed receive: a sim runs on here and checks its memory; a
// process that adopted the memory checks its own.
void AfterReceive(OpenedDevice& opened, std::chrono::nanoseconds run_after, std::optional<SimResumeCheck>* check,
                  std::string* proc_line) {
  if (opened.sim != nullptr) {
    *check = RunResumeCheck(*opened.sim, run_after, SystemClock());
  } else if (opened.proc != nullptr) {
    *proc_line = fmt::format("  destination: process {} adopted the memory and runs on (it checks its own memory)",
                             opened.proc->pid());
  }
}

}  // namespace

int RunReceive(const ReceiveFlags& f, const std::atomic<bool>& cancel) {
  auto tls = MakeTls(f.tls);
  if (!tls.ok()) return NetUsage("receive", tls.status());
  auto at = ParseHostPort(f.listen);
  if (!at.ok()) return NetUsage("receive", at.status());
  auto accept_timeout = ParseDuration(f.accept_timeout);
  auto run_after = ParseDuration(f.run_after);
  auto handshake_timeout = ParseDuration(f.handshake_timeout);
  if (!accept_timeout.ok() || !run_after.ok() || !handshake_timeout.ok()) {
    return NetUsage("receive", !accept_timeout.ok() ? accept_timeout.status()
                            : !run_after.ok()    ? run_after.status()
                                                 : handshake_timeout.status());
  }
  auto live = ParseLiveness(f.live);
  if (!live.ok()) return NetUsage("receive", live.status());
  // Listen first: a source that connects while the device is being allocated
  // waits in the backlog instead of being refused.
  auto listener = TcpListener::Listen(*at);
  if (!listener.ok()) return NetUsage("receive", listener.status());
  // SIGTERM (an agent's cancel) ends every wait for the source: the first
  // connection and a resumption's alike.
  (*listener)->SetCancel(&cancel);
  if (!f.port_file.empty()) WritePortFile(f.port_file, (*listener)->port());
  if (Status q = CheckQemuUse(f.qemu, f.device, false); !q.ok()) return NetUsage("receive", q);
  auto opened = OpenDevice(f.device, false);
  if (!opened.ok()) return NetUsage("receive", opened.status());
  QemuGuest* guest = nullptr;
  if (Status q = AttachQemu(f.qemu, *opened, false, nullptr, nullptr, &guest); !q.ok()) return NetUsage("receive", q);
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
  ApplyLiveness(*live, o);
  o.aes_key = ns->aes_key;
  o.content_store_dir = f.content_store;
  if (f.threads >= 0) o.workers = static_cast<uint32_t>(f.threads);
  std::vector<NetSession> links;
  links.push_back(std::move(ns).value());
  if (o.resume_window > std::chrono::nanoseconds(0)) {
    o.reaccept = DestinationReaccept(**listener, tls->has_value() ? &**tls : nullptr,
                                     std::chrono::duration_cast<std::chrono::milliseconds>(*handshake_timeout), links,
                                     [](const std::string& line) { Print(stderr, "receive: {}\n", line); });
  }
  o.cancel = &cancel;
  std::optional<agent::PhaseFile> phase_file;
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
  if (r.outcome == Outcome::kCompleted) AfterReceive(*opened, *run_after, &check, &proc_line);
  if (check && !check->ok()) rc = 1;
  PrintReceiveReport(f, r, links.front().security, check, proc_line, guest);
  return rc;
}

}  // namespace gpumigrate::cli
