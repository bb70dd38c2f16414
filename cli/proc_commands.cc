#include "cli/proc_commands.h"

#include "cli/print.h"

#include <fmt/format.h>

#include "gpumigrate/devices/proc.h"

namespace gpumigrate::cli {

namespace {

// Both commands take the held source and nothing else.
CLI::App* AddHeldCommand(CLI::App& app, HeldFlags& f, const std::string& name, const std::string& description) {
  auto* c = app.add_subcommand(name, description);
  c->add_option("--device", f.device, "proc:PID or cuda:PID of the held source")->required();
  return c;
}

}  // namespace

CLI::App* AddResumeCommand(CLI::App& app, HeldFlags& f) {
  return AddHeldCommand(app, f, "resume",
                        "Resume a source process held stopped after an in-doubt migration (only once the destination "
                        "is known not to run it)");
}

CLI::App* AddReleaseCommand(CLI::App& app, HeldFlags& f) {
  return AddHeldCommand(app, f, "release",
                        "Tell a source process held after an in-doubt migration that the destination runs it now (it "
                        "exits without running on)");
}

int RunHeld(const HeldFlags& f, bool release) {
  const char* cmd = release ? "release" : "resume";
  Result<ProcSpec> spec = InvalidArgument("");
  if (f.device.rfind("cuda:", 0) == 0) {
    auto cs = ParseCudaSpec(f.device);
    spec = cs.ok() ? Result<ProcSpec>(ProcSpecForCuda(*cs)) : Result<ProcSpec>(cs.status());
  } else {
    spec = ParseProcSpec(f.device);
  }
  if (!spec.ok()) {
    Print(stderr, "gpumigrate {}: {}\n", cmd, spec.status().message());
    return 2;
  }
  spec->tracker = ProcTracking::kHash;  // no write-protect needed to resolve a hold
  auto dev = ProcDevice::Connect(*spec, ProcRole::kSource);
  if (!dev.ok()) {
    Print(stderr, "gpumigrate {}: {}\n", cmd, dev.status().message());
    return 2;
  }
  if ((*dev)->State() != DeviceState::kStop) {
    Print(stderr, "gpumigrate {}: process {} is {}, not held: nothing to do\n", cmd, spec->pid,
               DeviceStateName((*dev)->State()));
    return 1;
  }
  Status st = release ? (*dev)->Release() : (*dev)->SetState(DeviceState::kRunning);
  if (!st.ok()) {
    Print(stderr, "gpumigrate {}: {}\n", cmd, st.message());
    return 1;
  }
  Print("gpumigrate {}: process {} {}\n", cmd, spec->pid,
             release ? "released: it was told that it moved" : "resumed: RUNNING");
  return 0;
}

}  // namespace gpumigrate::cli
