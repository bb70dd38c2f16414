// EstimateDevice: the dry run end to end (measure, choose bandwidth and fixed
// cost, optionally project, predict) and its JSON form for automation.
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/codec_choice/codec_choice.h"
#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/session/session.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {

namespace {

double SampledRatio(const CodecSample& s, CodecKind k) {
  const CodecInfo& c = CodecOf(k);
  return c.compresses() ? s.*c.sampled_ratio : 1.0;
}

// Each region's codec and its sampled ratio; returns the device's raw bytes over
// its wire bytes.
double ChoosePathCodecs(const EstimateOptions& o, EstimateReport& r) {
  double raw = 0, wire = 0;
  for (auto& rp : r.modelled.regions) {
    CodecKind k = ChooseRegionCodec(o.codec, rp.codecs, o.link_bytes_per_s);
    rp.codec = std::string(CodecKindName(k));
    rp.compression_ratio = std::max(1.0, SampledRatio(rp.codecs, k));
    const double bytes = static_cast<double>(rp.info.size_bytes) * rp.nonzero_fraction;
    raw += bytes;
    wire += bytes / rp.compression_ratio;
  }
  return wire > 0 ? raw / wire : 1.0;
}

// The path's round and stun rates and costs as the model's parameters (the wire
// rates scaled by `scale`), and the link the report names.
void SetPathParams(const EstimateOptions& o, const PathCalibration& c, double scale, EstimateReport& r) {
  ModelParams& p = r.params;
  p.bandwidth_mid = c.bytes_per_s * scale;
  p.bandwidth_low = c.low_bytes_per_s * scale;
  p.bandwidth_high = c.high_bytes_per_s * scale;
  p.fixed_cost = std::chrono::nanoseconds(static_cast<int64_t>(c.fixed_ms * 1e6));
  p.path.round0_startup_s = c.round0_startup_ms / 1e3;
  p.path.round_overhead_s = c.round_overhead_ms / 1e3;
  p.path.fixed_ms[0] = c.fixed_low_ms;
  p.path.fixed_ms[1] = c.fixed_ms;
  p.path.fixed_ms[2] = c.fixed_high_ms;
  p.path.final_bytes_per_s[0] = c.final_high_bytes_per_s;
  p.path.final_bytes_per_s[1] = c.final_bytes_per_s;
  p.path.final_bytes_per_s[2] = c.final_low_bytes_per_s;
  p.path.sync_extra_ms = std::max(0.0, r.modelled.sync_ms - c.final_sync_ms);
  r.pipeline_bytes_per_s = p.bandwidth_mid;
  r.link = o.link_text.empty() ? fmt::format("{:.0f}B/s", p.bandwidth_mid) : o.link_text;
  r.link_source = fmt::format("path {}, measured between two processes: {} (runs ranged {} to {}){}", c.config.Key(),
                              FormatRate(p.bandwidth_mid), FormatRate(p.bandwidth_low), FormatRate(p.bandwidth_high),
                              o.link_bytes_per_s > 0 ? fmt::format(", capped as --link {} ({})", o.link_text,
                                                                   FormatRate(o.link_bytes_per_s))
                                                     : std::string());
}

// What the path calibration's rounds, stun and dirty-log sync assume, as the
// report's assumptions.
void PathAssumptions(const EstimateOptions& o, const PathCalibration& c, EstimateReport& r) {
  const ModelParams& p = r.params;
  r.assumptions.push_back(fmt::format(
      "the path {} as measured {} ({} migrations between two processes of this host): round 0 lasts {:.0f} ms of "
      "startup plus its bytes at {}; each later round costs {:.1f} ms beyond its bytes at that rate",
      c.config.Key(), c.measured_at, c.runs, c.round0_startup_ms, FormatRate(c.bytes_per_s), c.round_overhead_ms));
  r.assumptions.push_back(fmt::format(
      "the stun is {:.1f} ms (range {:.1f} to {:.1f}) fixed plus the final round's bytes at {} (range {} to {}): a "
      "final round of megabytes does not reach round 0's rate; the engine's switchover rule assumes {:.1f} ms fixed, "
      "as `migrate` loads it for this path",
      c.fixed_ms, c.fixed_low_ms, c.fixed_high_ms, FormatRate(c.final_bytes_per_s), FormatRate(c.final_low_bytes_per_s),
      FormatRate(c.final_high_bytes_per_s), c.fixed_ms));
  if (!o.path_note.empty()) r.assumptions.push_back(o.path_note);
  if (p.path.sync_extra_ms >= 1) {
    r.assumptions.push_back(fmt::format(
        "a dirty-log sync of this device took {:.1f} ms in the dry run, the calibration device's final one {:.1f} ms: "
        "the stun's final sync and each round after round 0 take {:.1f} ms longer",
        r.modelled.sync_ms, c.final_sync_ms, p.path.sync_extra_ms));
  }
}

// Widens the ranges by this host's recorded run-to-run spread, when there is one
// (else says they span the calibration's own runs only).
void WidenBySpread(const EstimateOptions& o, const PathCalibration& c, double scale, EstimateReport& r) {
  ModelParams& p = r.params;
  if (o.path_spread) {
    // The calibration's runs are back to back; migrations later on this host
    // strayed from them by this much: the ranges hold it.
    const PathSpread& s = *o.path_spread;
    const double cap = c.config.cap_bytes_per_s > 0 ? c.config.cap_bytes_per_s * scale : INFINITY;
    p.bandwidth_low = std::min(p.bandwidth_low, p.bandwidth_mid * s.round0_low);
    p.bandwidth_high = std::min(cap, std::max(p.bandwidth_high, p.bandwidth_mid * s.round0_high));
    p.path.fixed_ms[0] = std::min(p.path.fixed_ms[0], c.fixed_ms * s.stun_low);
    p.path.fixed_ms[2] = std::max(p.path.fixed_ms[2], c.fixed_ms * s.stun_high);
    p.path.final_bytes_per_s[0] = std::max(p.path.final_bytes_per_s[0], c.final_bytes_per_s / s.stun_low);
    p.path.final_bytes_per_s[2] = std::min(p.path.final_bytes_per_s[2], c.final_bytes_per_s / s.stun_high);
    r.assumptions.push_back(fmt::format(
        "the ranges hold this host's run-to-run spread: {} migrations on {} recorded round 0 at {:.2f}x to {:.2f}x "
        "their calibration's rate and a stun {:.2f}x to {:.2f}x what it predicts for their final round",
        s.observations, s.pool, s.round0_low, s.round0_high, s.stun_low, s.stun_high));
  } else {
    r.assumptions.push_back(
        "the ranges span the calibration's own runs only, measured back to back: fewer than 3 migrations on this "
        "host's paths of this kind are recorded, and a later run may stray further");
  }
}

// Rates and costs from the path calibration (path_calibration.h): the round rate
// measured across two processes with this transport, streams, codec and cap. The
// codec's CPU cost is in that rate, so regions get their sampled ratios; when
// uncapped the pipeline is CPU-bound and its raw rate holds, so the wire rate
// scales with the calibration device's ratio over this device's.
void PathBandwidth(const EstimateOptions& o, const PathCalibration& c, EstimateReport& r) {
  const double ratio = ChoosePathCodecs(o, r);
  const double scale = c.config.cap_bytes_per_s <= 0 && (c.wire_ratio > 1.001 || ratio > 1.001) ? c.wire_ratio / ratio
                                                                                                 : 1.0;
  SetPathParams(o, c, scale, r);
  PathAssumptions(o, c, r);
  WidenBySpread(o, c, scale, r);
  if (scale != 1.0) {
    r.assumptions.push_back(fmt::format(
        "uncapped, the codec's CPU binds: the raw rate holds, so the wire rate is scaled by the calibration data's "
        "ratio over this device's ({:.2f} / {:.2f})",
        c.wire_ratio, ratio));
  }
  r.assumptions.push_back(
      o.codec.mode == CodecChoice::Mode::kNone
          ? std::string("no compression (--codec none); the sampled ratios are shown for comparison")
          : fmt::format("codec {}: each region's sampled ratio; its CPU cost is in the path's measured rate",
                        o.codec.ToString()));
}

// Bandwidth from this host's calibrated in-process pipeline, capped by --link.
void CalibratedBandwidth(const EstimateOptions& o, const Calibration& cal, EstimateReport& r) {
  ModelParams& p = r.params;
  if (o.link_bytes_per_s > 0) {
    // The pipeline (read, hash, frame, apply) can be slower than the link: the
    // migration runs at the slower of the two.
    double pipe = cal.inprocess_bytes_per_s;
    double rate = std::min(o.link_bytes_per_s, pipe);
    p.bandwidth_mid = rate;
    r.link = o.link_text;
    p.bandwidth_high = std::min(o.link_bytes_per_s, std::max(pipe, cal.inprocess_high_bytes_per_s));
    p.bandwidth_low = 0.9 * std::min(o.link_bytes_per_s, std::min(pipe, cal.inprocess_low_bytes_per_s));
    r.link_source = fmt::format("--link {} ({}){}", o.link_text, FormatRate(o.link_bytes_per_s),
                                rate < o.link_bytes_per_s
                                    ? fmt::format(", limited by this host's pipeline to {}", FormatRate(rate))
                                    : std::string());
    r.assumptions.push_back(fmt::format(
        "the migration runs at the slower of the link ({}) and this host's calibrated pipeline ({}); the "
        "pessimistic bound takes 90% of the slowest",
        FormatRate(o.link_bytes_per_s), FormatRate(pipe)));
  } else {
    p.bandwidth_mid = cal.inprocess_bytes_per_s;
    p.bandwidth_low = std::min(cal.inprocess_low_bytes_per_s, cal.inprocess_bytes_per_s);
    p.bandwidth_high = std::max(cal.inprocess_high_bytes_per_s, cal.inprocess_bytes_per_s);
    r.link_source = fmt::format("in-process pipeline, calibrated: {} (runs ranged {} to {})",
                                FormatRate(p.bandwidth_mid), FormatRate(p.bandwidth_low),
                                FormatRate(p.bandwidth_high));
    r.link = fmt::format("{:.0f}B/s", p.bandwidth_mid);
    r.assumptions.push_back("no --link given: the bandwidth of an in-process migration on this host, as calibrated");
  }
}

// Compression: the ratio a codec effectively reaches on this link, capped by
// how fast it compresses (min(ratio, speed / link)).
void CalibratedCodecs(const EstimateOptions& o, EstimateReport& r) {
  for (auto& rp : r.modelled.regions) {
    CodecKind k = ChooseRegionCodec(o.codec, rp.codecs, o.link_bytes_per_s);
    rp.codec = std::string(CodecKindName(k));
    // A region with no sampled non-zero page has no ratio (0): it has nothing to
    // compress, and dividing its bytes by 0 made every prediction NaN.
    const double e = k == CodecKind::kNone ? 1.0 : EffectiveRatio(rp.codecs, k, r.params.bandwidth_mid);
    rp.compression_ratio = e > 0 ? e : 1.0;
  }
  r.assumptions.push_back(
      o.codec.mode == CodecChoice::Mode::kNone
          ? std::string("no compression (--codec none); the sampled ratios are shown for comparison")
          : fmt::format("codec {}: each region's sampled ratio, capped by its measured compression speed over the "
                        "link (min(ratio, speed / bandwidth))",
                        o.codec.ToString()));
}


// Bandwidth and codecs from the target's pipeline: per-core stage rates times
// the cores the streams can use, the link, the NIC. The codec's CPU cost is in
// the pipeline, so regions get their sampled ratios uncapped.
Status TargetBandwidth(const EstimateOptions& o, EstimateReport& r) {
  TargetSpec t = *o.target;
  t.link_bytes_per_s = o.link_bytes_per_s;
  double raw = 0, wire = 0;
  std::map<CodecKind, double> raw_by_codec;
  for (auto& rp : r.modelled.regions) {
    CodecKind k = ChooseRegionCodec(o.codec, rp.codecs, o.link_bytes_per_s);
    rp.codec = std::string(CodecKindName(k));
    rp.compression_ratio = std::max(1.0, SampledRatio(rp.codecs, k));
    const double bytes = static_cast<double>(rp.info.size_bytes) * rp.nonzero_fraction;
    raw += bytes;
    wire += bytes / rp.compression_ratio;
    raw_by_codec[k] += bytes;
  }
  // The codec most of the data uses sets the pipeline's stages; the ratio is the data's overall one.
  CodecKind main = CodecKind::kNone;
  for (const auto& [k, b] : raw_by_codec) {
    if (b > raw_by_codec[main]) main = k;
  }
  const double ratio = wire > 0 ? raw / wire : 1.0;
  GM_ASSIGN_OR_RETURN(PipelineBound b, TargetPipeline(t, main, ratio));
  ModelParams& p = r.params;
  p.bandwidth_mid = b.wire_bytes_per_s;
  p.bandwidth_high = b.wire_bytes_per_s;
  p.bandwidth_low = 0.9 * b.wire_bytes_per_s;
  r.link = o.link_text.empty() ? fmt::format("{:.0f}B/s", b.wire_bytes_per_s) : o.link_text;
  r.link_source = fmt::format("target pipeline: {} raw ({} on the wire), bound by the {}", FormatRate(b.raw_bytes_per_s),
                              FormatRate(b.wire_bytes_per_s), b.binds);
  const uint32_t workers = t.source_workers ? t.source_workers : DefaultSourceWorkers(t.cores);
  const uint32_t dst_workers = DestinationWorkersOf(t);
  r.assumptions.push_back(fmt::format(
      "target: {} cores per side, {} data streams, {} source worker{} ({}; the session thread copies frames, one "
      "thread per stream seals and sends), {}{}, per-core stage rates {}; the pipeline runs at the lowest of its "
      "limits, here the {}; the pessimistic bound takes 90% of it",
      t.cores, t.streams, workers, workers == 1 ? "" : "s",
      t.source_workers ? "--threads" : "what migrate runs on that many cores",
      dst_workers == 0 ? std::string("each destination stream's thread opens and writes its own frames")
                       : fmt::format("{} destination worker{} open and write what the streams' threads receive",
                                     dst_workers, dst_workers == 1 ? "" : "s"),
      t.device_read_bytes_per_s > 0 ? fmt::format(", the device read at {} per core",
                                                  FormatRate(t.device_read_bytes_per_s))
                                    : std::string(),
      t.rates_source, b.binds));
  r.assumptions.push_back(
      o.codec.mode == CodecChoice::Mode::kNone
          ? std::string("no compression (--codec none)")
          : fmt::format("codec {}: each region's sampled ratio; its CPU cost is a stage of the target's pipeline",
                        o.codec.ToString()));
  r.pipeline = std::move(b);
  return Status::Ok();
}

// What the model does with memory moved beside the device (estimator.h), in words.
void BesideAssumptions(const ModelParams& p, std::vector<std::string>& out) {
  const BesideMemory& m = p.beside;
  out.push_back(fmt::format(
      "{}: {} moved by its own migration beside the device over the same link, dirtied at {} over one {:.0f} s "
      "window; its dirty bytes in a shorter window t are taken as rate x t (low and mid: a set rewritten faster is "
      "under-counted) or as the whole window's (high), capped at its size; every page counts in full (no zero-page "
      "or compression savings)",
      m.name, FormatBytes(m.bytes), FormatRate(m.dirty_bytes_per_s), m.dirty_window_s));
  out.push_back(fmt::format(
      "the {} starts when the device's round 0 ends (the hook starts QEMU there); while both send, the {} gets "
      "{:.0f}% of the bandwidth and the device the rest; alone, either gets all of it (the bandwidth of the device's "
      "data: QEMU's own speed is not measured)",
      m.name, m.name, m.link_share * 100));
  out.push_back(fmt::format(
      "QEMU 7.2 (downtime-limit held at 0 until the engine's rule says go) pauses the guest by itself once its {}'s "
      "first pass is sent; the engine then cuts its current round short and sends the rest in the stun (modelled)",
      m.name));
  out.push_back(fmt::format(
      "when the engine's rule says go first, the switchover is held (the device runs further rounds) while the {}'s "
      "backlog (unsent first pass plus what was dirtied since) shrinks at bandwidth - dirty rate to the "
      "downtime-limit threshold ({:.0f} ms x bandwidth) and QEMU sends on for up to 100 ms more (its threshold is "
      "recomputed every 100 ms); the device's final round carries one round's dirtying (at least 100 ms)",
      m.name, std::chrono::duration<double, std::milli>(p.downtime_target).count()));
  out.push_back(fmt::format(
      "the guest-visible stun: the device's final round and the {}'s remainder share the link ((both) / bandwidth + "
      "the fixed cost); not modelled: QEMU's own device-state save and load, the destination's `cont`, QEMU's "
      "iteration and dirty-sync granularity",
      m.name));
}

}  // namespace

Result<EstimateReport> EstimateFromProfile(const DeviceProfile& measured, const EstimateOptions& o,
                                           const Calibration& cal) {
  EstimateReport r;
  r.calibration_path = cal.path;
  r.calibration_time = cal.measured_at;
  r.calibrated_now = cal.measured_now;
  r.measured = measured;
  r.modelled = r.measured;
  if (o.project) {
    GM_ASSIGN_OR_RETURN(r.modelled, ProjectWorkload(r.measured, o.workload, &r.assumptions));
  }
  if (!o.content_store_hint.empty()) {
    GM_RETURN_IF_ERROR(ApplyContentHint(o.content_store_hint, r.modelled));
    r.modelled.offer_bytes_per_s = r.measured.offer_bytes_per_s;
    for (const RegionProfile& rp : r.modelled.regions) {
      if (rp.held_fraction <= 0) continue;
      r.assumptions.push_back(fmt::format(
          "the destination's content store holds {:.0f}% of region {}'s non-zero pages (--content-store-hint): round 0 "
          "offers them by SHA-256 (32 bytes a page) instead of sending them{}",
          rp.held_fraction * 100, rp.info.name,
          r.modelled.offer_bytes_per_s > 0
              ? fmt::format(", reading and hashing them at {} (measured now)", FormatRate(r.modelled.offer_bytes_per_s))
              : std::string(", at no cost (the offer's rate was not measured)")));
    }
  }
  ModelParams& p = r.params;
  r.pipeline_bytes_per_s = cal.inprocess_bytes_per_s;
  p.fixed_cost = std::chrono::nanoseconds(static_cast<int64_t>(cal.fixed_cost_ms * 1e6));
  p.downtime_target = o.downtime_target;
  p.max_stun = o.max_stun;
  p.max_rounds = o.max_rounds;
  const bool path = o.path && !o.target;
  if (o.target) {
    GM_RETURN_IF_ERROR(TargetBandwidth(o, r));
  } else if (path) {
    r.path = o.path;
    r.path_measured_now = o.path_measured_now;
    r.path_spread = o.path_spread;
    PathBandwidth(o, *o.path, r);
  } else {
    CalibratedBandwidth(o, cal, r);
  }
  if (!path) {
    r.assumptions.push_back(fmt::format("fixed switchover cost {:.2f} ms, calibrated {} ({})", cal.fixed_cost_ms,
                                        cal.measured_at, cal.path));
  }
  r.assumptions.push_back(fmt::format(
      "the workload keeps behaving as in the {:.2f} s observed; windows longer than that extend the last measured "
      "growth rate",
      r.measured.sample_s));
  if (!o.target && !path) CalibratedCodecs(o, r);
  if (o.beside.bytes > 0) {
    p.beside = o.beside;
    BesideAssumptions(p, r.assumptions);
  }
  r.prediction = Predict(r.modelled, p);
  if (r.prediction.marginal) {
    r.assumptions.push_back(fmt::format(
        "a switchover decision lies within 20% of the {:.0f} ms target: timing noise may make the engine run one "
        "round {} than the likely outcome; the ranges include that outcome ({:.1f} ms stun)",
        std::chrono::duration<double, std::milli>(p.downtime_target).count(),
        r.prediction.alternative->rounds.size() > r.prediction.mid.rounds.size() ? "more" : "fewer",
        r.prediction.alternative->stun_ms));
  }
  return r;
}

Result<EstimateReport> EstimateDevice(Device& device, const EstimateOptions& o, Clock& clock) {
  GM_ASSIGN_OR_RETURN(Calibration cal, LoadOrCalibrate(o.recalibrate));
  GM_ASSIGN_OR_RETURN(DeviceProfile measured, ProfileDevice(device, o.sample, clock));
  if (!o.content_store_hint.empty()) {
    GM_RETURN_IF_ERROR(ApplyContentHint(o.content_store_hint, measured));
    GM_ASSIGN_OR_RETURN(measured.offer_bytes_per_s, MeasureOfferRate(device, measured, clock));
  }
  return EstimateFromProfile(measured, o, cal);
}

namespace {

nlohmann::ordered_json BesideJson(const ModelRun& m) {
  return {{"device_stun_ms", m.device_stun_ms},
          {"bytes", std::llround(m.beside_bytes)},
          {"final_bytes", std::llround(m.beside_final_bytes)},
          {"paused_first", m.beside_paused_first},
          {"stopped_before_switchover_ms", m.stopped_before_switchover_ms},
          {"converge_ms", m.converge_ms},
          {"held_rounds", m.held_rounds},
          {"policy_reason", m.policy_reason}};
}

nlohmann::ordered_json RunJson(const ModelRun& m, bool beside) {
  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
  for (const auto& x : m.rounds) {
    rounds.push_back({{"round", x.round}, {"bytes", std::llround(x.bytes)}, {"ms", x.seconds * 1e3}});
  }
  nlohmann::ordered_json j = {{"rounds", rounds},
                              {"final_bytes", std::llround(m.final_bytes)},
                              {"stun_ms", m.stun_ms},
                              {"total_ms", m.total_ms},
                              {"stop_reason", std::string(StopReasonName(m.stop_reason))}};
  if (beside) j["beside"] = BesideJson(m);
  return j;
}

// What bounds the target's pipeline, limit by limit.
nlohmann::ordered_json TargetPipelineJson(const PipelineBound& b) {
  nlohmann::ordered_json limits = nlohmann::ordered_json::array();
  for (const auto& l : b.limits) {
    limits.push_back({{"name", l.name}, {"raw_bytes_per_s", l.raw_bytes_per_s}, {"detail", l.detail}});
  }
  nlohmann::ordered_json j = {{"raw_bytes_per_s", b.raw_bytes_per_s},
                              {"wire_bytes_per_s", b.wire_bytes_per_s},
                              {"binds", b.binds},
                              {"limits", limits}};
  return j;
}

// Each modelled region: its geometry, codec, sampled ratios and dirty working set.
nlohmann::ordered_json RegionsJson(const DeviceProfile& d) {
  nlohmann::ordered_json regions = nlohmann::ordered_json::array();
  for (const auto& rp : d.regions) {
    nlohmann::ordered_json w = nlohmann::ordered_json::array();
    for (size_t i = 0; i < rp.dirty.window_s.size(); ++i) {
      w.push_back({{"window_ms", rp.dirty.window_s[i] * 1e3},
                   {"low_bytes", rp.dirty.low_bytes[i]},
                   {"mid_bytes", rp.dirty.mid_bytes[i]},
                   {"high_bytes", rp.dirty.high_bytes[i]}});
    }
    regions.push_back({{"id", rp.info.id},
                       {"name", rp.info.name},
                       {"size_bytes", rp.info.size_bytes},
                       {"page_size", rp.info.page_size},
                       {"hint", std::string(RegionHintName(rp.info.hint))},
                       {"nonzero_fraction", rp.nonzero_fraction},
                       {"held_fraction", rp.held_fraction},
                       {"codec", rp.codec},
                       {"compression_ratio", rp.compression_ratio},
                       {"sampled_zstd_ratio", rp.codecs.zstd_ratio},
                       {"sampled_zstd_bytes_per_s", rp.codecs.zstd_bytes_per_s},
                       {"sampled_shuffle_ratio", rp.codecs.shuffle_ratio},
                       {"sampled_shuffle_bytes_per_s", rp.codecs.shuffle_bytes_per_s},
                       {"sampled_bf16_ratio", rp.codecs.bf16_ratio},
                       {"sampled_bf16_bytes_per_s", rp.codecs.bf16_bytes_per_s},
                       {"dirty_working_set", w}});
  }
  return regions;
}

// The memory beside the device as given, with what the mid run predicts for it.
nlohmann::ordered_json BesideMemoryJson(const BesideMemory& b, const ModelRun& mid) {
  nlohmann::ordered_json j = {{"name", b.name},
                              {"bytes", std::llround(b.bytes)},
                              {"dirty_bytes_per_s", b.dirty_bytes_per_s},
                              {"dirty_window_s", b.dirty_window_s},
                              {"page_bytes", b.page_bytes},
                              {"link_share", b.link_share},
                              {"predicted", BesideJson(mid)}};
  return j;
}

// The path calibration modelled with (`r.path` is set), and the host's spread when
// it widened the ranges.
nlohmann::ordered_json PathCalibrationJson(const EstimateReport& r) {
  const PathCalibration& c = *r.path;
  nlohmann::ordered_json j = {{"key", c.config.Key()},
                              {"file", DefaultPathCalibrationFile()},
                              {"measured_at", c.measured_at},
                              {"measured_now", r.path_measured_now},
                              {"round_bytes_per_s", c.bytes_per_s},
                              {"round0_startup_ms", c.round0_startup_ms},
                              {"round_overhead_ms", c.round_overhead_ms},
                              {"fixed_ms", c.fixed_ms},
                              {"final_bytes_per_s", c.final_bytes_per_s},
                              {"final_sync_ms", c.final_sync_ms},
                              {"sync_extra_ms", r.params.path.sync_extra_ms}};
  if (r.path_spread) {
    const PathSpread& s = *r.path_spread;
    j["spread"] = {{"observations", s.observations},
                   {"pool", s.pool},
                   {"round0_ratio", {s.round0_low, s.round0_high}},
                   {"stun_ratio", {s.stun_low, s.stun_high}}};
  }
  return j;
}

}  // namespace

std::string EstimateToJson(const EstimateReport& r) {
  const Prediction& p = r.prediction;
  nlohmann::ordered_json j;
  j["decision"] = EstimateDecisionName(p.decision);
  j["predicted_stun_ms"] = p.mid.stun_ms;
  j["predicted_stun_range_ms"] = {p.stun_low_ms, p.stun_high_ms};
  j["predicted_total_ms"] = p.mid.total_ms;
  j["predicted_total_range_ms"] = {p.total_low_ms, p.total_high_ms};
  const bool beside = r.params.beside.bytes > 0;
  j["predicted_rounds"] = RunJson(p.mid, false)["rounds"];
  j["predicted_final_bytes"] = std::llround(p.mid.final_bytes);
  j["stop_reason"] = std::string(StopReasonName(p.mid.stop_reason));
  j["explanation"] = p.explanation;
  j["device"] = r.modelled.device;
  j["measured_device"] = r.measured.device;
  j["sample_s"] = r.measured.sample_s;
  j["dirty_sync_ms"] = r.measured.sync_ms;
  j["bandwidth_bytes_per_s"] = {{"low", r.params.bandwidth_low},
                                {"mid", r.params.bandwidth_mid},
                                {"high", r.params.bandwidth_high},
                                {"source", r.link_source}};
  j["link"] = r.link;
  j["pipeline_bytes_per_s"] = r.pipeline_bytes_per_s;
  if (r.pipeline) j["target_pipeline"] = TargetPipelineJson(*r.pipeline);
  j["max_rounds"] = r.params.max_rounds;
  j["fixed_cost_ms"] = std::chrono::duration<double, std::milli>(r.params.fixed_cost).count();
  j["device_state_bytes"] = r.modelled.device_state_bytes;
  j["downtime_target_ms"] = std::chrono::duration<double, std::milli>(r.params.downtime_target).count();
  j["max_stun_ms"] = std::chrono::duration<double, std::milli>(r.params.max_stun).count();
  j["regions"] = RegionsJson(r.modelled);
  if (r.modelled.offer_bytes_per_s > 0) j["offer_bytes_per_s"] = std::llround(r.modelled.offer_bytes_per_s);
  if (beside) j["beside"] = BesideMemoryJson(r.params.beside, p.mid);
  j["model_low"] = RunJson(p.low, beside);
  j["model_high"] = RunJson(p.high, beside);
  j["assumptions"] = r.assumptions;
  j["calibration"] = {{"path", r.calibration_path}, {"measured_at", r.calibration_time},
                      {"measured_now", r.calibrated_now}};
  j["marginal"] = p.marginal;
  if (p.alternative) j["alternative"] = RunJson(*p.alternative, false);
  if (r.path) j["path_calibration"] = PathCalibrationJson(r);
  return j.dump();
}

Result<EstimateReport> EstimateForProbe(Device& device, const EstimateOptions& options, SourceOptions& source,
                                        Clock& clock) {
  GM_ASSIGN_OR_RETURN(EstimateReport r, EstimateDevice(device, options, clock));
  source.switchover_fixed_cost = r.params.fixed_cost;
  return r;
}

std::optional<ProbeRates> RepredictWithProbe(const EstimateReport& e, const MigrationReport& r) {
  if (r.rounds.empty() || r.rounds.front().ms <= 0 || r.rounds.front().bytes == 0 || e.params.bandwidth_mid <= 0) {
    return std::nullopt;
  }
  ProbeRates out;
  out.round0_bytes_per_s = static_cast<double>(r.rounds.front().bytes) / (r.rounds.front().ms / 1e3);
  ModelParams p = e.params;
  const double f = out.round0_bytes_per_s / p.bandwidth_mid;
  p.bandwidth_low *= f;
  p.bandwidth_mid *= f;
  p.bandwidth_high *= f;
  out.prediction = Predict(e.modelled, p);
  return out;
}

std::string ProbeReportToJson(const MigrationReport& r, const EstimateReport& e) {
  auto j = nlohmann::ordered_json::parse(ReportToJson(r));
  j["estimate"] = nlohmann::ordered_json::parse(EstimateToJson(e));
  if (auto again = RepredictWithProbe(e, r)) {
    const Prediction& p = again->prediction;
    j["estimate_at_probe_rate"] = {{"round0_bytes_per_s", again->round0_bytes_per_s},
                                   {"predicted_stun_ms", p.mid.stun_ms},
                                   {"predicted_stun_range_ms", {p.stun_low_ms, p.stun_high_ms}},
                                   {"predicted_total_ms", p.mid.total_ms},
                                   {"decision", EstimateDecisionName(p.decision)},
                                   {"predicted_rounds", RunJson(p.mid, false)["rounds"]}};
  }
  return j.dump();
}

}  // namespace gpumigrate
