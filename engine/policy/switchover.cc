#include "gpumigrate/policy/switchover.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

namespace gpumigrate {

double PredictStunMs(uint64_t bytes, double bandwidth_bytes_per_s, std::chrono::nanoseconds fixed_cost) {
  double fixed_ms = std::chrono::duration<double, std::milli>(fixed_cost).count();
  if (bandwidth_bytes_per_s <= 0) return bytes == 0 ? fixed_ms : std::numeric_limits<double>::infinity();
  return static_cast<double>(bytes) / bandwidth_bytes_per_s * 1e3 + fixed_ms;
}

std::string_view StopReasonName(StopReason r) {
  switch (r) {
    case StopReason::kNone: return "none";
    case StopReason::kConverged: return "converged";
    case StopReason::kNotShrinking: return "not shrinking";
    case StopReason::kRoundLimit: return "round limit";
    case StopReason::kLinkTooSlow: return "link too slow";
    case StopReason::kOverBudget: return "over budget";
  }
  return "none";
}

PolicyResult DecideSwitchover(const PolicyInput& in) {
  PolicyResult r;
  uint64_t dirty = in.dirty_bytes_history.empty() ? 0 : in.dirty_bytes_history.back();
  r.predicted_stun_ms = PredictStunMs(dirty + in.device_state_bytes, in.bandwidth_bytes_per_s, in.limits.fixed_cost);
  double target_ms = std::chrono::duration<double, std::milli>(in.limits.downtime_target).count();
  double max_ms = std::chrono::duration<double, std::milli>(in.limits.max_stun).count();

  const bool limit = in.rounds_done >= in.limits.max_rounds;
  if (r.predicted_stun_ms <= target_ms && in.device_initial_bytes > 0 && !limit) {
    r.decision = Decision::kContinue;
    r.reason = fmt::format("predicted stun {:.1f} ms is within the {:.0f} ms target, but the device still has {} bytes "
                           "of initial pre-copy data: the switchover waits for it",
                           r.predicted_stun_ms, target_ms, in.device_initial_bytes);
    return r;
  }
  if (r.predicted_stun_ms <= target_ms) {
    r.decision = Decision::kSwitchover;
    r.stop = StopReason::kConverged;
    r.reason = fmt::format("converged: predicted stun {:.1f} ms is within the {:.0f} ms target", r.predicted_stun_ms,
                           target_ms);
    return r;
  }
  bool stalled = false;
  const auto& h = in.dirty_bytes_history;
  if (h.size() >= 4) {
    uint64_t best_before = *std::min_element(h.begin(), h.end() - 3);
    stalled = std::all_of(h.end() - 3, h.end(), [&](uint64_t d) { return d * 10 >= best_before * 9; });
  }
  if (!stalled && !limit) {
    r.decision = Decision::kContinue;
    r.reason = "dirty set still shrinking";
    return r;
  }
  r.stop = stalled ? StopReason::kNotShrinking : StopReason::kRoundLimit;
  std::string why = stalled ? std::string("dirty set stopped shrinking")
                            : fmt::format("round limit {} reached", in.limits.max_rounds);
  if (r.predicted_stun_ms <= max_ms) {
    r.decision = Decision::kSwitchover;
    r.reason = fmt::format("{}: predicted stun {:.1f} ms exceeds the {:.0f} ms target but is within max stun {:.0f} ms",
                           why, r.predicted_stun_ms, target_ms, max_ms);
  } else if (in.limits.switch_when_not_converging) {
    r.decision = Decision::kSwitchover;
    r.reason = fmt::format("{}: predicted stun {:.1f} ms exceeds max stun {:.0f} ms; switching anyway as the policy asks",
                           why, r.predicted_stun_ms, max_ms);
  } else {
    r.decision = Decision::kAbort;
    r.reason = fmt::format("{}: predicted stun {:.1f} ms exceeds max stun {:.0f} ms; recommend drain-and-replace", why,
                           r.predicted_stun_ms, max_ms);
  }
  return r;
}

}  // namespace gpumigrate
