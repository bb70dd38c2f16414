// DecideAtLinkRate: the in-round rule of gpumigrate/policy/switchover.h.
#include <fmt/format.h>

#include "gpumigrate/policy/switchover.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {
namespace {

std::string Before(const LinkRateInput& in) {
  return in.peak_bandwidth_bytes_per_s > 2 * in.bandwidth_bytes_per_s
             ? fmt::format(" (it carried {} before)", FormatRate(in.peak_bandwidth_bytes_per_s))
             : std::string();
}

// The time budget: the best case at R, the rest of this round then a final
// round of `final_bytes`, against max_total.
PolicyResult WithinBudget(const LinkRateInput& in, uint64_t final_bytes, PolicyResult r) {
  const double budget_s = std::chrono::duration<double>(in.limits.max_total).count();
  if (budget_s <= 0) return r;
  const double rate = in.bandwidth_bytes_per_s;
  const double fixed_s = std::chrono::duration<double>(in.limits.fixed_cost).count();
  const double left_bytes = static_cast<double>(in.round_left_bytes) + static_cast<double>(final_bytes);
  const double best_s = in.elapsed_s + left_bytes / rate + fixed_s;
  if (best_s <= budget_s) return r;
  r.decision = Decision::kAbort;
  r.stop = StopReason::kOverBudget;
  r.predicted_stun_ms = (static_cast<double>(final_bytes) / rate + fixed_s) * 1e3;
  const double room_s = budget_s - in.elapsed_s - fixed_s;
  const std::string needed =
      room_s > 0 ? fmt::format("it would need {} from now", FormatRate(left_bytes / room_s))
                 : std::string("the budget is spent");
  r.reason = fmt::format(
      "the link carries {} now{}: the rest of round {} ({}) and the smallest final round ({}) take {:.1f} s at that "
      "rate, so the migration would end after {:.1f} s at best, beyond max total {:.0f} s ({}); recommend "
      "drain-and-replace",
      FormatRate(rate), Before(in), in.round, FormatBytes(static_cast<double>(in.round_left_bytes)),
      FormatBytes(static_cast<double>(final_bytes)), left_bytes / rate, best_s, budget_s, needed);
  return r;
}

}  // namespace

PolicyResult DecideAtLinkRate(const LinkRateInput& in) {
  PolicyResult r;
  const double rate = in.bandwidth_bytes_per_s;
  const double written = static_cast<double>(in.written_bytes);
  if (rate <= 0 || in.interval_s <= 0) {
    r.reason = "no measure of the link yet";
    return r;
  }
  if (written < rate * in.interval_s) {
    r.reason = "the link still carries more than the workload writes";
    return WithinBudget(in, in.device_state_bytes, r);
  }
  r.predicted_stun_ms = PredictStunMs(in.written_bytes + in.device_state_bytes, rate, in.limits.fixed_cost);
  const double max_ms = std::chrono::duration<double, std::milli>(in.limits.max_stun).count();
  if (r.predicted_stun_ms <= max_ms || in.limits.switch_when_not_converging) {
    r.reason = fmt::format("the link carries {} now, but a stun of {:.0f} ms at that rate is allowed",
                           FormatRate(rate), r.predicted_stun_ms);
    return WithinBudget(in, in.written_bytes + in.device_state_bytes, r);
  }
  r.decision = Decision::kAbort;
  r.stop = StopReason::kLinkTooSlow;
  r.reason = fmt::format(
      "the link carries {} now{} and the workload wrote {} in {:.1f} s, more than the link carries in that time: no "
      "round can get shorter, so the stun would be at least {:.1f} s, which exceeds max stun {:.0f} ms (rounds "
      "would shrink only on a link faster than the {} the workload writes); recommend drain-and-replace",
      FormatRate(rate), Before(in), FormatBytes(written), in.interval_s, r.predicted_stun_ms / 1e3, max_ms,
      FormatRate(written / in.interval_s));
  return r;
}

}  // namespace gpumigrate
