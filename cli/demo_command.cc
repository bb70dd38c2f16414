#include "cli/demo_command.h"

#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/progress.h"
#include "cli/report_print.h"
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
  c->add_option("--verify", f.verify,
                "digest: the destination checks per-page digests of all it applied; full: also re-read the whole "
                "source at stop and compare (lengthens the stun; shown as its own line)")
      ->check(CLI::IsMember({"digest", "full"}))
      ->capture_default_str();
  c->add_option("--warmup", f.warmup, "Let the workload run this long before migrating")->capture_default_str();
  c->add_option("--run-after", f.run_after,
                "Let the workload run this long on the destination, then pause it and run its memory self-check")
      ->capture_default_str();
  c->add_flag("--json", f.json, "Print one JSON object with the report on stdout (progress stays on stderr)");
  return c;
}

namespace {

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
