#include "cli/estimate_command.h"

#include "cli/estimate_plot.h"
#include "cli/gnuplot.h"
#include "cli/path_calibration.h"
#include "cli/print.h"
#include "cli/projection_print.h"
#include "cli/qemu_estimate.h"

#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/open_device.h"
#include "gpumigrate/sim.h"
#include "gpumigrate/units.h"

namespace gpumigrate::cli {

CLI::App* AddEstimateCommand(CLI::App& app, EstimateFlags& f) {
  auto* c = app.add_subcommand(
      "estimate",
      "Dry run: observe the device's dirty working set and data without sending anything, then predict the pre-copy "
      "rounds, total time and stun (with ranges) and decide: live-migrate, drain-and-replace or cannot-converge.");
  c->add_option("--device", f.device, "Device spec: sim:llm, sim:key=value,... (see `gpumigrate help demo`) or proc:PID")
      ->capture_default_str();
  c->add_option("--link", f.link,
                "Link speed to assume, e.g. 25Gbit or 2GiB/s (default: the in-process pipeline's calibrated rate)");
  c->add_option("--sample", f.sample, "How long to observe the workload")->capture_default_str();
  c->add_option("--interval", f.interval, "Dirty-log sync interval while observing (the shortest window of W(t))")
      ->capture_default_str();
  AddLimitFlags(c, f.limits);
  c->add_option("--project", f.project,
                "Apply the measured per-region behaviour to a device of this size, e.g. 8x80GB or 640GB (use with "
                "--link); every assumption is printed");
  c->add_option("--project-dirty", f.project_dirty,
                "With --project: scale the dirty working sets with the size (scale) or keep them as measured (same)")
      ->check(CLI::IsMember({"scale", "same"}))
      ->capture_default_str();
  c->add_flag("--project-per-gpu", f.project_per_gpu,
              "With --project NxSIZE: the measured device is one GPU; N GPUs hold N times its regions (scaled to "
              "SIZE) and dirty N times its rate");
  c->add_option("--kv-rate-per-gpu", f.kv_rate_per_gpu,
                "With --project NxSIZE: instead of the measured dirty rate, a KV cache appended at this rate per GPU, "
                "e.g. 200MB/s");
  c->add_option("--static-fraction", f.static_fraction,
                "With --kv-rate-per-gpu: the share of each GPU's memory never written (weights)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_flag("--project-table", f.project_table,
              "Print the projection for several GPU counts and links (with --project SIZE per GPU), beside "
              "stop-and-copy");
  c->add_option("--table-gpus", f.table_gpus, "GPU counts of the table")->capture_default_str();
  c->add_option("--table-links", f.table_links, "Links of the table")->capture_default_str();
  c->add_option("--plot", f.plot,
                "Also draw the prediction as a PNG (needs gnuplot): W(t) per region with the rounds' lengths, bytes "
                "per predicted round, bytes over time with the stun, the switchover rule against the target; with "
                "--project-table: the table as an SVG file");
  c->add_option("--target", f.target,
                "Host profile measured on the target (`gpumigrate calibrate --profile-out FILE` there); default: "
                "this host's, scaled to --cores");
  c->add_option("--cores", f.cores, "Cores per side available to the migration on the target (default: the profile's)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--streams", f.streams,
                "Data streams of the migration (of the projected one with --project; default: the migration's)")
      ->check(CLI::Range(1, 64));
  c->add_option("--nic", f.nic, "The target's NIC rate, when below the link");
  c->add_option("--per-stream", f.per_stream, "The most one data stream carries on the target, e.g. 25Gbit");
  c->add_option("--threads,--source-threads", f.threads,
                "The source's reading workers on the target, as `migrate --threads` (default: what migrate runs on "
                "--cores cores: one per core, at most 8)")
      ->check(CLI::Range(1, 4096));
  c->add_option("--read-rate", f.read_rate,
                "One core's rate reading the device on the target, e.g. 3GB/s (default: memcpy, from the profile)");
  c->add_flag("--shared-host", f.shared_host,
              "Source and destination share the target's cores (a migration over loopback, as the projection checks "
              "run)");
  c->add_option("--codec", f.codec,
                "The codec the migration will use: none, zstd[:LEVEL], shuffle[:LEVEL], bf16 or auto; the sampled "
                "ratios of every codec are shown either way")
      ->capture_default_str();
  c->add_option("--transport", f.transport,
                "The path the migration will take, measured once per configuration between two processes of this "
                "host and stored (tls: PSK TLS 1.3 with AES-GCM data; insecure: --insecure-no-tls; in-process: the "
                "in-process pipeline, no socket); with --streams, --codec and --link. With a target (--project, --cores, "
                "...): whether its pipeline seals with AES-GCM and crosses sockets")
      ->check(CLI::IsMember({"tls", "insecure", "in-process"}))
      ->capture_default_str();
  c->add_option("--warmup", f.warmup, "Let the workload run this long before observing")->capture_default_str();
  c->add_flag("--recalibrate", f.recalibrate, "Measure the fixed switchover cost and in-process bandwidth again");
  c->add_option("--qemu", f.qemu,
                "The QEMU VM (its QMP socket) whose device memory --device shm:PATH is: also measure its guest RAM and "
                "dirty rate over QMP (no migration is started) and predict the guest-visible stun");
  c->add_option("--qemu-dirty-sample", f.qemu_dirty_sample,
                "With --qemu: how long QEMU samples the guest's RAM dirty rate (whole seconds)")
      ->capture_default_str();
  c->add_option("--content-store-hint", f.content_store_hint,
                "What the destination's content store holds (receive --content-store): 'static' (every static "
                "region, the weights), or REGION=SHARE,... (e.g. weights=1,kv_cache=0.1): round 0 offers those pages "
                "by SHA-256 instead of sending them");
  c->add_flag("--json", f.json, "Print one JSON object on stdout");
  return c;
}

Result<ProjectedSize> ParseProjectedSize(const std::string& text) {
  ProjectedSize p;
  size_t x = text.find_first_of("xX*");
  if (x == std::string::npos) {
    GM_ASSIGN_OR_RETURN(p.bytes_per_gpu, ParseSize(text));
    return p;
  }
  auto count = ParseUint(std::string_view(text).substr(0, x), 1);
  if (!count.ok() || *count > 4096) {
    return InvalidArgument(fmt::format("--project: '{}' should be SIZE or COUNTxSIZE, e.g. 8x80GB", text));
  }
  p.gpus = static_cast<uint32_t>(*count);
  GM_ASSIGN_OR_RETURN(p.bytes_per_gpu, ParseSize(text.substr(x + 1)));
  return p;
}

namespace {

// "static" | "NAME[=SHARE][,NAME[=SHARE]...]" (SHARE 0..1, default 1).
Result<std::map<std::string, double>> ParseContentHint(const std::string& text) {
  std::map<std::string, double> hint;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    double share = 1;
    if (eq != std::string::npos) {
      auto v = ParseDouble(item.substr(eq + 1));
      if (!v.ok() || *v < 0 || *v > 1) {
        return InvalidArgument(fmt::format("--content-store-hint {}: '{}' is not a share between 0 and 1", text,
                                           item.substr(eq + 1)));
      }
      share = *v;
    }
    if (name.empty()) return InvalidArgument(fmt::format("--content-store-hint {}: an empty region name", text));
    hint[name] = share;
    start = end + 1;
  }
  return hint;
}

Status SetProjection(const EstimateFlags& f, EstimateOptions& o) {
  using M = WorkloadProjection::Mode;
  GM_ASSIGN_OR_RETURN(ProjectedSize ps, ParseProjectedSize(f.project));
  o.project = true;
  o.workload.gpus = ps.gpus;
  o.workload.bytes_per_gpu = ps.bytes_per_gpu;
  o.workload.mode = f.project_dirty == "scale" ? M::kScale : M::kSame;
  if (f.project_per_gpu) o.workload.mode = M::kPerGpu;
  if (!f.kv_rate_per_gpu.empty()) {
    if (f.project_per_gpu) return InvalidArgument("--kv-rate-per-gpu and --project-per-gpu exclude each other");
    o.workload.mode = M::kExplicit;
    GM_ASSIGN_OR_RETURN(o.workload.kv_rate_per_gpu, ParseRateBytesPerS(f.kv_rate_per_gpu));
    o.workload.static_fraction = f.static_fraction;
  }
  return Status::Ok();
}

Status SetTarget(const EstimateFlags& f, EstimateOptions& o) {
  HostProfile hp;
  TargetSpec t;
  if (f.target.empty()) {
    GM_ASSIGN_OR_RETURN(hp, LoadOrMeasureHostProfile(f.recalibrate));
    t.rates_source = fmt::format("measured on this host ({}, {} cores, {}){}", hp.host, hp.cores, hp.measured_at,
                                 f.cores && f.cores != hp.cores ? fmt::format(", scaled to {} cores", f.cores) : "");
  } else {
    GM_ASSIGN_OR_RETURN(hp, LoadHostProfile(f.target));
    t.rates_source = fmt::format("from {} (measured on {}, {} cores, {})", f.target, hp.host, hp.cores,
                                 hp.measured_at);
  }
  t.per_core = hp.per_core;
  t.cores = f.cores ? f.cores : hp.cores;
  // Without --streams, one stream per core of the target (at most 64): the
  // migration's own default follows the cores of the host it runs on.
  t.streams = f.streams ? f.streams : std::min<uint32_t>(64, t.cores);
  if (!f.nic.empty()) {
    GM_ASSIGN_OR_RETURN(t.nic_bytes_per_s, ParseRateBytesPerS(f.nic));
  }
  if (!f.per_stream.empty()) {
    GM_ASSIGN_OR_RETURN(t.per_stream_bytes_per_s, ParseRateBytesPerS(f.per_stream));
  }
  t.shared_host = f.shared_host;
  t.encrypted = f.transport != "insecure";  // integrity tags only: no AES-GCM stage
  t.network = f.transport != "in-process";
  t.source_workers = f.threads;
  if (!f.read_rate.empty()) {
    GM_ASSIGN_OR_RETURN(t.device_read_bytes_per_s, ParseRateBytesPerS(f.read_rate));
  }
  o.target = t;
  return Status::Ok();
}

}  // namespace

Result<EstimateOptions> MakeEstimateOptions(const EstimateFlags& f) {
  EstimateOptions o;
  GM_ASSIGN_OR_RETURN(o.sample.sample, ParseDuration(f.sample));
  GM_ASSIGN_OR_RETURN(o.sample.interval, ParseDuration(f.interval));
  if (o.sample.interval.count() <= 0 || o.sample.sample < o.sample.interval) {
    return InvalidArgument("--sample must be at least one --interval long");
  }
  GM_ASSIGN_OR_RETURN(SwitchoverLimits limits, ParseLimitFlags(f.limits));
  o.downtime_target = limits.downtime_target;
  o.max_stun = limits.max_stun;
  o.max_rounds = limits.max_rounds;
  if (!f.link.empty()) {
    GM_ASSIGN_OR_RETURN(o.link_bytes_per_s, ParseRateBytesPerS(f.link));
    o.link_text = f.link;
  }
  o.recalibrate = f.recalibrate;
  GM_ASSIGN_OR_RETURN(o.codec, ParseCodecChoice(f.codec));
  o.sample.codec_level = o.codec.level;
  if (!f.project.empty()) GM_RETURN_IF_ERROR(SetProjection(f, o));
  if (!f.content_store_hint.empty()) {
    GM_ASSIGN_OR_RETURN(o.content_store_hint, ParseContentHint(f.content_store_hint));
  }
  if (f.project_table && !o.project) return InvalidArgument("--project-table needs --project SIZE (per GPU)");
  if ((f.project_per_gpu || !f.kv_rate_per_gpu.empty()) && !o.project) {
    return InvalidArgument("--project-per-gpu and --kv-rate-per-gpu need --project COUNTxSIZE");
  }
  if (o.project || !f.target.empty() || f.cores || !f.nic.empty() || !f.per_stream.empty() || f.shared_host ||
      f.threads != 0 || !f.read_rate.empty()) {
    GM_RETURN_IF_ERROR(SetTarget(f, o));
  }
  return o;
}

Result<EstimateOptions> ProbeEstimateOptions(const SourceFlags& src, const std::string& sample) {
  EstimateFlags ef;
  ef.sample = sample;
  ef.limits = src.limits;
  ef.link = src.bandwidth;
  ef.codec = src.codec;
  return MakeEstimateOptions(ef);
}

PathConfig PathConfigFor(const std::string& transport, uint32_t streams, const CodecChoice& codec,
                         double cap_bytes_per_s, const std::string& device) {
  PathConfig c;
  c.transport = transport;
  c.streams = streams ? streams : DefaultStreams();
  c.codec = codec.ToString();
  c.cap_bytes_per_s = cap_bytes_per_s;
  c.backend = PathBackendFor(device);
  return c;
}

Status AttachPathCalibration(const std::string& transport, uint32_t streams, const std::string& device,
                             EstimateOptions& o) {
  if (transport == "in-process" || o.target) return Status::Ok();
  PathConfig config = PathConfigFor(transport, streams, o.codec, o.link_bytes_per_s, device);
  if (config.backend == "proc") {
    auto stored = LoadPathCalibration(config);
    const bool have = !o.recalibrate && stored.ok() && stored->has_value();
    if (auto wl = PathCalibrationWorkload(); !have && !wl.ok()) {
      o.path_note = fmt::format(
          "the proc backend's own costs (its shim's stop and resume, the last dirty scan, adoption, scattered 4 KiB "
          "pages) are not calibrated: {}; the sim path's figures stand in for them",
          wl.status().message());
      Print(stderr, "gpumigrate estimate: {}\n", o.path_note);
      config.backend = "sim";
    }
  }
  bool now = false;
  GM_ASSIGN_OR_RETURN(PathCalibration c, LoadOrMeasurePath(config, o.recalibrate, stderr, &now));
  o.path = std::move(c);
  o.path_measured_now = now;
  auto observations = LoadPathObservations();
  if (observations.ok()) {
    o.path_spread = SpreadFor(config, *observations);
  } else {
    Print(stderr, "gpumigrate estimate: {}; the ranges leave this host's run-to-run spread out\n",
          observations.status().message());
  }
  return Status::Ok();
}

std::optional<PathCalibration> StoredPathFor(const PathConfig& path) {
  PathConfig p = path;
  for (int i = 0; i < 2; ++i, p.backend = "sim") {
    auto stored = LoadPathCalibration(p);
    if (stored.ok() && stored->has_value()) return **stored;
  }
  return std::nullopt;
}

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
    if (Status s = AttachPathCalibration(f.transport, f.streams, f.device, *opts); !s.ok()) {
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
