// Calibration of the switchover's fixed costs and of the in-process pipeline's
// bandwidth, measured once on this host and stored, so that estimates and the
// engine's switchover rule use measured figures rather than assumed ones.
//
// Measured by migrating a small sim device in process three times: the fixed
// cost is the median stun less its data-moving part (final_data), the bandwidth
// the median round-0 throughput. Stored as JSON at $GPUMIGRATE_CALIBRATION, or
// $XDG_CACHE_HOME/gpumigrate/calibration.json, or ~/.cache/gpumigrate/calibration.json.
#pragma once

#include <chrono>

#include <string>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct Calibration {
  double fixed_cost_ms = 0;
  double inprocess_bytes_per_s = 0;      // median of the runs
  double inprocess_low_bytes_per_s = 0;  // slowest run
  double inprocess_high_bytes_per_s = 0; // fastest run
  std::string measured_at;  // UTC, ISO 8601
  std::string path;         // where it is stored
  bool measured_now = false;
};

std::string DefaultCalibrationPath();
Result<Calibration> MeasureCalibration();
// The stored calibration, or an error when there is none or it does not parse.
Result<Calibration> LoadStoredCalibration();
// The switchover's fixed cost (round trips, device stop and resume) as this
// host measured it, when a calibration is stored; else `fallback`.
std::chrono::nanoseconds StoredFixedCost(std::chrono::nanoseconds fallback);
// Loads the stored calibration, or measures and stores one when there is none,
// it does not parse, or `force` is set.
Result<Calibration> LoadOrCalibrate(bool force);

}  // namespace gpumigrate
