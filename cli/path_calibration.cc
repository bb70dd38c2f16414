#include "cli/path_calibration.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "cli/print.h"

namespace gpumigrate::cli {

Result<std::string> PathCalibrationWorkload() {
  if (const char* e = std::getenv("GPUMIGRATE_WORKLOAD"); e && *e) {
    if (::access(e, X_OK) == 0) return std::string(e);
    return FailedPrecondition(fmt::format("$GPUMIGRATE_WORKLOAD {} is not an executable", e));
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path beside = self.parent_path() / "gpumigrate-workload";
  if (!ec && ::access(beside.c_str(), X_OK) == 0) return beside.string();
  return FailedPrecondition(fmt::format(
      "a proc device's calibration migrates gpumigrate-workload processes: none at {} and no $GPUMIGRATE_WORKLOAD",
      beside.string()));
}

PathRunPrograms PathPrograms(const char* cmd) {
  PathRunPrograms p;
  std::error_code ec;
  p.gpumigrate = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (auto wl = PathCalibrationWorkload(); wl.ok()) {
    p.workload = *wl;
  } else {
    p.workload_missing = std::string(wl.status().message());
  }
  p.progress = [cmd](const std::string& line) { Print(stderr, "gpumigrate {}: {}\n", cmd, line); };
  return p;
}

}  // namespace gpumigrate::cli
