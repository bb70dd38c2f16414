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
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpumigrate {

// What the operator allows: the same for the engine, the estimator and the planner.
struct SwitchoverLimits {
  std::chrono::nanoseconds downtime_target{0};
  std::chrono::nanoseconds max_stun{0};
  std::chrono::nanoseconds fixed_cost{0};  // round trips, device stop and resume
  uint32_t max_rounds = 30;
  // When rounds stop shrinking and the stun would exceed max_stun: switch over
  // anyway (the user accepts the longer stun) instead of aborting.
  bool switch_when_not_converging = false;
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
enum class StopReason { kNone, kConverged, kNotShrinking, kRoundLimit };
std::string_view StopReasonName(StopReason r);  // "converged", "not shrinking", "round limit"

struct PolicyResult {
  Decision decision = Decision::kContinue;
  StopReason stop = StopReason::kNone;
  double predicted_stun_ms = 0;
  std::string reason;
};

PolicyResult DecideSwitchover(const PolicyInput& in);
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
