// The checkpoint API's entry points, called in the controller (only in
// libcuda-fake.so, not -old): each maps the target's state file and reads it
// or posts a request to the target's service thread (fake_shared_state.h).
#include <sys/file.h>

#include "tests/support/cuda/fake/fake_libcuda.h"
#include "tests/support/cuda/fake/fake_shared_state.h"

namespace gpumigrate::cuda::fake {
namespace {

// How often a waiting controller checks that the target is still there.
constexpr int kLivenessPollMs = 50;

// Waits until `word` equals `want`; false when the target went away first.
bool WaitFor(const SharedStateView& view, std::atomic<uint32_t>* word, uint32_t want) {
  for (uint32_t now = word->load(); now != want; now = word->load()) {
    if (!view.TargetAlive()) return false;
    FutexWait(word, now, kLivenessPollMs);
  }
  return true;
}

// Posts `op` to the target and returns its result. A pid with no live CUDA
// process: CUDA_ERROR_INVALID_VALUE (an assumption, fake_libcuda.h).
CUresult Request(int pid, Op op, uint32_t arg) {
  SharedStateView view(GetConfig().dir, pid);
  if (!view.ok()) return CUDA_ERROR_INVALID_VALUE;
  SharedState* s = view.get();
  if (flock(view.fd(), LOCK_EX) != 0) return CUDA_ERROR_UNKNOWN;
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  // A controller killed mid-request left it to finish: wait for that first.
  if (WaitFor(view, &s->response_seq, s->request_seq.load())) {
    s->op.store(static_cast<uint32_t>(op));
    s->arg.store(arg);
    const uint32_t seq = s->request_seq.fetch_add(1) + 1;
    FutexWakeAll(&s->request_seq);
    if (WaitFor(view, &s->response_seq, seq)) r = s->result.load();
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
  if (args != nullptr && (args->gpuPairs != nullptr || args->gpuPairsCount != 0)) return CUDA_ERROR_NOT_SUPPORTED;
  return Request(pid, Op::kRestore, 0);
}

GM_FAKE_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* /*args*/) {
  if (CUresult f = InjectedFailure("cuCheckpointProcessUnlock")) return f;
  return Request(pid, Op::kUnlock, 0);
}
