// `gpumigrate calibrate`: measures this host (the switchover's fixed cost, the
// in-process pipeline, and the per-core rate of each pipeline stage) and stores
// it; `--profile-out FILE` also writes the host profile that `estimate --target
// FILE` reads on another machine.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace gpumigrate::cli {

struct CalibrateFlags {
  std::string profile_out;
  bool json = false;
};

CLI::App* AddCalibrateCommand(CLI::App& app, CalibrateFlags& flags);
int RunCalibrate(const CalibrateFlags& flags);

}  // namespace gpumigrate::cli
