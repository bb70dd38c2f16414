// DecideAtLinkRate: the in-round rule of gpumigrate/switchover.h.
#include <fmt/format.h>

#include "gpumigrate/switchover.h"
#include "gpumigrate/units.h"

namespace gpumigrate {

PolicyResult DecideAtLinkRate(const LinkRateInput& in) {
  PolicyResult r;
  const double rate = in.bandwidth_bytes_per_s;
  const double written = static_cast<double>(in.written_bytes);
  if (rate <= 0 || in.interval_s <= 0 || written < rate * in.interval_s) {
    r.reason = "the link still carries more than the workload writes";
    return r;
  }
  r.predicted_stun_ms = PredictStunMs(in.written_bytes + in.device_state_bytes, rate, in.limits.fixed_cost);
  const double max_ms = std::chrono::duration<double, std::milli>(in.limits.max_stun).count();
  if (r.predicted_stun_ms <= max_ms || in.limits.switch_when_not_converging) {
    r.reason = fmt::format("the link carries {} now, but a stun of {:.0f} ms at that rate is allowed",
                           FormatRate(rate), r.predicted_stun_ms);
    return r;
  }
  r.decision = Decision::kAbort;
  r.stop = StopReason::kLinkTooSlow;
  const std::string before = in.peak_bandwidth_bytes_per_s > 2 * rate
                                 ? fmt::format(" (it carried {} before)", FormatRate(in.peak_bandwidth_bytes_per_s))
                                 : std::string();
  r.reason = fmt::format(
      "the link carries {} now{} and the workload wrote {} in {:.1f} s, more than the link carries in that time: no "
      "round can get shorter, so the stun would be at least {:.1f} s, which exceeds max stun {:.0f} ms; recommend "
      "drain-and-replace",
      FormatRate(rate), before, FormatBytes(static_cast<double>(in.written_bytes)), in.interval_s,
      r.predicted_stun_ms / 1e3, max_ms);
  return r;
}

}  // namespace gpumigrate
