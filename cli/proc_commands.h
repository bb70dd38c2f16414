// `gpumigrate resume` and `gpumigrate release`: resolve a proc source held in
// doubt (paused past STOP when its migration lost contact after the commit).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace gpumigrate::cli {

struct HeldFlags {
  std::string device;
};

CLI::App* AddResumeCommand(CLI::App& app, HeldFlags& f);
CLI::App* AddReleaseCommand(CLI::App& app, HeldFlags& f);
// release = false: resume the source workload; true: tell it that it moved.
int RunHeld(const HeldFlags& f, bool release);

}  // namespace gpumigrate::cli
