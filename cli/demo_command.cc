#include "cli/demo_command.h"

#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/estimate_command.h"
#include "cli/gnuplot.h"
#include "cli/migration_plot.h"
#include "cli/print.h"
#include "cli/progress.h"
#include "cli/report_print.h"
#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

CLI::App* AddDemoCommand(CLI::App& app, DemoFlags& f) {
  auto* c = app.add_subcommand(
      "demo",
      "Live-migrate a simulated GPU VM running LLM inference, inside this process: pre-copy rounds while the workload "
      "runs, then a short stun, verification, and the workload resuming on the destination.");
  c->add_option("--device", f.device,
                "Device spec: sim:llm (4 GiB: 60% weights, 30% KV cache half full, 32 MiB activations) or "
                "sim:size=SIZE,static=FRACTION,kv=FRACTION,kv_fill=FRACTION,kv_rate=RATE,hot=SIZE,page=SIZE,seed=N,"
                "step=DURATION,layers=N,data=bf16|noise (unset keys take the sim:llm values)")
      ->capture_default_str();
  AddSourceFlags(c, f.src);
  c->add_option("--warmup", f.warmup, "Let the workload run this long before migrating")->capture_default_str();
  c->add_option("--run-after", f.run_after,
                "Let the workload run this long on the destination, then pause it and run its memory self-check")
      ->capture_default_str();
  c->add_flag("--dry-run", f.dry_run,
              "Probe: estimate first (observing for --sample), then pre-copy for real until the switchover decision "
              "and abort cleanly (the source never stops, the destination discards); report measured vs predicted");
  c->add_option("--sample", f.sample, "With --dry-run: how long the estimator observes the workload first")
      ->capture_default_str();
  c->add_option("--transport", f.transport,
                "tls: loopback TCP with a TLS 1.3 control channel (ephemeral PSK) and AES-256-GCM frames; tcp: "
                "loopback TCP without encryption; memory: in-memory streams, no sockets")
      ->check(CLI::IsMember({"tls", "tcp", "memory"}))
      ->capture_default_str();
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout (progress stays on stderr)");
  AddMigrationPlotFlag(c, f.plot);
  return c;
}

namespace {

int UsageError(const Status& s) {
  Print(stderr, "gpumigrate demo: {}\n", s.message());
  return 2;
}

struct DemoDevices {
  std::unique_ptr<SimDevice> source, dest;
};

// The source starts its workload; it warms up while the destination allocates.
Result<DemoDevices> CreateDevices(const SimSpec& spec, std::chrono::nanoseconds warmup, ProgressPrinter& progress) {
  DemoDevices d;
  GM_ASSIGN_OR_RETURN(d.source, SimDevice::Create(spec, SimRole::kSource));
  uint64_t device_bytes = 0;
  for (const auto& r : d.source->Regions()) device_bytes += r.size_bytes;
  progress.Note(fmt::format("source: {} ({}), workload running", d.source->Describe(),
                            FormatBytes(static_cast<double>(device_bytes))));
  auto t_alloc = std::chrono::steady_clock::now();
  GM_ASSIGN_OR_RETURN(d.dest, SimDevice::Create(spec, SimRole::kDestination));
  auto alloc_time = std::chrono::steady_clock::now() - t_alloc;
  progress.Note(fmt::format("destination: {} of device memory allocated in {:.2f} s",
                            FormatBytes(static_cast<double>(device_bytes)),
                            std::chrono::duration<double>(alloc_time).count()));
  if (alloc_time < warmup) std::this_thread::sleep_for(warmup - alloc_time);
  return d;
}

// What the demo runs, from its flags: every usage error shows here, before any
// device exists.
struct DemoSetup {
  SimSpec spec;
  LocalMigrationOptions opt;
  std::chrono::nanoseconds warmup{};
  std::chrono::nanoseconds run_after{};
};

Result<DemoSetup> PrepareDemo(const DemoFlags& f, const std::atomic<bool>& cancel) {
  DemoSetup d;
  auto spec = ParseSimSpec(f.device);
  if (!spec.ok()) {
    if (f.device.rfind("sim", 0) != 0) {
      return InvalidArgument(fmt::format(
          "the demo runs source and destination in one process and needs a sim device, not '{}'", f.device));
    }
    return spec.status();
  }
  d.spec = *spec;
  d.opt.data_streams = f.src.streams;
  GM_ASSIGN_OR_RETURN(d.opt.source, MakeSourceOptions(f.src));
  d.opt.source.dry_run = f.dry_run;
  auto warmup = ParseDuration(f.warmup);
  auto run_after = ParseDuration(f.run_after);
  for (const Status* s : {&warmup.status(), &run_after.status()}) {
    if (!s->ok()) return *s;
  }
  d.warmup = *warmup;
  d.run_after = *run_after;
  d.opt.source.cancel = &cancel;
  d.opt.destination.cancel = &cancel;
  if (!f.plot.empty()) {  // before anything moves: never a migration only to fail at its picture
    GM_RETURN_IF_ERROR(CheckPlotTarget(f.plot));
  }
  return d;
}

// Progress on stderr as the rounds go, and the trace the plot draws.
void WatchDemoProgress(SourceOptions& so, ProgressPrinter& progress, ProgressTrace& trace) {
  so.on_progress = [&progress, &trace](const Progress& p) {
    progress.Update(p);
    trace.Add(p);
  };
  so.on_phase = [&progress](Phase p, uint32_t round) {
    if (p == Phase::kSwitchover) progress.Note(fmt::format("switchover: stopping the source after {} rounds", round));
  };
}

// --dry-run: the estimator's prediction first, from observation alone, into
// `estimate`. Returns 0 to go on probing, else the exit code.
int EstimateBeforeProbe(const DemoFlags& f, SimDevice& source, SourceOptions& so, ProgressPrinter& progress,
                        std::optional<EstimateReport>& estimate) {
  auto eo = ProbeEstimateOptions(f.src, f.sample);
  if (!eo.ok()) return UsageError(eo.status());
  progress.Note(fmt::format("dry run: observing the workload for {} before moving anything", f.sample));
  auto er = EstimateForProbe(source, *eo, so, SystemClock());
  if (!er.ok()) {
    Print(stderr, "gpumigrate demo: {}\n", er.status().message());
    return 1;
  }
  estimate = std::move(er).value();
  progress.Note(fmt::format("estimate: {}, stun {:.1f} ms in {} rounds; now probing for real",
                            EstimateDecisionName(estimate->prediction.decision), estimate->prediction.mid.stun_ms,
                            estimate->prediction.mid.rounds.size()));
  return 0;
}

void PrintDemo(const DemoFlags& f, const MigrationReport& r, const std::optional<EstimateReport>& estimate,
               const std::string& security, uint64_t source_kernels_during, const std::optional<SimResumeCheck>& check);

}  // namespace

int RunDemo(const DemoFlags& f, const std::atomic<bool>& cancel) {
  auto setup = PrepareDemo(f, cancel);
  if (!setup.ok()) return UsageError(setup.status());
  LocalMigrationOptions& opt = setup->opt;

  ProgressPrinter progress(stderr);
  auto devices = CreateDevices(setup->spec, setup->warmup, progress);
  if (!devices.ok()) return UsageError(devices.status());
  SimDevice& source = *devices->source;
  SimDevice& dest = *devices->dest;
  progress.Note(fmt::format("migrating over {} data stream{} ({}){}", f.src.streams, f.src.streams == 1 ? "" : "s",
                            f.transport == "memory" ? "in memory" : "loopback TCP",
                            f.src.bandwidth.empty() ? "" : ", capped at " + f.src.bandwidth));
  ProgressTrace trace;
  WatchDemoProgress(opt.source, progress, trace);
  // The switchover rule uses the calibrated fixed cost when this host has one.
  opt.source.switchover_fixed_cost = StoredFixedCost(opt.source.switchover_fixed_cost);
  std::optional<EstimateReport> estimate;
  if (f.dry_run) {
    if (int rc = EstimateBeforeProbe(f, source, opt.source, progress, estimate); rc != 0) return rc;
  }
  uint64_t kernels_at_start = source.KernelsRun();
  std::string security = "in-memory streams: frames carry an integrity tag";
  LocalMigrationResult res = f.transport == "memory"
                                 ? MigrateLocally(source, dest, opt)
                                 : MigrateOverLoopback(source, dest, opt, f.transport == "tls", &security);
  progress.Finish();
  uint64_t source_kernels_during = source.KernelsRun() - kernels_at_start;

  // The destination keeps the workload going; then it checks its own memory.
  std::optional<SimResumeCheck> check;
  int exit_code = ExitCodeFor(res.source);
  if (res.source.outcome == Outcome::kCompleted) {
    check = RunResumeCheck(dest, setup->run_after, SystemClock());
    if (!check->ok()) exit_code = 1;
  }

  PrintDemo(f, res.source, estimate, security, source_kernels_during, check);
  DrawMigrationPlot(f.plot, res.source, trace, fmt::format("gpumigrate demo{}: {}", f.dry_run ? " --dry-run" : "",
                                                           source.Describe()));
  if (res.source.outcome != Outcome::kCompleted && res.destination.outcome != Outcome::kAborted) {
    Print(stderr, "destination: {} ({})\n", OutcomeName(res.destination.outcome),
               res.destination.status.message());
  }
  return estimate ? (res.source.status.ok() ? 0 : ExitCodeFor(res.source)) : exit_code;
}

namespace {

void PrintDemo(const DemoFlags& f, const MigrationReport& r, const std::optional<EstimateReport>& estimate,
               const std::string& security, uint64_t source_kernels_during, const std::optional<SimResumeCheck>& check) {
  if (estimate) {
    if (f.json) {
      Print("{}\n", ProbeReportToJson(r, *estimate));
    } else {
      PrintProbe(stdout, "gpumigrate demo", r, *estimate);
    }
    return;
  }
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(ReportToJson(r));
    j["source_kernels_during_migration"] = source_kernels_during;
    j["security"] = security;
    if (check) j["destination"] = nlohmann::ordered_json::parse(check->ToJson());
    Print("{}\n", j.dump());
  } else {
    PrintReport(stdout, "gpumigrate demo", r);
    Print("  security:   {}\n", security);
    Print("  workload:   {} kernels ran on the source while it was being migrated\n", source_kernels_during);
    if (check) Print("{}\n", check->ToLine());
  }
}

}  // namespace

}  // namespace gpumigrate::cli
