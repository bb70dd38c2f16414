#include "engine/planner/stun.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "engine/planner/gpu_models.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::planner {

StunAt PredictStunAt(const Vm& vm, double bw, std::chrono::nanoseconds max_stun, bool target_holds) {
  const VmEstimate& e = vm.estimate;
  StunAt out;
  if (e.present && e.profile) {
    out.basis = "profile";
    double rate = e.pipeline_bytes_per_s > 0 ? std::min(bw, e.pipeline_bytes_per_s) : bw;
    DeviceProfile p = *e.profile;
    if (target_holds) {
      for (RegionProfile& r : p.regions) r.held_fraction = r.info.hint == RegionHint::kStatic ? 1.0 : r.held_fraction;
    }
    for (RegionProfile& r : p.regions) {
      const CodecInfo* c = FindCodecByName(r.codec);
      bool measured = false;  // any codec's speed: estimates made with --codec none sample none
      for (const CodecInfo& k : Codecs()) measured |= k.compresses() && r.codecs.*k.sampled_bytes_per_s > 0;
      if (c && c->compresses() && measured) r.compression_ratio = std::max(1.0, EffectiveRatio(r.codecs, c->kind, rate));
    }
    ModelParams params = e.params;
    params.bandwidth_low = params.bandwidth_mid = params.bandwidth_high = rate;
    params.max_stun = max_stun;
    ModelRun run = RunModel(p, params, WorkingSetCurve::Bound::kMid, rate);
    out.stun_ms = run.stun_ms;
    out.total_ms = std::max(run.total_ms, run.stun_ms);
    out.final_bytes = run.final_bytes;
    out.fixed_ms = std::chrono::duration<double, std::milli>(params.fixed_cost).count();
  } else if (e.present) {
    out.basis = "scaled";
    // Both ways: the estimate's figures are all transfer time at estimate.link
    // (they carry no separate fixed cost), so they scale with the bandwidth.
    double f = e.link_bytes_per_s / bw;
    out.stun_ms = e.stun_ms * f;
    out.total_ms = e.total_ms * f;
  } else {
    out.basis = "frame-buffer";
    out.stun_ms = static_cast<double>(FrameBufferBytes(vm)) / bw * 1e3;
    out.total_ms = out.stun_ms;
  }
  if (!std::isfinite(out.stun_ms)) out.stun_ms = 1e15;
  if (!std::isfinite(out.total_ms)) out.total_ms = 1e15;
  return out;
}

std::string Gbit(double bytes_per_s) {
  double gbit = bytes_per_s * 8 / 1e9;
  if (gbit >= 1) return fmt::format("{:.3g} Gbit", gbit);
  return fmt::format("{:.3g} Mbit", gbit * 1e3);
}

std::string Seconds(double ms) {
  if (ms < 1000) return fmt::format("{:.0f} ms", ms);
  double s = ms / 1e3;
  if (std::fabs(s - std::round(s)) < 0.05) return fmt::format("{:.0f} s", s);
  return fmt::format("{:.1f} s", s);
}

std::string StunOver(double ms, double max_ms) {
  std::string a = Seconds(ms), b = Seconds(max_ms);
  for (int digits = 2; a == b && digits <= 3; ++digits) a = fmt::format("{:.{}f} s", ms / 1e3, digits);
  return fmt::format("{} > {}", a, b);
}

std::string BasisText(const Vm& vm, const StunAt& s) {
  if (s.basis == "profile") return "re-predicted from the measured profile";
  if (s.basis == "scaled") return fmt::format("scaled from the estimate at {}", Gbit(vm.estimate.link_bytes_per_s));
  return fmt::format("no estimate: stop-and-copy of its {} frame buffer", DecimalGB(FrameBufferBytes(vm)));
}

}  // namespace gpumigrate::planner
