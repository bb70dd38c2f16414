// Suspend and resume a CUDA process with the driver's checkpoint API
// (cuCheckpointProcess*, driver 570 / CUDA 12.8 or newer), from another
// process. The driver is loaded at run time (libcuda.so.1, or
// $GPUMIGRATE_LIBCUDA); where it is absent every call says so.
//
// The driver's process states, and what moves between them:
//
//   RUNNING ──lock──▶ LOCKED ──checkpoint──▶ CHECKPOINTED
//      ▲                │  ▲                     │
//      └─────unlock─────┘  └──────restore────────┘
//
// LOCKED: every CUDA call of the process waits; CHECKPOINTED: its device memory
// is held by the driver in host memory and the GPU is free. CPU threads run on.
//
// Suspend = lock (within a timeout) then checkpoint; when the checkpoint fails it
// unlocks again, so the process runs on. It refuses a process that is not
// RUNNING (an earlier gpumigrate that died, or another tool, holds it): that
// process is reported, never unlocked behind the holder's back. Resume = restore
// (when CHECKPOINTED) then unlock. Every error names the driver call, the
// driver's error, and the state the process is in afterwards.
//
// Thread safety: the functions may be called from any thread; two controllers of
// one process race as they would with the driver itself.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

// CHECKPOINTING and RESTORING (4, 5) are reported by newer drivers (CUDA 13)
// while another controller's checkpoint or restore is under way.
enum class CudaProcessState {
  kRunning = 0,
  kLocked = 1,
  kCheckpointed = 2,
  kFailed = 3,
  kCheckpointing = 4,
  kRestoring = 5,
};
// "RUNNING", "LOCKED", "CHECKPOINTED", "FAILED", "CHECKPOINTING", "RESTORING"
// (the driver's names).
std::string_view CudaProcessStateName(CudaProcessState s);

struct CudaProcessInfo {
  int pid = 0;
  CudaProcessState state = CudaProcessState::kRunning;
  int restore_tid = 0;      // cuCheckpointProcessGetRestoreThreadId
  std::string driver_path;  // the library used
  int driver_version = 0;   // 1000 * major + 10 * minor
};

// The state of `pid`. The driver is initialised (cuInit) in the calling process
// first. Errors: kUnavailable (no driver, one without the checkpoint API, or
// cuInit failed), kInvalidArgument (no such process, or no CUDA in it:
// CUDA_ERROR_INVALID_VALUE); any other error of cuCheckpointProcessGetState with
// the code CudaDriver::Check gives it (e.g. kUnimplemented for
// CUDA_ERROR_NOT_SUPPORTED: a process the driver cannot checkpoint).
Result<CudaProcessInfo> QueryCudaProcess(int pid);

// RUNNING -> CHECKPOINTED. lock_timeout 0 waits for ever for the process's CUDA
// calls in flight. Errors besides QueryCudaProcess's: kFailedPrecondition (not
// RUNNING, CHECKPOINTING/RESTORING in progress, or another controller locked it
// between our query and our lock: refused, nothing done), kDeadlineExceeded (the lock timed out; still
// RUNNING), kAborted (the checkpoint failed and the process was unlocked:
// RUNNING), kInDoubt (a step failed and the process is left neither RUNNING nor
// CHECKPOINTED; the message says which state).
Status SuspendCudaProcess(int pid, std::chrono::milliseconds lock_timeout);

// CHECKPOINTED or LOCKED -> RUNNING. Errors besides QueryCudaProcess's:
// kFailedPrecondition (RUNNING: nothing to resume; FAILED; CHECKPOINTING or
// RESTORING in progress), kInDoubt (restore or unlock failed; the message says
// the state found after; a restore refused with CUDA_ERROR_NOT_INITIALIZED
// names persistence mode).
Status ResumeCudaProcess(int pid);

// One driver step, as `cuda-checkpoint --action` does it (no state checks of
// our own: the driver's error, named with the call and the state found, is the
// answer). timeout applies to kLock only.
enum class CudaAction { kLock, kCheckpoint, kRestore, kUnlock };
std::string_view CudaActionName(CudaAction a);  // "lock", "checkpoint", ...
Status CudaProcessAction(int pid, CudaAction action, std::chrono::milliseconds timeout = {});

}  // namespace gpumigrate
