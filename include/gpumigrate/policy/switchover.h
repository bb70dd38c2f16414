// When to stop pre-copying: a simple rule from measured bandwidth and the dirty
// set (the estimator replaces the prediction later; the decisions stay).
//
//   predicted stun = (dirty bytes + device state bytes) / bandwidth + fixed cost
//   - predicted stun <= downtime target              -> switch over ("converged"),
//       unless a device still has initial pre-copy data (VFIO initial_bytes)
//       and the round limit is not reached           -> another round
//       (QEMU 8.1's switchover-ack waits for the same)
//   - rounds stopped shrinking, or round limit hit:
//       predicted stun <= max stun                   -> switch over
//       else                                         -> abort, recommend drain-and-replace
//   - otherwise                                      -> another round
// "Stopped shrinking": the last three rounds' dirty sets are all at least 90% of
// the smallest dirty set seen before them. Pure: no clock, no I/O.
//
// Within a round, while the link limits it and is too slow to carry even the
// whole device within max stun (session: WatchLink), a second rule
// (DecideAtLinkRate) asks whether any stun at the link's present rate R can
// stay within max stun. It takes the bytes of distinct pages the workload
// wrote in an interval of t seconds, W(t). For writes that pile up no faster
// than linearly (W(t)/t does not grow: a hot set rewritten, an append; not a
// burst after a pause), let t* be where W(t*) = R*t*: a round T >= t* long
// re-dirties W(T) bytes, and the next round, W(T)/R long, is shorter but never
// shorter than W(t*)/R = t*. W(t) >= R*t means t* >= W(t)/R (for s between t
// and W(t)/R, W(s) >= W(t) >= R*s), so no round, the last one (the stun)
// included, can be shorter than W(t)/R, plus the device state's time.
//   - W(t) >= R*t and that floor > max stun              -> abort now ("link too
//       slow"), unless the policy switches anyway when not converging
//   - the migration's time budget (max_total): elapsed + the rest of this round
//       / R + the smallest final round the workload allows > max_total
//                                                         -> abort now ("over
//       budget"), whatever the policy says of not converging
//   - otherwise                                           -> go on: the round
//       ends as usual and the rule above decides at its boundary
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpumigrate {

// The defaults of what the operator allows: the one place the engine
// (SourceOptions), the estimator (ModelParams, EstimateOptions), the planner
// (planner::Policy) and the CLI's flags take them from.
inline constexpr std::chrono::milliseconds kDefaultDowntimeTarget{300};
inline constexpr std::chrono::seconds kDefaultMaxStun{100};
inline constexpr uint32_t kDefaultMaxRounds = 30;

// What the operator allows: the same for the engine, the estimator and the planner.
struct SwitchoverLimits {
  std::chrono::nanoseconds downtime_target{0};
  std::chrono::nanoseconds max_stun{0};
  std::chrono::nanoseconds fixed_cost{0};  // round trips, device stop and resume
  uint32_t max_rounds = kDefaultMaxRounds;
  // When rounds stop shrinking and the stun would exceed max_stun: switch over
  // anyway (the user accepts the longer stun) instead of aborting.
  bool switch_when_not_converging = false;
  // The whole migration's time budget, stun included; 0: none. A migration
  // that cannot end within it even at best is aborted (DecideAtLinkRate).
  std::chrono::nanoseconds max_total{0};
};

struct PolicyInput {
  SwitchoverLimits limits;
  std::vector<uint64_t> dirty_bytes_history;  // dirty set found after each completed round, in order
  uint64_t device_state_bytes = 0;
  // A device's initial pre-copy data not yet sent (PendingBytes::precopy_initial_bytes).
  uint64_t device_initial_bytes = 0;
  double bandwidth_bytes_per_s = 0;
  uint32_t rounds_done = 0;
};

enum class Decision { kContinue, kSwitchover, kAbort };
enum class StopReason { kNone, kConverged, kNotShrinking, kRoundLimit, kLinkTooSlow, kOverBudget };
// "converged", "not shrinking", "round limit", "link too slow", "over budget"
std::string_view StopReasonName(StopReason r);

struct PolicyResult {
  Decision decision = Decision::kContinue;
  StopReason stop = StopReason::kNone;
  double predicted_stun_ms = 0;
  std::string reason;
};

PolicyResult DecideSwitchover(const PolicyInput& in);

struct LinkRateInput {
  SwitchoverLimits limits;
  uint64_t written_bytes = 0;  // distinct pages written in the interval, in bytes
  double interval_s = 0;       // t: the interval's length
  double bandwidth_bytes_per_s = 0;       // R: the link now
  double peak_bandwidth_bytes_per_s = 0;  // what it carried before (for the reason)
  uint64_t device_state_bytes = 0;
  // For the time budget (limits.max_total): how long the migration has run, and
  // the bytes of the round in progress the link has not carried yet (pages not
  // sent and bytes queued or in flight).
  double elapsed_s = 0;
  uint64_t round_left_bytes = 0;
  uint32_t round = 0;
};
// kAbort (stop kLinkTooSlow, predicted_stun_ms the floor) or kContinue; then,
// with a budget, the best case at R: the rest of this round, then a final round
// no shorter than the floor above (or, when the workload writes less than R
// carries, the device state alone). When even that ends after max_total, kAbort
// with stop kOverBudget, the reason naming R and the rate the budget needs.
PolicyResult DecideAtLinkRate(const LinkRateInput& in);
double PredictStunMs(uint64_t bytes, double bandwidth_bytes_per_s, std::chrono::nanoseconds fixed_cost);

// The engine's bandwidth sample for the rule: bytes over time of the most
// recent rounds, back to at least 64 MiB (or all of them): recent rounds see the
// conditions the stun will see. `bytes_of(r)` and `seconds_of(r)` read a round;
// the session and the estimator's model both use it, so they sample alike.
template <class Round, class BytesOf, class SecondsOf>
double RecentBandwidth(const std::vector<Round>& rounds, BytesOf bytes_of, SecondsOf seconds_of) {
  double bytes = 0, seconds = 0;
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) {
    bytes += static_cast<double>(bytes_of(*it));
    seconds += static_cast<double>(seconds_of(*it));
    if (bytes >= 64.0 * (1 << 20)) break;
  }
  return seconds > 0 ? bytes / seconds : 0;
}

}  // namespace gpumigrate
