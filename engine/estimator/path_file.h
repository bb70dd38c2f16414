// The path calibration file (DefaultPathCalibrationFile): {"version": 1,
// "paths": {KEY: entry}, "observations": [...]}, shared by the calibration's
// entries (path_calibration.cc) and the host's records (path_spread.cc).
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

// The file as it is; an absent file is an empty version 1 file; a damaged one an error naming it.
Result<nlohmann::ordered_json> ReadPathFile(const std::string& path);
// Reads the file (a damaged one as empty), lets `change` edit it and writes it
// back by rename, under an flock on FILE.lock held throughout.
Status UpdatePathFile(const std::function<void(nlohmann::ordered_json&)>& change);

}  // namespace gpumigrate
