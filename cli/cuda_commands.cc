#include "cli/cuda_commands.h"

#include <chrono>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/print.h"
#include "gpumigrate/devices/cuda_checkpoint.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {
namespace {

void AddPid(CLI::App* c, CudaFlags& f) {
  c->add_option("pid", f.pid, "The CUDA process")->required()->check(CLI::PositiveNumber);
  c->add_flag("--json", f.json, "Print one JSON object on stdout");
}

// The exit code of a failure (README, CLI contract), from the Status code first:
// 2 when there is no driver, no CUDA process, or one the driver cannot
// checkpoint (nothing done); 1 when the process is known RUNNING (a lock timeout,
// a checkpoint unlocked back); 3 when it is in doubt. Only for a refusal
// (kFailedPrecondition, nothing done) or an unexpected code is the driver asked
// again: RUNNING gives 1, anything else (LOCKED, CHECKPOINTED, FAILED, in
// progress, or a state that cannot be read) 3. `state` gets the state to report,
// "UNKNOWN" when it cannot be read.
int ExitCode(const Status& s, int pid, std::string* state) {
  const auto query = [&] {
    auto info = QueryCudaProcess(pid);
    *state = info.ok() ? std::string(CudaProcessStateName(info->state)) : "UNKNOWN";
    return info.ok() ? std::optional<CudaProcessState>(info->state) : std::nullopt;
  };
  switch (s.code()) {
    case StatusCode::kUnavailable:
    case StatusCode::kInvalidArgument:
    case StatusCode::kUnimplemented:
      return 2;
    case StatusCode::kAborted:
    case StatusCode::kDeadlineExceeded:
      *state = "RUNNING";
      return 1;
    case StatusCode::kInDoubt:
      query();
      return 3;
    default: {
      const auto now = query();
      return now == CudaProcessState::kRunning ? 1 : 3;
    }
  }
}

int RunState(const CudaFlags& f) {
  auto info = QueryCudaProcess(f.pid);
  if (!info.ok()) {
    if (f.json) Print("{}\n", nlohmann::ordered_json{{"pid", f.pid}, {"error", info.status().message()}}.dump());
    Print(stderr, "gpumigrate cuda state: {}\n", info.status().message());
    return 2;
  }
  if (f.json) {
    nlohmann::ordered_json j;
    j["pid"] = info->pid;
    j["state"] = CudaProcessStateName(info->state);
    j["restore_tid"] = info->restore_tid;
    j["driver"] = info->driver_path;
    j["driver_version"] = fmt::format("{}.{}", info->driver_version / 1000, (info->driver_version % 1000) / 10);
    Print("{}\n", j.dump());
  } else {
    Print("process {}: {} (restore thread {}; driver {}, CUDA {}.{})\n", info->pid, CudaProcessStateName(info->state),
          info->restore_tid, info->driver_path, info->driver_version / 1000, (info->driver_version % 1000) / 10);
  }
  return 0;
}

int RunChange(const CudaFlags& f, bool suspend) {
  const char* cmd = suspend ? "cuda suspend" : "cuda resume";
  Status st;
  if (suspend) {
    auto timeout = ParseDuration(f.timeout);
    if (!timeout.ok()) {
      Print(stderr, "gpumigrate {}: --timeout: {}\n", cmd, timeout.status().message());
      return 2;
    }
    // Rounded up: a timeout under 1 ms must not become 0 (= wait for ever).
    st = SuspendCudaProcess(f.pid, std::chrono::ceil<std::chrono::milliseconds>(*timeout));
  } else {
    st = ResumeCudaProcess(f.pid);
  }
  std::string state = suspend ? "CHECKPOINTED" : "RUNNING";
  const int rc = st.ok() ? 0 : ExitCode(st, f.pid, &state);
  if (f.json) {
    nlohmann::ordered_json j;
    j["pid"] = f.pid;
    j["outcome"] = st.ok() ? (suspend ? "suspended" : "resumed") : "failed";
    if (rc != 2) j["state"] = state;
    if (!st.ok()) j["error"] = st.message();
    Print("{}\n", j.dump());
  }
  if (!st.ok()) {
    Print(stderr, "gpumigrate {}: {}\n", cmd, st.message());
    return rc;
  }
  if (!f.json) {
    Print("gpumigrate {}: process {} {}\n", cmd, f.pid,
          suspend ? "suspended: CHECKPOINTED (its device memory is held by the driver; the GPU is free)"
                  : "resumed: RUNNING");
  }
  return 0;
}

}  // namespace

CLI::App* AddCudaCommand(CLI::App& app, CudaFlags& f) {
  auto* c = app.add_subcommand(
      "cuda",
      "Suspend and resume a CUDA process with the driver's checkpoint API (driver 570 / CUDA 12.8 or newer): "
      "`cuda state PID`, `cuda suspend PID` (lock, then checkpoint: its device memory moves to host memory and the "
      "GPU is freed), `cuda resume PID` (restore, then unlock).");
  c->require_subcommand(1);
  f.state_cmd = c->add_subcommand("state", "Print the process's checkpoint state: RUNNING, LOCKED, CHECKPOINTED");
  AddPid(f.state_cmd, f);
  f.suspend_cmd = c->add_subcommand(
      "suspend",
      "Lock the process (its CUDA calls in flight finish, new ones wait), then checkpoint it; a failed checkpoint is "
      "unlocked again. Refuses a process that is not RUNNING.");
  AddPid(f.suspend_cmd, f);
  f.suspend_cmd
      ->add_option("--timeout", f.timeout,
                   "How long the lock may wait for the process's CUDA calls in flight (0: for ever); on expiry it "
                   "stays RUNNING and the command fails")
      ->capture_default_str();
  f.resume_cmd = c->add_subcommand("resume", "Restore the process's device memory (if checkpointed), then unlock it");
  AddPid(f.resume_cmd, f);
  return c;
}

int RunCuda(const CudaFlags& f) {
  if (*f.state_cmd) return RunState(f);
  if (*f.suspend_cmd) return RunChange(f, true);
  if (*f.resume_cmd) return RunChange(f, false);
  return 2;
}

}  // namespace gpumigrate::cli
