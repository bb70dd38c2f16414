// The path calibration's runs (gpumigrate/path_calibration.h): this binary's own
// `receive` and `migrate` as two processes on loopback, with the transport,
// streams, codec and cap of the configuration, on a small sim device. Each run
// is a real migration between two processes; the fit turns their reports into
// the figures `estimate` models with.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "gpumigrate/path_calibration.h"
#include "gpumigrate/report.h"

namespace gpumigrate::cli {

// The sim devices a configuration is calibrated on: 512 MiB uncapped, or what
// the cap moves in 1 s (64 to 512 MiB), with a large final round; a quarter of
// that with a nearly empty one. $GPUMIGRATE_PATH_CALIBRATION_SIZE overrides the
// larger size (e.g. for tests).
std::string PathCalibrationDevice(const PathConfig& c, bool large_final);

// A proc backend's runs migrate gpumigrate-workload processes (the shim linked
// in): $GPUMIGRATE_WORKLOAD, else the one beside this binary; an error when
// neither is there (FailedPrecondition). The arguments of the two kinds' source (the destination
// adds --adopt).
Result<std::string> PathCalibrationWorkload();
std::vector<std::string> ProcCalibrationWorkload(const PathConfig& c, bool large_final);

// Adds what a completed migration `r` on `c`'s path measured against `c` to
// the host's record (path_spread.h).
Status RecordAgainstPath(const PathCalibration& c, const MigrationReport& r);

// The stored calibration of `c`, or (none stored, or `force`) four migrations
// measured now and stored. Progress goes to `progress`.
Result<PathCalibration> LoadOrMeasurePath(const PathConfig& c, bool force, FILE* progress, bool* measured_now);

}  // namespace gpumigrate::cli
