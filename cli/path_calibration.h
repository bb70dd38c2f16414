// The programs the path calibration (gpumigrate/estimator/path_calibration.h, run by
// engine/estimator/path_runner.cc) runs from this CLI: this binary's own
// `receive` and `migrate`, and for a proc device gpumigrate-workload.
#pragma once

#include <string>

#include "gpumigrate/estimator/path_calibration.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::cli {

// gpumigrate-workload: $GPUMIGRATE_WORKLOAD, else the one beside this binary;
// FailedPrecondition when neither is there.
Result<std::string> PathCalibrationWorkload();

// This binary and its workload (workload_missing says why there is none), the
// process launcher, progress lines to stderr ("gpumigrate CMD: ...").
PathRunPrograms PathPrograms(const char* cmd);

}  // namespace gpumigrate::cli
