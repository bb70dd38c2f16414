// Suspend and resume of a CUDA process (include/gpumigrate/devices/cuda_checkpoint.h)
// over the driver's checkpoint API, loaded with CudaDriver.
#include <signal.h>

#include <cerrno>
#include <limits>

#include <fmt/format.h>

#include "engine/devices/cuda/driver.h"
#include "gpumigrate/devices/cuda_checkpoint.h"

namespace gpumigrate {
namespace {

using cuda::CudaDriver;

constexpr const char* kGetState = "cuCheckpointProcessGetState";

// One controller's view of one process: the driver and the pid.
struct Target {
  const CudaDriver* driver;
  int pid;

  Result<CudaProcessState> State() const {
    cuda::CUprocessState s = cuda::CU_PROCESS_STATE_FAILED;
    if (Status st = driver->Check(driver->api().cuCheckpointProcessGetState(pid, &s), kGetState); !st.ok()) {
      return st;
    }
    return static_cast<CudaProcessState>(s);
  }

  // "LOCKED", or "in an unknown state (cuCheckpointProcessGetState failed: ...)".
  std::string StateAfter() const {
    auto s = State();
    return s.ok() ? std::string(CudaProcessStateName(*s)) : "in an unknown state (" + s.status().message() + ")";
  }

  Status Step(CudaAction a, std::chrono::milliseconds timeout) const {
    const cuda::DriverApi& api = driver->api();
    switch (a) {
      case CudaAction::kLock: {
        cuda::CUcheckpointLockArgs args{};
        const auto ms = std::min<int64_t>(timeout.count(), std::numeric_limits<unsigned>::max());
        args.timeoutMs = static_cast<unsigned>(std::max<int64_t>(ms, 0));
        return driver->Check(api.cuCheckpointProcessLock(pid, &args), "cuCheckpointProcessLock");
      }
      case CudaAction::kCheckpoint: {
        cuda::CUcheckpointCheckpointArgs args{};
        return driver->Check(api.cuCheckpointProcessCheckpoint(pid, &args), "cuCheckpointProcessCheckpoint");
      }
      case CudaAction::kRestore: {
        cuda::CUcheckpointRestoreArgs args{};
        const cuda::CUresult r = api.cuCheckpointProcessRestore(pid, &args);
        Status st = driver->Check(r, "cuCheckpointProcessRestore");
        if (r == cuda::CUDA_ERROR_NOT_INITIALIZED) {
          // Open called cuInit here, so what the driver lacks is persistence mode.
          return {st.code(), st.message() + " (restore needs persistence mode or cuInit in the controller; cuInit "
                                            "succeeded here: enable persistence mode (nvidia-smi -pm 1) or keep a "
                                            "CUDA process running on the GPU)"};
        }
        return st;
      }
      case CudaAction::kUnlock: {
        cuda::CUcheckpointUnlockArgs args{};
        return driver->Check(api.cuCheckpointProcessUnlock(pid, &args), "cuCheckpointProcessUnlock");
      }
    }
    return Internal("cuda: unknown action");
  }
};

// The driver and a pid that exists and has CUDA state, with its state now. The
// driver is initialised in this process first: the checkpoint calls may return
// CUDA_ERROR_NOT_INITIALIZED without it, and Restore needs it (or persistence
// mode).
Result<Target> Open(int pid, CudaProcessState* state, std::string_view what) {
  const std::string prefix = fmt::format("cuda: {} of process {} failed", what, pid);
  if (pid <= 0) return InvalidArgument(fmt::format("{}: {} is not a process id", prefix, pid));
  GM_ASSIGN_OR_RETURN(const CudaDriver* driver, CudaDriver::Load(cuda::kNeedCore | cuda::kNeedCheckpoint));
  if (Status st = driver->Check(driver->api().cuInit(0), "cuInit"); !st.ok()) {
    return Unavailable(fmt::format("{}: the driver {} cannot be initialised in this process: {}", prefix,
                                   driver->path(), st.message()));
  }
  if (kill(pid, 0) != 0 && errno == ESRCH) return InvalidArgument(fmt::format("{}: no process {}", prefix, pid));
  Target t{driver, pid};
  auto s = t.State();
  if (!s.ok()) {
    // Only CUDA_ERROR_INVALID_VALUE means "no CUDA here"; anything else (e.g.
    // CUDA_ERROR_NOT_SUPPORTED for a process using UVM or IPC memory) is the
    // driver's own answer and keeps its code.
    if (s.status().code() == StatusCode::kInvalidArgument) {
      return InvalidArgument(fmt::format("{}: the driver knows no CUDA state in it (not a CUDA process, or its "
                                         "driver is not {}): {}",
                                         prefix, driver->path(), s.status().message()));
    }
    return Status{s.status().code(), fmt::format("{}: {}", prefix, s.status().message())};
  }
  *state = *s;
  return t;
}

bool InProgress(CudaProcessState s) {
  return s == CudaProcessState::kCheckpointing || s == CudaProcessState::kRestoring;
}

}  // namespace

std::string_view CudaProcessStateName(CudaProcessState s) {
  switch (s) {
    case CudaProcessState::kRunning: return "RUNNING";
    case CudaProcessState::kLocked: return "LOCKED";
    case CudaProcessState::kCheckpointed: return "CHECKPOINTED";
    case CudaProcessState::kFailed: return "FAILED";
    case CudaProcessState::kCheckpointing: return "CHECKPOINTING";
    case CudaProcessState::kRestoring: return "RESTORING";
  }
  return "UNKNOWN";
}

std::string_view CudaActionName(CudaAction a) {
  switch (a) {
    case CudaAction::kLock: return "lock";
    case CudaAction::kCheckpoint: return "checkpoint";
    case CudaAction::kRestore: return "restore";
    case CudaAction::kUnlock: return "unlock";
  }
  return "unknown";
}

Result<CudaProcessInfo> QueryCudaProcess(int pid) {
  CudaProcessState state{};
  GM_ASSIGN_OR_RETURN(Target t, Open(pid, &state, "state query"));
  CudaProcessInfo info;
  info.pid = pid;
  info.state = state;
  info.driver_path = t.driver->path();
  info.driver_version = t.driver->version();
  int tid = 0;
  if (t.driver->api().cuCheckpointProcessGetRestoreThreadId(pid, &tid) == cuda::CUDA_SUCCESS) info.restore_tid = tid;
  return info;
}

Status SuspendCudaProcess(int pid, std::chrono::milliseconds lock_timeout) {
  CudaProcessState state{};
  GM_ASSIGN_OR_RETURN(Target t, Open(pid, &state, "suspend"));
  const std::string prefix = fmt::format("cuda: suspend of process {} failed", pid);
  if (InProgress(state)) {
    return FailedPrecondition(fmt::format("{}: it is {}: a checkpoint or restore is in progress; not touching it",
                                          prefix, CudaProcessStateName(state)));
  }
  if (state != CudaProcessState::kRunning) {
    return FailedPrecondition(fmt::format(
        "{}: it is {}, not RUNNING: another controller (an earlier gpumigrate that did not finish, or "
        "cuda-checkpoint) holds it; not touching it (`gpumigrate cuda resume {}` lets it run once nothing else "
        "holds it)",
        prefix, CudaProcessStateName(state), pid));
  }
  if (Status st = t.Step(CudaAction::kLock, lock_timeout); !st.ok()) {
    const std::string after = t.StateAfter();
    if (after == "RUNNING") {
      const bool timed_out = st.code() == StatusCode::kDeadlineExceeded;
      const std::string why =
          timed_out ? fmt::format(" (its CUDA calls in flight did not return within {} ms)", lock_timeout.count())
                    : "";
      return {timed_out ? StatusCode::kDeadlineExceeded : StatusCode::kAborted,
              fmt::format("{}: {}{}; the process is {}", prefix, st.message(), why, after)};
    }
    if (st.code() == StatusCode::kFailedPrecondition && (after == "LOCKED" || after == "CHECKPOINTED")) {
      // It was RUNNING a moment ago and our lock found it in another state:
      // another controller locked it in between. It is that controller's now.
      return FailedPrecondition(fmt::format(
          "{}: {}; the process is {}: held by another controller, which locked it between our state query and "
          "our lock; not touching it",
          prefix, st.message(), after));
    }
    return {StatusCode::kInDoubt, fmt::format("{}: {}; the process is {}", prefix, st.message(), after)};
  }
  if (Status st = t.Step(CudaAction::kCheckpoint, {}); !st.ok()) {
    Status unlock = t.Step(CudaAction::kUnlock, {});
    const std::string after = t.StateAfter();
    if (unlock.ok() && after == "RUNNING") {
      return Aborted(fmt::format("{}: {}; unlocked again: the process is RUNNING", prefix, st.message()));
    }
    return {StatusCode::kInDoubt,
            fmt::format("{}: {}; unlocking it back failed too ({}); the process is {}", prefix, st.message(),
                        unlock.ok() ? "no error, but it is not RUNNING" : unlock.message(), after)};
  }
  return Status::Ok();
}

Status ResumeCudaProcess(int pid) {
  CudaProcessState state{};
  GM_ASSIGN_OR_RETURN(Target t, Open(pid, &state, "resume"));
  const std::string prefix = fmt::format("cuda: resume of process {} failed", pid);
  if (InProgress(state)) {
    return FailedPrecondition(fmt::format("{}: it is {}: a checkpoint or restore is in progress; not touching it",
                                          prefix, CudaProcessStateName(state)));
  }
  if (state == CudaProcessState::kRunning || state == CudaProcessState::kFailed) {
    return FailedPrecondition(fmt::format("{}: it is {}: {}", prefix, CudaProcessStateName(state),
                                          state == CudaProcessState::kRunning ? "nothing to resume"
                                                                              : "the driver cannot resume it"));
  }
  if (state == CudaProcessState::kCheckpointed) {
    if (Status st = t.Step(CudaAction::kRestore, {}); !st.ok()) {
      return {StatusCode::kInDoubt, fmt::format("{}: {}; the process is {}", prefix, st.message(), t.StateAfter())};
    }
  }
  if (Status st = t.Step(CudaAction::kUnlock, {}); !st.ok()) {
    return {StatusCode::kInDoubt, fmt::format("{}: {}; the process is {}", prefix, st.message(), t.StateAfter())};
  }
  return Status::Ok();
}

Status CudaProcessAction(int pid, CudaAction action, std::chrono::milliseconds timeout) {
  CudaProcessState state{};
  const std::string what(CudaActionName(action));
  GM_ASSIGN_OR_RETURN(Target t, Open(pid, &state, what));
  if (Status st = t.Step(action, timeout); !st.ok()) {
    return {st.code(), fmt::format("cuda: {} of process {} failed: {} (it was {}; it is {})", what, pid,
                                   st.message(), CudaProcessStateName(state), t.StateAfter())};
  }
  return Status::Ok();
}

}  // namespace gpumigrate
