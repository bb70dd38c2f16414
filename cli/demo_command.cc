#include "cli/demo_command.h"

#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/estimate_command.h"
#include "cli/progress.h"
#include "cli/report_print.h"
#include "gpumigrate/calibration.h"
#include "gpumigrate/estimator.h"
#include "gpumigrate/local_migration.h"
#include "gpumigrate/sim.h"
#include "gpumigrate/units.h"

namespace gpumigrate::cli {

CLI::App* AddDemoCommand(CLI::App& app, DemoFlags& f) {
  auto* c = app.add_subcommand(
      "demo",
      "Live-migrate a simulated GPU VM running LLM inference, inside this process: pre-copy rounds while the workload "
      "runs, then a short stun, verification, and the workload resuming on the destination.");
  c->add_option("--device", f.device,
                "Device spec: sim:llm (4 GiB: 60% weights, 30% KV cache half full, 32 MiB activations) or "
                "sim:size=SIZE,static=FRACTION,kv=FRACTION,kv_fill=FRACTION,kv_rate=RATE,hot=SIZE,page=SIZE,seed=N,"
                "step=DURATION,layers=N (unset keys take the sim:llm values)")
      ->capture_default_str();
  c->add_option("--streams", f.streams, "Data streams between source and destination")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  c->add_option("--downtime-target", f.downtime_target, "Switch over once the predicted stun is within this")
      ->capture_default_str();
  c->add_option("--max-stun", f.max_stun,
                "If rounds stop shrinking: switch over when the predicted stun is within this, else abort and "
                "recommend drain-and-replace")
      ->capture_default_str();
  c->add_option("--max-rounds", f.max_rounds, "Most pre-copy rounds before the max-stun rule applies")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  c->add_option("--bandwidth", f.bandwidth, "Cap the sending rate to emulate a slower link, e.g. 10Gbit or 500MB/s");
  c->add_option("--codec", f.codec,
                "Payload codec: none, zstd[:LEVEL], shuffle[:LEVEL] (byte planes of 16-bit values, then zstd), or "
                "auto (per region, only where it beats the --bandwidth cap; never when uncapped)")
      ->capture_default_str();
  c->add_option("--verify", f.verify,
                "digest: the destination checks per-page digests of all it applied; full: also re-read the whole "
                "source at stop and compare (lengthens the stun; shown as its own line)")
      ->check(CLI::IsMember({"digest", "full"}))
      ->capture_default_str();
  c->add_option("--warmup", f.warmup, "Let the workload run this long before migrating")->capture_default_str();
  c->add_option("--run-after", f.run_after,
                "Let the workload run this long on the destination, then pause it and run its memory self-check")
      ->capture_default_str();
  c->add_option("--if-not-converging", f.if_not_converging,
                "When rounds stop shrinking and the stun would exceed --max-stun: abort (recommend "
                "drain-and-replace) or switch over anyway")
      ->check(CLI::IsMember({"abort", "switch"}))
      ->capture_default_str();
  c->add_flag("--dry-run", f.dry_run,
              "Probe: estimate first (observing for --sample), then pre-copy for real until the switchover decision "
              "and abort cleanly (the source never stops, the destination discards); report measured vs predicted");
  c->add_option("--sample", f.sample, "With --dry-run: how long the estimator observes the workload first")
      ->capture_default_str();
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout (progress stays on stderr)");
  return c;
}

namespace {

// The probe's report: the rounds as measured beside the estimator's prediction.
void PrintProbe(FILE* out, const MigrationReport& r, const EstimateReport& e) {
  const Prediction& p = e.prediction;
  fmt::print(out, "gpumigrate demo --dry-run: probe {}, the engine {} switch over\n",
             r.status.ok() ? "complete" : "failed", r.would_switch ? "would" : "would NOT");
  if (!r.status.ok()) fmt::print(out, "  error:      {}\n", r.status.message());
  fmt::print(out, "  {}\n", r.resolution);
  fmt::print(out, "  {:>6}  {:>12} {:>9}  {:>12} {:>9}\n", "round", "predicted", "ms", "measured", "ms");
  size_t n = std::max(p.mid.rounds.size(), r.rounds.size());
  for (size_t i = 0; i < n; ++i) {
    std::string pb = i < p.mid.rounds.size() ? FormatBytes(p.mid.rounds[i].bytes) : "-";
    std::string pm = i < p.mid.rounds.size() ? fmt::format("{:.1f}", p.mid.rounds[i].seconds * 1e3) : "-";
    std::string mb = i < r.rounds.size() ? FormatBytes(static_cast<double>(r.rounds[i].bytes)) : "-";
    std::string mm = i < r.rounds.size() ? fmt::format("{:.1f}", r.rounds[i].ms) : "-";
    fmt::print(out, "  {:>6}  {:>12} {:>9}  {:>12} {:>9}\n", i, pb, pm, mb, mm);
  }
  fmt::print(out, "  stun, estimated before anything moved:   {:.1f} ms (range {:.1f} to {:.1f}), {}\n", p.mid.stun_ms,
             p.stun_low_ms, p.stun_high_ms, EstimateDecisionName(p.decision));
  fmt::print(out, "  stun, predicted from the probe's rounds: {:.1f} ms ({})\n", r.predicted_stun_ms,
             r.switchover_reason);
  fmt::print(out, "  pre-copy: predicted {:.2f} s, measured {:.2f} s\n", (p.mid.total_ms - p.mid.stun_ms) / 1e3,
             r.total_ms / 1e3);
}

int UsageError(const Status& s) {
  fmt::print(stderr, "gpumigrate demo: {}\n", s.message());
  return 2;
}

}  // namespace

int RunDemo(const DemoFlags& f, const std::atomic<bool>& cancel) {
  auto spec = ParseSimSpec(f.device);
  if (!spec.ok()) {
    if (f.device.rfind("sim", 0) != 0) {
      return UsageError(InvalidArgument(fmt::format(
          "the demo runs source and destination in one process and needs a sim device, not '{}'", f.device)));
    }
    return UsageError(spec.status());
  }
  LocalMigrationOptions opt;
  opt.data_streams = f.streams;
  auto target = ParseDuration(f.downtime_target);
  auto max_stun = ParseDuration(f.max_stun);
  auto warmup = ParseDuration(f.warmup);
  auto run_after = ParseDuration(f.run_after);
  for (const Status* s : {&target.status(), &max_stun.status(), &warmup.status(), &run_after.status()}) {
    if (!s->ok()) return UsageError(*s);
  }
  opt.source.downtime_target = *target;
  opt.source.max_stun = *max_stun;
  opt.source.max_rounds = f.max_rounds;
  opt.source.verify_full = f.verify == "full";
  auto codec = ParseCodecChoice(f.codec);
  if (!codec.ok()) return UsageError(codec.status());
  opt.source.codec = *codec;
  opt.source.switch_when_not_converging = f.if_not_converging == "switch";
  opt.source.dry_run = f.dry_run;
  opt.source.cancel = &cancel;
  opt.destination.cancel = &cancel;
  if (!f.bandwidth.empty()) {
    auto bw = ParseRateBytesPerS(f.bandwidth);
    if (!bw.ok()) return UsageError(bw.status());
    opt.source.bandwidth_limit_bytes_per_s = *bw;
  }

  ProgressPrinter progress(stderr);
  auto src = SimDevice::Create(*spec, SimRole::kSource);
  if (!src.ok()) return UsageError(src.status());
  SimDevice& source = **src;
  uint64_t device_bytes = 0;
  for (const auto& r : source.Regions()) device_bytes += r.size_bytes;
  progress.Note(fmt::format("source: {} ({}), workload running", source.Describe(),
                            FormatBytes(static_cast<double>(device_bytes))));
  // The workload warms up while the destination allocates its memory.
  auto t_alloc = std::chrono::steady_clock::now();
  auto dst = SimDevice::Create(*spec, SimRole::kDestination);
  if (!dst.ok()) return UsageError(dst.status());
  SimDevice& dest = **dst;
  auto alloc_time = std::chrono::steady_clock::now() - t_alloc;
  progress.Note(fmt::format("destination: {} of device memory allocated in {:.2f} s",
                            FormatBytes(static_cast<double>(device_bytes)),
                            std::chrono::duration<double>(alloc_time).count()));
  if (alloc_time < *warmup) std::this_thread::sleep_for(*warmup - alloc_time);
  progress.Note(fmt::format("migrating over {} in-process data stream{}{}", f.streams, f.streams == 1 ? "" : "s",
                            f.bandwidth.empty() ? "" : ", capped at " + f.bandwidth));
  opt.source.on_progress = [&](const Progress& p) { progress.Update(p); };
  opt.source.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kSwitchover) progress.Note(fmt::format("switchover: stopping the source after {} rounds", round));
  };
  // The switchover rule uses the calibrated fixed cost when this host has one.
  if (auto cal = LoadStoredCalibration(); cal.ok()) {
    opt.source.switchover_fixed_cost = std::chrono::nanoseconds(static_cast<int64_t>(cal->fixed_cost_ms * 1e6));
  }
  // --dry-run: the estimator's prediction first, from observation alone.
  std::optional<EstimateReport> estimate;
  if (f.dry_run) {
    EstimateFlags ef;
    ef.sample = f.sample;
    ef.downtime_target = f.downtime_target;
    ef.max_stun = f.max_stun;
    ef.max_rounds = f.max_rounds;
    ef.link = f.bandwidth;
    ef.codec = f.codec;
    auto eo = MakeEstimateOptions(ef);
    if (!eo.ok()) return UsageError(eo.status());
    progress.Note(fmt::format("dry run: observing the workload for {} before moving anything", f.sample));
    auto er = EstimateDevice(source, *eo, SystemClock());
    if (!er.ok()) {
      fmt::print(stderr, "gpumigrate demo: {}\n", er.status().message());
      return 1;
    }
    estimate = std::move(er).value();
    opt.source.switchover_fixed_cost = estimate->params.fixed_cost;
    progress.Note(fmt::format("estimate: {}, stun {:.1f} ms in {} rounds; now probing for real",
                              EstimateDecisionName(estimate->prediction.decision), estimate->prediction.mid.stun_ms,
                              estimate->prediction.mid.rounds.size()));
  }
  uint64_t kernels_at_start = source.KernelsRun();
  LocalMigrationResult res = MigrateLocally(source, dest, opt);
  progress.Finish();
  uint64_t source_kernels_during = source.KernelsRun() - kernels_at_start;

  // The destination keeps the workload going; then it checks its own memory.
  nlohmann::ordered_json dest_json;
  std::string dest_line;
  int exit_code = ExitCodeFor(res.source);
  if (res.source.outcome == Outcome::kCompleted) {
    SimPosition resumed_at = dest.Position();
    std::this_thread::sleep_for(*run_after);
    Status paused = dest.SetState(DeviceState::kStop);
    uint64_t kernels = dest.KernelsRun();
    auto check = paused.ok() ? dest.SelfCheck() : Result<uint64_t>(paused);
    dest_json["resumed_at_step"] = resumed_at.step;
    dest_json["resumed_at_layer"] = resumed_at.layer;
    dest_json["kernels_run_after_resume"] = kernels;
    dest_json["self_check"] = check.ok() ? "ok" : check.status().message();
    dest_line = fmt::format(
        "  destination: resumed at step {} layer {}, ran {} kernels in {:.1f} s; self-check of activation canaries: {}",
        resumed_at.step, resumed_at.layer, kernels, std::chrono::duration<double>(*run_after).count(),
        check.ok() ? fmt::format("ok ({} pages)", *check) : check.status().message());
    if (!check.ok()) exit_code = 1;
  }

  if (estimate) {
    if (f.json) {
      auto j = nlohmann::ordered_json::parse(ReportToJson(res.source));
      j["estimate"] = nlohmann::ordered_json::parse(EstimateToJson(*estimate));
      fmt::print("{}\n", j.dump());
    } else {
      PrintProbe(stdout, res.source, *estimate);
    }
    return res.source.status.ok() ? 0 : ExitCodeFor(res.source);
  }
  if (f.json) {
    auto j = nlohmann::ordered_json::parse(ReportToJson(res.source));
    j["source_kernels_during_migration"] = source_kernels_during;
    if (!dest_json.empty()) j["destination"] = dest_json;
    fmt::print("{}\n", j.dump());
  } else {
    PrintReport(stdout, "gpumigrate demo", res.source);
    fmt::print("  workload:   {} kernels ran on the source while it was being migrated\n", source_kernels_during);
    if (!dest_line.empty()) fmt::print("{}\n", dest_line);
  }
  if (res.source.outcome != Outcome::kCompleted && res.destination.outcome != Outcome::kAborted) {
    fmt::print(stderr, "destination: {} ({})\n", OutcomeName(res.destination.outcome),
               res.destination.status.message());
  }
  return exit_code;
}

}  // namespace gpumigrate::cli
