#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/devices/sim.h"

namespace gpumigrate {

SimResumeCheck RunResumeCheck(SimDevice& dest, std::chrono::nanoseconds run_after, Clock& clock) {
  SimResumeCheck c;
  c.resumed_at = dest.Position();
  c.run_after = run_after;
  clock.SleepUntil(clock.Now() + run_after);
  c.status = dest.SetState(DeviceState::kStop);
  c.kernels_run = dest.KernelsRun();
  if (!c.status.ok()) return c;
  auto checked = dest.SelfCheck();
  if (checked.ok()) {
    c.pages_checked = *checked;
  } else {
    c.status = checked.status();
  }
  return c;
}

std::string SimResumeCheck::ToJson() const {
  nlohmann::ordered_json j{{"resumed_at_step", resumed_at.step},
                           {"resumed_at_layer", resumed_at.layer},
                           {"kernels_run_after_resume", kernels_run},
                           {"self_check", ok() ? std::string("ok") : status.message()}};
  return j.dump();
}

std::string SimResumeCheck::ToLine() const {
  return fmt::format(
      "  destination: resumed at step {} layer {}, ran {} kernels in {:.1f} s; self-check of activation canaries: {}",
      resumed_at.step, resumed_at.layer, kernels_run, std::chrono::duration<double>(run_after).count(),
      ok() ? fmt::format("ok ({} pages)", pages_checked) : status.message());
}

}  // namespace gpumigrate
