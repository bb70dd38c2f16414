#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gpumigrate/policy/switchover.h"
#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/common/units.h"

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

double EngineBandwidth(const std::vector<PredictedRound>& rounds) {
  return RecentBandwidth(
      rounds, [](const PredictedRound& r) { return r.bytes; },
      [](const PredictedRound& r) { return std::max(0.0, r.seconds - r.offer_seconds); });
}

// Round 0's bytes on the wire: every non-zero page, but those the destination's
// content store holds go as a 32-byte SHA-256 each.
double Round0WireBytes(const DeviceProfile& p) {
  double round0 = 0;
  for (const auto& r : p.regions) {
    const double nonzero = static_cast<double>(r.info.size_bytes) * r.nonzero_fraction;
    round0 += nonzero * (1 - r.held_fraction) / r.compression_ratio;
    round0 += nonzero * r.held_fraction / (r.info.page_size > 0 ? r.info.page_size : 4096) * 32;
  }
  return round0;
}

// Round 0's time reading and hashing the pages it offers by digest.
double Round0OfferSeconds(const DeviceProfile& p) {
  if (p.offer_bytes_per_s <= 0) return 0;
  double held = 0;
  for (const auto& r : p.regions) held += static_cast<double>(r.info.size_bytes) * r.nonzero_fraction * r.held_fraction;
  return held / p.offer_bytes_per_s;
}

// The QEMU hook's hold step (qemu-plugin/qemu_source.cc, MaySwitch): how long
// it waits for QEMU's pause before the engine runs another held round.
constexpr double kHoldStepS = 0.1;

struct Forced {
  int skip_switches = 0;
  int switch_at = -1;
};
ModelRun RunDeviceOnly(const DeviceProfile& p, const ModelParams& params, WorkingSetCurve::Bound w, double bw,
                       int which, Forced force);

// What RunWithBeside's steps share: the device, the mover's memory and the link.
struct BesideLink {
  const DeviceProfile& p;
  const ModelParams& params;
  WorkingSetCurve::Bound w;
  double bw;
  double ram;
  double rate;
  double share;
  double fixed_s;
  double target_s;
  double state;
  double window_floor_s;
  // The mover's bytes dirtied in a window, never less than over window_floor_s.
  double RamDirtied(double window_s) const { return std::min(ram, rate * std::max(window_s, window_floor_s)); }
};

// The mover's memory and the stun's costs as BesideMemory and the rule give them.
BesideLink MakeBesideLink(const DeviceProfile& p, const ModelParams& params, WorkingSetCurve::Bound w, double bw) {
  const BesideMemory& m = params.beside;
  // The stun's fixed cost as the rule assumes it, plus what this device's
  // dirty-log sync costs beyond the calibration device's (every round after
  // round 0 starts with one too).
  const double fixed_s = std::chrono::duration<double>(params.fixed_cost).count() + params.path.sync_extra_ms / 1e3;
  const double target_s = std::chrono::duration<double>(params.downtime_target).count();
  // One measured window: rate x t in the low and mid runs; the high run takes the
  // whole window's dirty set for any shorter window too (W(t) <= W(T) for t <= T:
  // a hot set may be rewritten well within the window).
  const double window_floor_s = w == WorkingSetCurve::Bound::kHigh ? std::max(0.0, m.dirty_window_s) : 0.0;
  return {p,
          params,
          w,
          bw,
          m.bytes,
          std::max(0.0, m.dirty_bytes_per_s),
          std::clamp(m.link_share, 0.01, 0.99),
          fixed_s,
          target_s,
          static_cast<double>(p.device_state_bytes),
          window_floor_s};
}

// The mover sent its first pass and QEMU paused the guest by itself: the round
// is cut there and everything it had not sent, plus what the device dirtied
// meanwhile (`device_final`), goes in the final round.
void FinishPausedByMover(const BesideLink& k, ModelRun& run, double device_final, double elapsed, double mover_start,
                         double bandwidth_bytes_per_s, uint32_t round) {
  run.beside_final_bytes = k.RamDirtied(elapsed - mover_start);
  run.beside_bytes = k.ram + run.beside_final_bytes;
  run.beside_paused_first = true;
  run.stopped_before_switchover_ms = 0;
  run.final_bytes = device_final;
  run.device_stun_ms = PredictStunMs(static_cast<uint64_t>(device_final), bandwidth_bytes_per_s, k.params.fixed_cost);
  const double final_s = (device_final + run.beside_final_bytes) / k.bw + k.fixed_s;
  run.stun_ms = final_s * 1e3;
  run.total_ms = (elapsed + final_s) * 1e3;
  run.switches = true;
  run.stop_reason = StopReason::kNone;
  run.policy_reason = fmt::format(
      "the {}'s first pass is sent {:.0f} ms after the device's round 0 and QEMU pauses the guest by itself "
      "(downtime-limit held at 0; QEMU 7.2 has no switchover-ack): the engine cuts round {} short and switches over",
      k.params.beside.name, (elapsed - mover_start) * 1e3, round);
}

// How long the mover converges on the whole link once the engine said go, until
// its backlog fits the downtime-limit's threshold; sets the mover's final bytes
// (and gives up where it is dirtied as fast as the link carries it).
double ConvergeMover(const BesideLink& k, ModelRun& run, double backlog) {
  const double threshold = k.bw * k.target_s;
  double converge_s = 0;
  run.beside_final_bytes = std::min(backlog, threshold);
  if (backlog > threshold && k.rate >= k.bw) {
    // Never within the threshold: the hook would give up after its converge
    // timeout. The stun shown is a stop-and-copy of the backlog.
    run.switches = false;
    run.stop_reason = StopReason::kNotShrinking;
    run.policy_reason = fmt::format("{} cannot converge: it is dirtied at {}, as fast as the link carries it ({})",
                                    k.params.beside.name, FormatRate(k.rate), FormatRate(k.bw));
    run.beside_final_bytes = backlog;
  } else {
    if (backlog > threshold) converge_s = (backlog - threshold) / (k.bw - k.rate);
    // QEMU recomputes its threshold from its measured bandwidth only every
    // 100 ms (BUFFER_DELAY): it sends on that long before its rule lets it pause.
    const double lag_s = std::min(0.1, run.beside_final_bytes / k.bw);
    run.beside_final_bytes = std::max(0.0, run.beside_final_bytes - k.bw * lag_s) + k.RamDirtied(lag_s);
    converge_s += lag_s;
  }
  return converge_s;
}

// The switchover held while the mover converges: the device's held rounds, then
// both final rounds make the stun.
void FinishHeldSwitchover(const BesideLink& k, ModelRun& run, double secs, double elapsed, double sent,
                          double converge_s) {
  run.converge_ms = converge_s * 1e3;
  // The held rounds: each waits for the hold step, then sends what the device
  // dirtied since the last one, at its share of the link.
  for (double held_s = 0, last_s = secs; held_s < converge_s && run.held_rounds < 10000; ++run.held_rounds) {
    const double t =
        kHoldStepS + DirtyWireBytes(k.p, last_s, k.w) / (k.bw * (1 - k.share)) + k.params.path.sync_extra_ms / 1e3;
    held_s += t;
    last_s = t;
  }
  run.beside_bytes = sent + k.bw * converge_s + run.beside_final_bytes;
  // The switchover is held meanwhile, the device running further rounds: its
  // final round carries about one round's dirtying (at least the 100 ms hold step).
  run.final_bytes = DirtyWireBytes(k.p, std::min(secs + converge_s, std::max(secs, 0.1)), k.w) + k.state;
  const double final_s = (run.final_bytes + run.beside_final_bytes) / k.bw + k.fixed_s;
  run.stun_ms = final_s * 1e3;
  run.total_ms = (elapsed + converge_s + final_s) * 1e3;
}

// BesideMemory's timeline (estimator.h): the device's rounds and the mover's
// first pass share the link; whoever says go first decides how the stun goes.
ModelRun RunWithBeside(const DeviceProfile& p, const ModelParams& params, WorkingSetCurve::Bound w, double bw) {
  const BesideLink k = MakeBesideLink(p, params, w, bw);
  ModelRun run;
  double left = k.ram;      // the mover's first pass still to send
  double elapsed = 0;       // since the device's pre-copy started
  double mover_start = -1;  // the mover starts when the device's round 0 ends (the QEMU hook)
  double device_bytes = Round0WireBytes(p);
  PolicyInput in;
  in.device_state_bytes = p.device_state_bytes;
  in.limits = params.Limits();
  for (uint32_t round = 0;; ++round) {
    // One device round; from round 1 on beside the mover's first pass, which may
    // finish mid-round. Round 0 (the device's bulk) has the link to itself.
    const bool beside = mover_start >= 0;
    const double device_rate = beside ? bw * (1 - k.share) : bw, ram_rate = bw * k.share;
    const double offer_s = round == 0 ? Round0OfferSeconds(p) : 0.0;  // round 0 alone offers by digest
    const double sync_s = round == 0 ? 0.0 : params.path.sync_extra_ms / 1e3;
    const double t_dev = device_bytes / device_rate + offer_s + sync_s, t_ram = beside ? left / ram_rate : t_dev + 1;
    double secs = t_dev;
    const bool paused = beside && t_ram <= t_dev;
    if (paused) {
      secs = t_ram;  // QEMU pauses the guest: the engine cuts this round short (switch_now)
      left = 0;
    } else if (beside) {
      left -= ram_rate * t_dev;
    }
    const double round_start = elapsed;
    run.rounds.push_back({round, paused ? device_rate * t_ram : device_bytes, secs, offer_s});
    elapsed += secs;
    if (!beside) mover_start = elapsed;
    in.bandwidth_bytes_per_s = EngineBandwidth(run.rounds);

    if (paused) {
      const double device_final =
          (device_bytes - device_rate * t_ram) + DirtyWireBytes(p, elapsed - round_start, w) + k.state;
      FinishPausedByMover(k, run, device_final, elapsed, mover_start, in.bandwidth_bytes_per_s, round);
      return run;
    }

    const double dirty = DirtyWireBytes(p, secs, w);
    in.dirty_bytes_history.push_back(static_cast<uint64_t>(dirty));
    in.rounds_done = round + 1;
    PolicyResult d = DecideSwitchover(in);
    if (d.decision == Decision::kContinue && round + 1 < 10000) {
      device_bytes = dirty;
      continue;
    }
    run.switches = d.decision == Decision::kSwitchover;
    run.stop_reason = d.stop;
    run.policy_reason = d.reason;
    run.device_stun_ms = d.predicted_stun_ms;
    // The engine said go: the mover gets the whole link and converges while the
    // guest runs, until its backlog fits the downtime-limit's threshold.
    if (mover_start < 0) mover_start = elapsed;  // the rule said go after round 0: QEMU starts now
    const double sent = k.ram - left;
    const double converge_s = ConvergeMover(k, run, left + std::min(k.RamDirtied(elapsed - mover_start), sent));
    FinishHeldSwitchover(k, run, secs, elapsed, sent, converge_s);
    return run;
  }
}

}  // namespace

ModelRun RunModel(const DeviceProfile& p, const ModelParams& params, WorkingSetCurve::Bound w, double bw,
                  int which) {
  if (params.beside.bytes > 0 && bw > 0) return RunWithBeside(p, params, w, bw);
  return RunDeviceOnly(p, params, w, bw, which, {});
}

namespace {

// `force.skip_switches`: decisions to switch the run ignores (the engine ran a
// round more); `force.switch_at`: the decision (0-based) at which it switches
// even though the rule said continue (the engine ran a round fewer).
ModelRun RunDeviceOnly(const DeviceProfile& p, const ModelParams& params, WorkingSetCurve::Bound w, double bw,
                       int which, Forced force) {
  ModelRun run;
  which = std::clamp(which, 0, 2);
  const PathTiming& path = params.path;
  const double round0 = Round0WireBytes(p);
  const double offer_s = Round0OfferSeconds(p);
  double t = bw > 0 ? round0 / bw + offer_s + path.round0_startup_s : INFINITY;
  run.rounds.push_back({0, round0, t, offer_s});
  double elapsed = t;
  PolicyInput in;
  in.device_state_bytes = p.device_state_bytes;
  in.limits = params.Limits();
  // The engine's own loop, with predicted dirty sets in place of measured ones.
  for (uint32_t round = 0;; ++round) {
    double dirty = std::isfinite(t) ? DirtyWireBytes(p, t, w) : INFINITY;
    in.dirty_bytes_history.push_back(std::isfinite(dirty) ? static_cast<uint64_t>(dirty) : UINT64_MAX / 4);
    in.rounds_done = round + 1;
    // The engine's rate: its recent rounds, each with its overhead.
    in.bandwidth_bytes_per_s = std::isfinite(t) ? EngineBandwidth(run.rounds) : bw;
    PolicyResult d = DecideSwitchover(in);
    run.decision_stun_ms.push_back(d.predicted_stun_ms);
    if (d.decision == Decision::kSwitchover && force.skip_switches > 0) {
      --force.skip_switches;
      d.decision = Decision::kContinue;
    } else if (d.decision == Decision::kContinue && static_cast<int>(round) == force.switch_at) {
      d.decision = Decision::kSwitchover;
      d.stop = StopReason::kConverged;
      d.reason = fmt::format("predicted stun {:.1f} ms, just over the target: timing noise lets the engine switch",
                             d.predicted_stun_ms);
    }
    if (d.decision != Decision::kContinue || round + 1 >= 10000) {
      run.switches = d.decision == Decision::kSwitchover;
      run.stop_reason = d.stop;
      run.policy_reason = d.reason;
      run.final_bytes = dirty + static_cast<double>(p.device_state_bytes);
      run.stun_ms = path.calibrated() ? path.fixed_ms[which] + path.sync_extra_ms +
                                            run.final_bytes / path.final_bytes_per_s[which] * 1e3
                                      : d.predicted_stun_ms;
      run.total_ms = elapsed * 1e3 + run.stun_ms;
      return run;
    }
    t = dirty / bw + path.round_overhead_s + path.sync_extra_ms / 1e3;
    run.rounds.push_back({round + 1, dirty, t});
    elapsed += t;
  }
}

// How far the engine's predicted stun at a decision may stray from the model's:
// it is the dirty set over the rate, and a round at a rate r times the model's
// lasts 1/r as long, so for a steady writer dirties 1/r as much: the decision
// stun scales as 1/r^2. r spans the bandwidth range (the calibration's runs,
// widened by the host's spread); at least within 20% of the target.
std::pair<double, double> DecisionSpread(const ModelParams& params) {
  double up = 1.25, down = 1 / 1.2;  // within 20% of the target either side
  if (params.bandwidth_mid > 0 && params.bandwidth_low > 0 && params.bandwidth_high > 0) {
    up = std::max(up, std::pow(params.bandwidth_mid / params.bandwidth_low, 2));
    down = std::min(down, std::pow(params.bandwidth_mid / params.bandwidth_high, 2));
  }
  return {up, down};
}

}  // namespace

Prediction Predict(const DeviceProfile& p, const ModelParams& params) {
  using B = WorkingSetCurve::Bound;
  Prediction pr;
  pr.mid = RunModel(p, params, B::kMid, params.bandwidth_mid, 1);
  pr.low = RunModel(p, params, B::kLow, params.bandwidth_high, 0);
  pr.high = RunModel(p, params, B::kHigh, params.bandwidth_low, 2);
  pr.stun_low_ms = std::min({pr.low.stun_ms, pr.mid.stun_ms, pr.high.stun_ms});
  pr.stun_high_ms = std::max({pr.low.stun_ms, pr.mid.stun_ms, pr.high.stun_ms});
  pr.total_low_ms = std::min({pr.low.total_ms, pr.mid.total_ms, pr.high.total_ms});
  pr.total_high_ms = std::max({pr.low.total_ms, pr.mid.total_ms, pr.high.total_ms});
  // Near the target, the engine's decision turns on timing noise: model the
  // other outcome and let the ranges hold it.
  const double target_ms = std::chrono::duration<double, std::milli>(params.downtime_target).count();
  const auto& ds = pr.mid.decision_stun_ms;
  if (params.beside.bytes <= 0 && pr.mid.switches && pr.mid.stop_reason == StopReason::kConverged && !ds.empty()) {
    std::optional<Forced> force;
    const size_t n = ds.size();
    const auto [up, down] = DecisionSpread(params);
    if (ds[n - 1] * up >= target_ms) {
      force = Forced{1, -1};  // a round more
    } else if (n >= 2 && ds[n - 2] * down <= target_ms) {
      force = Forced{0, static_cast<int>(n - 2)};  // a round fewer
    }
    if (force) {
      pr.marginal = true;
      pr.alternative = RunDeviceOnly(p, params, B::kMid, params.bandwidth_mid, 1, *force);
      // The other outcome has its own spread: the range holds its optimistic
      // and pessimistic runs as it holds the likely outcome's.
      for (const ModelRun& alt : {*pr.alternative, RunDeviceOnly(p, params, B::kLow, params.bandwidth_high, 0, *force),
                                  RunDeviceOnly(p, params, B::kHigh, params.bandwidth_low, 2, *force)}) {
        pr.stun_low_ms = std::min(pr.stun_low_ms, alt.stun_ms);
        pr.stun_high_ms = std::max(pr.stun_high_ms, alt.stun_ms);
        pr.total_low_ms = std::min(pr.total_low_ms, alt.total_ms);
        pr.total_high_ms = std::max(pr.total_high_ms, alt.total_ms);
      }
    }
  }
  // The optimistic and pessimistic runs may decide otherwise than the likely
  // one (a slower rate dirties more and runs a round more, ending with a
  // smaller final round): the likely outcome's own final round, and the other
  // outcome's, at the path's fastest and slowest final rate belong in the range too.
  const PathTiming& path = params.path;
  if (params.beside.bytes <= 0 && path.calibrated()) {
    for (const ModelRun* run : {&pr.mid, pr.alternative ? &*pr.alternative : nullptr}) {
      if (run == nullptr || !run->switches) continue;
      for (int which : {0, 2}) {
        if (path.final_bytes_per_s[which] <= 0) continue;
        const double stun =
            path.fixed_ms[which] + path.sync_extra_ms + run->final_bytes / path.final_bytes_per_s[which] * 1e3;
        pr.stun_low_ms = std::min(pr.stun_low_ms, stun);
        pr.stun_high_ms = std::max(pr.stun_high_ms, stun);
      }
    }
  }
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
  out.sync_ms = p.sync_ms * f;
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
    assumptions->push_back("device state size and fixed switchover cost stay as measured; a dirty-log sync takes "
                           "longer in proportion to the size");
  }
  return out;
}

}  // namespace gpumigrate
