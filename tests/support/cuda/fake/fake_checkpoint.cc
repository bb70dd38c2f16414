// The checkpoint API's entry points (only in libcuda-fake.so, not -old).
// Placeholder: the cross-process service lands next; until then every call
// answers CUDA_ERROR_NOT_SUPPORTED.
#include "tests/support/cuda/fake/fake_libcuda.h"

using namespace gpumigrate::cuda;  // NOLINT: the exported C API below

GM_FAKE_EXPORT CUresult cuCheckpointProcessGetState(int, CUprocessState*) { return CUDA_ERROR_NOT_SUPPORTED; }
GM_FAKE_EXPORT CUresult cuCheckpointProcessLock(int, CUcheckpointLockArgs*) { return CUDA_ERROR_NOT_SUPPORTED; }
GM_FAKE_EXPORT CUresult cuCheckpointProcessCheckpoint(int, CUcheckpointCheckpointArgs*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}
GM_FAKE_EXPORT CUresult cuCheckpointProcessRestore(int, CUcheckpointRestoreArgs*) { return CUDA_ERROR_NOT_SUPPORTED; }
GM_FAKE_EXPORT CUresult cuCheckpointProcessUnlock(int, CUcheckpointUnlockArgs*) { return CUDA_ERROR_NOT_SUPPORTED; }
GM_FAKE_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int, int*) { return CUDA_ERROR_NOT_SUPPORTED; }
