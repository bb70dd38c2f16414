// `gpumigrate estimate`'s flags: their registration, and their parsing into the
// estimator's options (shared with `demo --dry-run`'s probe).
#include <algorithm>
#include <map>
#include <string>

#include <fmt/format.h>

#include "cli/estimate_command.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/estimator/projection.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {
namespace {

// What to observe and for how long, the link and the switchover limits.
void AddEstimateObservationFlags(CLI::App* c, EstimateFlags& f) {
  c->add_option("--device", f.device, "Device spec: sim:llm, sim:key=value,... (see `gpumigrate help demo`) or proc:PID")
      ->capture_default_str();
  c->add_option("--link", f.link,
                "Link speed to assume, e.g. 25Gbit or 2GiB/s (default: the in-process pipeline's calibrated rate)");
  c->add_option("--sample", f.sample, "How long to observe the workload")->capture_default_str();
  c->add_option("--interval", f.interval, "Dirty-log sync interval while observing (the shortest window of W(t))")
      ->capture_default_str();
  AddLimitFlags(c, f.limits);
}

// --project and its table: the measured behaviour applied to a larger device.
void AddEstimateProjectionFlags(CLI::App* c, EstimateFlags& f) {
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
}

// The target host a projection runs on: its profile, cores, streams and rates.
void AddEstimateTargetFlags(CLI::App* c, EstimateFlags& f) {
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
  c->add_option("--destination-threads", f.destination_threads,
                "The destination's workers on the target, as `receive --threads` (default: what receive runs there: "
                "the cores the data streams' threads leave, at most 8; 0: each stream's thread does it all)")
      ->check(CLI::Range(0, 4096));
  c->add_option("--read-rate", f.read_rate,
                "One core's rate reading the device on the target, e.g. 3GB/s (default: memcpy, from the profile)");
  c->add_flag("--shared-host", f.shared_host,
              "Source and destination share the target's cores (a migration over loopback, as the projection checks "
              "run)");
}

// The migration's path (codec, transport), the QEMU guest beside the device, and the output.
void AddEstimatePathFlags(CLI::App* c, EstimateFlags& f) {
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
}

}  // namespace

CLI::App* AddEstimateCommand(CLI::App& app, EstimateFlags& f) {
  auto* c = app.add_subcommand(
      "estimate",
      "Dry run: observe the device's dirty working set and data without sending anything, then predict the pre-copy "
      "rounds, total time and stun (with ranges) and decide: live-migrate, drain-and-replace or cannot-converge.");
  AddEstimateObservationFlags(c, f);
  AddEstimateProjectionFlags(c, f);
  AddEstimateTargetFlags(c, f);
  AddEstimatePathFlags(c, f);
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
  if (f.destination_threads >= 0) t.destination_workers = static_cast<uint32_t>(f.destination_threads);
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
      f.threads != 0 || f.destination_threads >= 0 || !f.read_rate.empty()) {
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

}  // namespace gpumigrate::cli
