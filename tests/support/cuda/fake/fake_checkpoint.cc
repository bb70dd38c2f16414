// The checkpoint API's entry points, called in the controller (only in
// libcuda-fake.so, not -old): each maps the target's state file and reads it
// or posts a request to the target's service thread (fake_shared_state.h).
#include <sys/file.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <thread>

#include "tests/support/cuda/fake/fake_libcuda.h"
#include "tests/support/cuda/fake/fake_shared_state.h"

namespace gpumigrate::cuda::fake {
namespace {

// How often a waiting controller checks that the target is still there.
constexpr int kLivenessPollMs = 50;
// How often a controller with a deadline retries the file lock.
constexpr auto kLockPoll = std::chrono::milliseconds(2);

using Clock = std::chrono::steady_clock;

// Waits until `word` equals `want`; false when the target went away first, or
// (with a deadline) when the deadline passed (*expired set).
bool WaitFor(const SharedStateView& view, std::atomic<uint32_t>* word, uint32_t want,
             std::optional<Clock::time_point> deadline = std::nullopt, bool* expired = nullptr) {
  for (uint32_t now = word->load(); now != want; now = word->load()) {
    if (!view.TargetAlive()) return false;
    int ms = kLivenessPollMs;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) {
        *expired = true;
        return false;
      }
      ms = static_cast<int>(std::min<int64_t>(left, ms));
    }
    FutexWait(word, now, ms);
  }
  return true;
}

// A Lock that could not even be posted before its timeoutMs passed (another
// controller's request held the file): the gate's own rule, as if posted.
CUresult ExpiredLock(const SharedState* s) {
  return s->state.load() == CU_PROCESS_STATE_RUNNING ? CUDA_ERROR_TIMEOUT : CUDA_ERROR_ILLEGAL_STATE;
}

// Posts `op` to the target and returns its result. A pid with no live CUDA
// process: CUDA_ERROR_INVALID_VALUE (an assumption, fake_libcuda.h). A Lock with
// timeoutMs > 0 spends at most that long waiting for the file lock and for an
// earlier request, and passes what is left of it on to the target.
CUresult Request(int pid, Op op, uint32_t arg) {
  SharedStateView view(GetConfig().dir, pid);
  if (!view.ok()) return CUDA_ERROR_INVALID_VALUE;
  SharedState* s = view.get();
  std::optional<Clock::time_point> deadline;
  if (op == Op::kLock && arg > 0) deadline = Clock::now() + std::chrono::milliseconds(arg);
  if (!deadline) {
    if (flock(view.fd(), LOCK_EX) != 0) return CUDA_ERROR_UNKNOWN;
  } else {
    while (flock(view.fd(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) return CUDA_ERROR_UNKNOWN;
      if (Clock::now() >= *deadline) return ExpiredLock(s);
      std::this_thread::sleep_for(kLockPoll);
    }
  }
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  // A controller killed mid-request left it to finish: wait for that first. One
  // killed between posting it and waking the target left the target asleep:
  // wake it (the target also re-checks every kServiceRecheckMs, fake_service.cc).
  if (s->response_seq.load() != s->request_seq.load()) FutexWakeAll(&s->request_seq);
  bool expired = false;
  if (WaitFor(view, &s->response_seq, s->request_seq.load(), deadline, &expired)) {
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      arg = static_cast<uint32_t>(std::max<int64_t>(left, 1));
    }
    s->op.store(static_cast<uint32_t>(op));
    s->arg.store(arg);
    const uint32_t seq = s->request_seq.fetch_add(1) + 1;
    FutexWakeAll(&s->request_seq);
    if (WaitFor(view, &s->response_seq, seq)) r = s->result.load();
  } else if (expired) {
    r = ExpiredLock(s);
  }
  flock(view.fd(), LOCK_UN);
  return r;
}

}  // namespace
}  // namespace gpumigrate::cuda::fake

using namespace gpumigrate::cuda;        // NOLINT: the exported C API below
using namespace gpumigrate::cuda::fake;  // NOLINT

GM_FAKE_EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  if (CUresult f = InjectedFailure("cuCheckpointProcessGetState")) return f;
  if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SharedStateView view(GetConfig().dir, pid);
  if (!view.ok()) return CUDA_ERROR_INVALID_VALUE;
  *state = static_cast<CUprocessState>(view.get()->state.load());
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  if (CUresult f = InjectedFailure("cuCheckpointProcessGetRestoreThreadId")) return f;
  if (tid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  SharedStateView view(GetConfig().dir, pid);
  if (!view.ok()) return CUDA_ERROR_INVALID_VALUE;
  *tid = view.get()->service_tid;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  if (CUresult f = InjectedFailure("cuCheckpointProcessLock")) return f;
  return Request(pid, Op::kLock, args != nullptr ? args->timeoutMs : 0);
}

GM_FAKE_EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* /*args*/) {
  if (CUresult f = InjectedFailure("cuCheckpointProcessCheckpoint")) return f;
  return Request(pid, Op::kCheckpoint, 0);
}

GM_FAKE_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  if (CUresult f = InjectedFailure("cuCheckpointProcessRestore")) return f;
  // "requires persistence mode to be enabled or cuInit to have been called" (D);
  // the fake has no persistence mode, so the calling process's cuInit decides.
  if (!Initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (args != nullptr && (args->gpuPairs != nullptr || args->gpuPairsCount != 0)) return CUDA_ERROR_NOT_SUPPORTED;
  return Request(pid, Op::kRestore, 0);
}

GM_FAKE_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* /*args*/) {
  if (CUresult f = InjectedFailure("cuCheckpointProcessUnlock")) return f;
  return Request(pid, Op::kUnlock, 0);
}
