// How far this host's migrations stray from their path calibration
// (path_calibration.h), run to run. The calibration's four runs are measured
// back to back and agree within a few percent; a migration an hour later, with
// other work on the cores, does not. Every completed `migrate` on a calibrated
// path records what it measured against what its calibration predicts for the
// same bytes; `estimate` widens its ranges by the spread of those records, so a
// printed range says what this host really does.
//
//   round0_ratio  the migration's round-0 rate past the fitted startup, over the
//                 calibration's round rate;
//   stun_ratio    the measured stun over fixed + final bytes / final rate, with
//                 the migration's own final bytes (the dirty set's spread is the
//                 dry run's to measure, not this one's).
//
// Kept in the path calibration file beside the entries (the last 64), pooled by
// class: a capped path's round 0 is held to its cap, an uncapped one's runs at
// what the cores give, so their spreads differ.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "gpumigrate/estimator/path_calibration.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct PathObservation {
  std::string key;  // PathConfig::Key() of the path it ran
  std::string at;   // UTC, ISO 8601
  bool capped = false;
  double round0_ratio = 0;  // 0: not measured (a round 0 too short past the startup)
  double stun_ratio = 0;    // 0: not measured
};

// What a migration on `c`'s path measured against `c`; nullopt when it says
// nothing (no round 0, no stun).
std::optional<PathObservation> ObservePath(const PathCalibration& c, const PathRun& run, std::string at);

// The records in the path calibration file (oldest first); none when there is no file.
Result<std::vector<PathObservation>> LoadPathObservations();
// Appends one, keeping the last 64; the file is locked while it is rewritten
// (migrations that end together each add theirs).
Status RecordPathObservation(const PathObservation& o);

struct PathSpread {
  int observations = 0;
  std::string pool;  // "capped paths" or "uncapped paths"
  double round0_low = 1, round0_high = 1;
  double stun_low = 1, stun_high = 1;
};
// The spread for a migration on `c`'s path: from the records of its class
// (capped or not), the lowest and highest ratio (from ten records on, the
// twentieth at each end is left out); nullopt below 3 records.
std::optional<PathSpread> SpreadFor(const PathConfig& c, const std::vector<PathObservation>& all);

}  // namespace gpumigrate
