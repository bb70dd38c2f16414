// What becomes of a source once its session has ended (the device's
// SaveCleanup hook is told, and a released one is scrubbed): zeroing a released
// source's memory after a completed migration (Device::Scrub), outside the stun,
// and saying in the report what was done or why not.
#pragma once

#include "gpumigrate/common/clock.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/session/report.h"
#include "gpumigrate/session/session.h"

namespace gpumigrate {

// What the SaveCleanup hook is told: a completed session's fate maps onto the
// hook's three cases (device.h): released like a migrated source (kCompleted:
// the one case that is scrubbed), running on like a rolled-back one, or held
// stopped like an in-doubt one.
Outcome CleanupFor(Outcome outcome, SourceFate fate);

// Scrubs `dev` unless `enabled` is false; fills report.scrubbed, scrub_ms and scrub.
void Scrub(Device& dev, bool enabled, Clock& clock, MigrationReport& report);

}  // namespace gpumigrate
