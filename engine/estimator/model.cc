#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gpumigrate/switchover.h"
#include "gpumigrate/estimator.h"
#include "gpumigrate/units.h"

namespace gpumigrate {

std::string_view EstimateDecisionName(EstimateDecision d) {
  switch (d) {
    case EstimateDecision::kLiveMigrate: return "live-migrate";
    case EstimateDecision::kDrainAndReplace: return "drain-and-replace";
    case EstimateDecision::kCannotConverge: return "cannot-converge";
  }
  return "unknown";
}

namespace {

// Wire bytes for what was dirtied during a window of `t` seconds.
double DirtyWireBytes(const DeviceProfile& p, double t, WorkingSetCurve::Bound b) {
  double sum = 0;
  for (const auto& r : p.regions) {
    sum += r.dirty.Eval(t, b, static_cast<double>(r.info.size_bytes)) / r.compression_ratio;
  }
  return sum;
}

}  // namespace

ModelRun RunModel(const DeviceProfile& p, const ModelParams& params, WorkingSetCurve::Bound w, double bw) {
  ModelRun run;
  double round0 = 0;
  for (const auto& r : p.regions) {
    round0 += static_cast<double>(r.info.size_bytes) * r.nonzero_fraction / r.compression_ratio;
  }
  double t = bw > 0 ? round0 / bw : INFINITY;
  run.rounds.push_back({0, round0, t});
  double elapsed = t;
  PolicyInput in;
  in.device_state_bytes = p.device_state_bytes;
  in.bandwidth_bytes_per_s = bw;
  in.limits = params.Limits();
  // The engine's own loop, with predicted dirty sets in place of measured ones.
  for (uint32_t round = 0;; ++round) {
    double dirty = std::isfinite(t) ? DirtyWireBytes(p, t, w) : INFINITY;
    in.dirty_bytes_history.push_back(std::isfinite(dirty) ? static_cast<uint64_t>(dirty) : UINT64_MAX / 4);
    in.rounds_done = round + 1;
    PolicyResult d = DecideSwitchover(in);
    if (d.decision != Decision::kContinue || round + 1 >= 10000) {
      run.switches = d.decision == Decision::kSwitchover;
      run.stop_reason = d.stop;
      run.policy_reason = d.reason;
      run.final_bytes = dirty + static_cast<double>(p.device_state_bytes);
      run.stun_ms = d.predicted_stun_ms;
      run.total_ms = elapsed * 1e3 + run.stun_ms;
      return run;
    }
    t = dirty / bw;
    run.rounds.push_back({round + 1, dirty, t});
    elapsed += t;
  }
}

Prediction Predict(const DeviceProfile& p, const ModelParams& params) {
  using B = WorkingSetCurve::Bound;
  Prediction pr;
  pr.mid = RunModel(p, params, B::kMid, params.bandwidth_mid);
  pr.low = RunModel(p, params, B::kLow, params.bandwidth_high);
  pr.high = RunModel(p, params, B::kHigh, params.bandwidth_low);
  pr.stun_low_ms = std::min({pr.low.stun_ms, pr.mid.stun_ms, pr.high.stun_ms});
  pr.stun_high_ms = std::max({pr.low.stun_ms, pr.mid.stun_ms, pr.high.stun_ms});
  pr.total_low_ms = std::min({pr.low.total_ms, pr.mid.total_ms, pr.high.total_ms});
  pr.total_high_ms = std::max({pr.low.total_ms, pr.mid.total_ms, pr.high.total_ms});
  const double max_ms = std::chrono::duration<double, std::milli>(params.max_stun).count();
  if (pr.mid.switches && pr.mid.stun_ms <= max_ms) {
    pr.decision = EstimateDecision::kLiveMigrate;
    pr.explanation = fmt::format("live migration fits: {}", pr.mid.policy_reason);
  } else if (pr.mid.stop_reason == StopReason::kNotShrinking) {
    pr.decision = EstimateDecision::kCannotConverge;
    pr.explanation = fmt::format(
        "pre-copy cannot converge: the dirty set stops shrinking because the workload dirties memory about as fast "
        "as the link carries it, and the stun then ({:.0f} ms) exceeds the {:.0f} ms limit; drain-and-replace",
        pr.mid.stun_ms, max_ms);
  } else {
    pr.decision = EstimateDecision::kDrainAndReplace;
    pr.explanation = fmt::format("the predicted stun ({:.0f} ms) exceeds the {:.0f} ms limit: {}", pr.mid.stun_ms,
                                 max_ms, pr.mid.policy_reason);
  }
  return pr;
}

DeviceProfile ProjectProfile(const DeviceProfile& p, uint64_t device_bytes, bool scale_dirty,
                             std::vector<std::string>* assumptions) {
  uint64_t current = 0;
  for (const auto& r : p.regions) current += r.info.size_bytes;
  double f = current ? static_cast<double>(device_bytes) / static_cast<double>(current) : 1;
  DeviceProfile out = p;
  out.device = fmt::format("projection of {} to {}", p.device, FormatBytes(static_cast<double>(device_bytes)));
  for (auto& r : out.regions) {
    r.info.size_bytes = static_cast<uint64_t>(std::llround(static_cast<double>(r.info.size_bytes) * f));
    if (scale_dirty) {
      for (auto* v : {&r.dirty.low_bytes, &r.dirty.mid_bytes, &r.dirty.high_bytes}) {
        for (double& x : *v) x *= f;
      }
    }
  }
  if (assumptions) {
    assumptions->push_back(fmt::format("every region keeps its share of the device, scaled by {:.3g} ({} -> {})", f,
                                       FormatBytes(static_cast<double>(current)),
                                       FormatBytes(static_cast<double>(device_bytes))));
    assumptions->push_back(scale_dirty
                               ? fmt::format("dirty working sets scale with size (x{:.3g}): the measured workload "
                                             "runs on every part of the larger device",
                                             f)
                               : "dirty working sets stay as measured: the larger device holds more static data only");
    assumptions->push_back("non-zero page fractions and compression ratios stay as sampled");
    assumptions->push_back("device state size and fixed switchover cost stay as measured");
  }
  return out;
}

}  // namespace gpumigrate
