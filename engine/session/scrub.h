// Zeroing a released source's memory after a completed migration (Device::Scrub),
// outside the stun, and saying in the report what was done or why not.
#pragma once

#include "gpumigrate/clock.h"
#include "gpumigrate/device.h"
#include "gpumigrate/report.h"

namespace gpumigrate {

// Scrubs `dev` unless `enabled` is false; fills report.scrubbed, scrub_ms and scrub.
void Scrub(Device& dev, bool enabled, Clock& clock, MigrationReport& report);

}  // namespace gpumigrate
