#include "engine/session/scrub.h"

#include <chrono>

#include <fmt/format.h>

namespace gpumigrate {

Outcome CleanupFor(Outcome outcome, SourceFate fate) {
  if (outcome != Outcome::kCompleted) return outcome;
  switch (fate) {
    case SourceFate::kResume: return Outcome::kAborted;
    case SourceFate::kStop: return Outcome::kInDoubt;
    case SourceFate::kRelease: break;
  }
  return Outcome::kCompleted;
}

void Scrub(Device& dev, bool enabled, Clock& clock, MigrationReport& report) {
  if (!enabled) {
    report.scrubbed = false;
    report.scrub = "not scrubbed (--no-scrub): the source's memory still holds the workload's data";
    return;
  }
  const auto t0 = clock.Now();
  Status st = dev.Scrub();
  report.scrub_ms = std::chrono::duration<double, std::milli>(clock.Now() - t0).count();
  report.scrubbed = st.ok();
  report.scrub = st.ok() ? fmt::format("the source's memory was zeroed ({} bytes)", report.device_bytes)
                         : fmt::format("not scrubbed: {}", st.message());
}

}  // namespace gpumigrate
