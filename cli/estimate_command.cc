#include "cli/estimate_command.h"

#include "cli/estimate_plot.h"
#include "cli/gnuplot.h"
#include "cli/path_calibration.h"
#include "cli/print.h"
#include "cli/projection_print.h"
#include "cli/qemu_estimate.h"

#include <thread>

#include <fmt/format.h>

#include "gpumigrate/devices/open_device.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

namespace {

std::string Range(double lo, double mid, double hi, const char* unit) {
  return fmt::format("{:.1f} {} (range {:.1f} to {:.1f})", mid, unit, lo, hi);
}

}  // namespace

namespace {

// The memory moved beside the device (a QEMU guest's RAM) and what it does to the stun.
void PrintBeside(FILE* out, const EstimateReport& r) {
  const BesideMemory& b = r.params.beside;
  const ModelRun& m = r.prediction.mid;
  Print(out, "  beside:     {} {}, dirtied at {}, shares the link ({:.0f}% while both send)\n", b.name,
        FormatBytes(b.bytes), FormatRate(b.dirty_bytes_per_s), b.link_share * 100);
  if (m.beside_paused_first) {
    Print(out, "              its first pass ends first: the guest pauses and stays stopped {:.0f} ms until the "
               "device's round ends\n",
          m.stopped_before_switchover_ms);
  } else {
    Print(out, "              the engine's rule says go first; then {:.0f} ms until the guest pauses (running), the "
               "switchover held for about {} more round{}\n",
          m.converge_ms, m.held_rounds, m.held_rounds == 1 ? "" : "s");
  }
  Print(out, "              {} of it sent, {} during the stun; the device's final round alone: {:.1f} ms\n",
        FormatBytes(m.beside_bytes), FormatBytes(m.beside_final_bytes), m.device_stun_ms);
}

}  // namespace

void PrintEstimate(FILE* out, const EstimateReport& r) {
  const Prediction& p = r.prediction;
  Print(out, "gpumigrate estimate: {}\n", EstimateDecisionName(p.decision));
  Print(out, "  {}\n", p.explanation);
  Print(out, "  device:     {}\n", r.modelled.device);
  Print(out, "  observed:   {:.2f} s in {} dirty-log syncs; nothing was sent\n", r.measured.sample_s,
             r.measured.syncs);
  Print(out, "  bandwidth:  {}\n", r.link_source);
  if (r.pipeline) {
    for (const auto& l : r.pipeline->limits) {
      Print(out, "    {:<16} {:>12}  {}{}\n", l.name, FormatRate(l.raw_bytes_per_s), l.detail,
            l.name == r.pipeline->binds ? "  <- binds" : "");
    }
  }
  if (r.path) {
    Print(out, "  switchover: {:.1f} ms fixed + the final round at {}; later rounds cost {:.1f} ms each beyond their "
               "bytes{}\n",
          r.path->fixed_ms, FormatRate(r.path->final_bytes_per_s), r.path->round_overhead_ms,
          r.path_measured_now ? " (path calibrated just now)" : "");
  } else {
    Print(out, "  fixed switchover cost: {:.2f} ms{}\n",
          std::chrono::duration<double, std::milli>(r.params.fixed_cost).count(),
          r.calibrated_now ? " (calibrated just now)" : "");
  }
  Print(out, "  {:<12} {:>10} {:>9}   dirty working set W(t), median\n", "region", "size", "non-zero");
  for (const auto& rp : r.modelled.regions) {
    std::string w;
    for (size_t i = 0; i < rp.dirty.window_s.size(); i += 2) {
      w += fmt::format("{}{:.0f}ms:{}", w.empty() ? "" : "  ", rp.dirty.window_s[i] * 1e3,
                       FormatBytes(rp.dirty.mid_bytes[i]));
    }
    Print(out, "  {:<12} {:>10} {:>8.0f}%   {}\n", rp.info.name, FormatBytes(static_cast<double>(rp.info.size_bytes)),
               rp.nonzero_fraction * 100, w);
  }
  Print(out, "  compression (sampled, zstd / shuffle+zstd / bf16 ratio at speed; what the model applies):\n");
  for (const auto& rp : r.modelled.regions) {
    if (rp.nonzero_fraction == 0) continue;
    Print(out, "    {:<12} zstd {:.2f} at {}, shuffle {:.2f} at {}, bf16 {:.2f} at {}; model: {} x{:.2f}\n",
               rp.info.name, rp.codecs.zstd_ratio, FormatRate(rp.codecs.zstd_bytes_per_s), rp.codecs.shuffle_ratio,
               FormatRate(rp.codecs.shuffle_bytes_per_s), rp.codecs.bf16_ratio, FormatRate(rp.codecs.bf16_bytes_per_s),
               rp.codec, rp.compression_ratio);
  }
  Print(out, "  prediction: {} pre-copy rounds, then stop ({})\n", p.mid.rounds.size(),
             p.mid.beside_paused_first ? std::string_view("QEMU paused the guest") : StopReasonName(p.mid.stop_reason));
  Print(out, "  {:>6}  {:>12}  {:>10}\n", "round", "bytes", "ms");
  for (const auto& x : p.mid.rounds) {
    Print(out, "  {:>6}  {:>12}  {:>10.1f}\n", x.round, FormatBytes(x.bytes), x.seconds * 1e3);
  }
  Print(out, "  {:>6}  {:>12}  {:>10.1f}  (stunned)\n", "final", FormatBytes(p.mid.final_bytes), p.mid.stun_ms);
  if (r.params.beside.bytes > 0) PrintBeside(out, r);
  Print(out, "  stun:       {}{}\n", Range(p.stun_low_ms, p.mid.stun_ms, p.stun_high_ms, "ms"),
        r.params.beside.bytes > 0 ? " guest-visible" : "");
  if (p.alternative) {
    Print(out, "              near the target: the engine may run {} rounds instead (stun {:.1f} ms), in the range\n",
          p.alternative->rounds.size(), p.alternative->stun_ms);
  }
  Print(out, "  total:      {}\n", Range(p.total_low_ms / 1e3, p.mid.total_ms / 1e3, p.total_high_ms / 1e3, "s"));
  Print(out, "  assumptions:\n");
  for (const auto& a : r.assumptions) Print(out, "    - {}\n", a);
}

namespace {

int RunProjectionTable(const EstimateFlags& f, const EstimateOptions& o, Device& device) {
  auto gpus = ParseGpuList(f.table_gpus);
  auto links = ParseLinkList(f.table_links);
  if (!gpus.ok() || !links.ok()) {
    Print(stderr, "gpumigrate estimate: {}\n", (!gpus.ok() ? gpus.status() : links.status()).message());
    return 2;
  }
  auto cal = LoadOrCalibrate(o.recalibrate);
  if (!cal.ok()) {
    Print(stderr, "gpumigrate estimate: {}\n", cal.status().message());
    return 1;
  }
  auto measured = ProfileDevice(device, o.sample, SystemClock());
  auto table = measured.ok() ? ProjectTable(*measured, o, *cal, *gpus, *links) : Result<ProjectionTable>(measured.status());
  if (!table.ok()) {
    Print(stderr, "gpumigrate estimate: {}\n", table.status().message());
    return 1;
  }
  if (f.json) {
    Print("{}\n", ProjectionTableToJson(*table));
  } else {
    PrintProjectionTable(stdout, *table);
  }
  if (!f.plot.empty()) {
    if (Status s = WriteProjectionSvg(*table, f.plot); !s.ok()) {
      Print(stderr, "gpumigrate estimate: {}\n", s.message());
      return 1;
    }
    Print(stderr, "plot written to {}\n", f.plot);
  }
  return 0;
}

}  // namespace

int RunEstimate(const EstimateFlags& f) {
  if (!f.qemu.empty() || f.device.rfind("shm:", 0) == 0) return RunQemuEstimate(f);
  auto opts = MakeEstimateOptions(f);
  auto warmup = ParseDuration(f.warmup);
  if (!opts.ok() || !warmup.ok()) {
    Print(stderr, "gpumigrate estimate: {}\n", (!opts.ok() ? opts.status() : warmup.status()).message());
    return 2;
  }
  if (!f.plot.empty() && !f.project_table) {  // before observing: never an estimate only to fail at its picture
    if (Status p = CheckPlotTarget(f.plot); !p.ok()) {
      Print(stderr, "gpumigrate estimate: {}\n", p.message());
      return 2;
    }
  }
  auto dev = OpenDevice(f.device, true);
  if (!dev.ok()) {
    Print(stderr, "gpumigrate estimate: {}\n", dev.status().message());
    return 2;
  }
  if (!opts->content_store_hint.empty()) {
    // Names checked against the device before anything is measured: a usage error.
    DeviceProfile shape;
    for (const RegionInfo& r : dev->device->Regions()) shape.regions.push_back(RegionProfile{.info = r});
    if (Status s = ApplyContentHint(opts->content_store_hint, shape); !s.ok()) {
      Print(stderr, "gpumigrate estimate: {}\n", s.message());
      return 2;
    }
  }
  if (!f.project_table) {
    if (Status s = AttachPathCalibration(f.transport, f.streams, f.device, *opts, PathPrograms("estimate"));
        !s.ok()) {
      Print(stderr, "gpumigrate estimate: {}\n", s.message());
      return 1;
    }
  }
  Print(stderr, "observing {} for {} (after {} warm-up)...\n", dev->device->Describe(), f.sample, f.warmup);
  std::this_thread::sleep_for(*warmup);
  if (f.project_table) return RunProjectionTable(f, *opts, *dev->device);
  auto report = EstimateDevice(*dev->device, *opts, SystemClock());
  if (!report.ok()) {
    Print(stderr, "gpumigrate estimate: {}\n", report.status().message());
    return 1;
  }
  if (f.json) {
    Print("{}\n", EstimateToJson(*report));
  } else {
    PrintEstimate(stdout, *report);
  }
  DrawEstimatePlot(f.plot, *report, fmt::format("gpumigrate estimate --device {}", f.device));
  return 0;
}

}  // namespace gpumigrate::cli
