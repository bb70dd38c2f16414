// libcuda-fake.so: a test double of the CUDA driver API (the subset gpumigrate
// loads, engine/devices/cuda/driver_loader.h), exported under the driver's own
// symbol names so that GPUMIGRATE_LIBCUDA can point at it. "Device memory" is
// host memory (one mmap per allocation); a device pointer is its address.
// Kernels run on the CPU, synchronously. libcuda-fake-old.so is the same
// library without the cuCheckpointProcess* symbols (a driver older than 570).
//
// Behaviour, and what it follows: D the documentation (the CUDA driver API
// reference, docs.nvidia.com/cuda/cuda-driver-api, its checkpoint group
// group__CUDA__CHECKPOINT and function pages), A an assumption of this fake
// where the documentation is silent, test a hook for tests that the real driver
// does not have:
//
// | behaviour                                                                    | source     |
// |------------------------------------------------------------------------------|------------|
// | every call but cuDriverGetVersion, cuGetError* and cuCheckpoint* returns     | D          |
// |   CUDA_ERROR_NOT_INITIALIZED before a successful cuInit                      |            |
// | cuInit(flags != 0) -> CUDA_ERROR_INVALID_VALUE                               | D          |
// | cuDriverGetVersion = $GPUMIGRATE_FAKE_CUDA_VERSION (13000), read at every    | A          |
// |   call                                                                       |            |
// | device count = $GPUMIGRATE_FAKE_CUDA_DEVICES (1); with 0, cuInit ->          | D          |
// |   CUDA_ERROR_NO_DEVICE                                                       |            |
// | cuDeviceGet out of range -> CUDA_ERROR_INVALID_DEVICE                        | D          |
// | each device has $GPUMIGRATE_FAKE_CUDA_MEMORY bytes (4 GiB; suffixes K, M, G) | A          |
// | memory calls, module loads and launches with no current context ->           | D          |
// |   CUDA_ERROR_INVALID_CONTEXT                                                 |            |
// | a primary context released to refcount 0 is inactive (->                     | D / A      |
// |   CUDA_ERROR_INVALID_CONTEXT); its memory stays                              |            |
// | cuMemAlloc(0) -> CUDA_ERROR_INVALID_VALUE                                    | D          |
// | an allocation beyond the device's free bytes -> CUDA_ERROR_OUT_OF_MEMORY     | D          |
// | accounting rounds each allocation up to 4 KiB                                | A          |
// | cuMemGetInfo: total = the device's memory, free = total - allocated          | D          |
// | copies and memset touching bytes outside one live allocation, or freed       | A (brief)  |
// |   memory -> CUDA_ERROR_INVALID_VALUE (a real GPU may fault instead)          |            |
// | cuMemFree of a pointer that is not an allocation's base ->                   | D          |
// |   CUDA_ERROR_INVALID_VALUE                                                   |            |
// | cuMemsetD32 needs a 4-byte aligned pointer, else CUDA_ERROR_INVALID_VALUE    | D          |
// | cuMemHostRegister of a range overlapping a registered one -> 712;            | D          |
// |   cuMemHostUnregister of a pointer not registered (as a base) -> 713         |            |
// | streams: only NULL, legacy (0x1) and per-thread (0x2) exist; others ->       | A          |
// |   CUDA_ERROR_INVALID_HANDLE                                                  |            |
// | cuModuleLoadData takes NUL-terminated PTX text (".version") whose ".entry    | A          |
// |   gm_hash_pages" makes its one kernel; anything else ->                      |            |
// |   CUDA_ERROR_INVALID_IMAGE (no cubin or fatbin)                              |            |
// | cuModuleGetFunction of another name -> CUDA_ERROR_NOT_FOUND                  | D          |
// | an unknown or unloaded module or function handle ->                          | D          |
// |   CUDA_ERROR_INVALID_HANDLE                                                  |            |
// | cuLaunchKernel(gm_hash_pages): grid (pages,1,1), block (256,1,1), params     | A (kernel) |
// |   (base, page_bytes, pages, digests), page_bytes a multiple of kHashMinPage, |            |
// |   extra NULL, else CUDA_ERROR_INVALID_VALUE                                  |            |
// | a launch whose pages or digests lie outside allocations ->                   | A          |
// |   CUDA_ERROR_ILLEGAL_ADDRESS, not sticky                                     |            |
// | a launch runs gpumigrate::cuda::HashPages on the CPU before it returns       | A          |
// | checkpoint states RUNNING 0, LOCKED 1, CHECKPOINTED 2; FAILED is never       | D / A      |
// |   entered                                                                    |            |
// | Lock: RUNNING -> LOCKED once the target's calls in flight return; new calls  | D          |
// |   wait meanwhile                                                             |            |
// | Lock with timeoutMs expired: stays RUNNING, returns CUDA_ERROR_TIMEOUT;      | D / A      |
// |   timeoutMs 0 = no limit                                                     |            |
// | a Lock with timeoutMs queued behind another controller's request waits at    | A          |
// |   most timeoutMs for it, then answers by the same rule: RUNNING ->           |            |
// |   CUDA_ERROR_TIMEOUT, otherwise CUDA_ERROR_ILLEGAL_STATE                     |            |
// | while LOCKED or CHECKPOINTED every call of the target (but those not needing | D          |
// |   cuInit) waits                                                              |            |
// | Checkpoint: LOCKED -> CHECKPOINTED; device memory copied to host memory, its | D          |
// |   pages discarded and PROT_NONE, the device's used bytes 0                   |            |
// | Checkpoint without host memory for the copy -> CUDA_ERROR_OUT_OF_MEMORY,     | A          |
// |   nothing released                                                           |            |
// | Restore: CHECKPOINTED -> LOCKED, same addresses, contents intact; gpuPairs   | D / A      |
// |   given -> CUDA_ERROR_NOT_SUPPORTED                                          |            |
// | Unlock: LOCKED -> RUNNING                                                    | D          |
// | any other transition -> CUDA_ERROR_ILLEGAL_STATE                             | D          |
// | a pid with no live CUDA process (no state file, process gone or a zombie,    | A          |
// |   pid reused), or one that dies while a controller waits ->                  |            |
// |   CUDA_ERROR_INVALID_VALUE                                                   |            |
// | cuCheckpointProcessRestore before the calling process's cuInit ->            | D          |
// |   CUDA_ERROR_NOT_INITIALIZED ("requires persistence mode to be enabled or    |            |
// |   cuInit to have been called"; the fake has no persistence mode)             |            |
// | the other cuCheckpoint* need no cuInit in the calling process                | A          |
// | GetRestoreThreadId: the tid of the target's service thread                   | D          |
// | a child forked after cuInit neither publishes into nor removes the parent's  | A          |
// |   state file (it has no service; CUDA does not survive fork)                 |            |
// | $GPUMIGRATE_FAKE_CUDA_FAIL="call=code[,call=code]": that call returns code,  | test       |
// |   before doing anything, in the process that makes it (read at every call)   |            |
// |   and, for cuCheckpointProcessLock/Checkpoint/Restore/Unlock, in the target: |            |
// |   its service fails that step with code before doing anything                |            |
// | $GPUMIGRATE_FAKE_CUDA_SLOW="call=ms[,...]": that call sleeps ms once inside  | test       |
// |   the gate (counted in flight)                                               |            |
// | $GPUMIGRATE_FAKE_CUDA_DIR (default /dev/shm) holds the state files gm-fake-  | test       |
// |   cuda.PID                                                                   |            |
//
// Thread safety: every exported call may be made from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/devices/cuda/cuda_abi.h"

#define GM_FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpumigrate::cuda::fake {

struct Config {
  int version = 13000;
  int devices = 1;
  uint64_t memory_bytes = 4ull << 30;
  std::string dir = "/dev/shm";
};
// Read from the environment once, on first use.
const Config& GetConfig();

// The code $GPUMIGRATE_FAKE_CUDA_FAIL names for `call`, else CUDA_SUCCESS. Read
// at every call, so a test may change it between calls.
CUresult InjectedFailure(const char* call);
// Milliseconds $GPUMIGRATE_FAKE_CUDA_SLOW names for `call`, else 0.
unsigned SlowMs(const char* call);

bool Initialized();

// Entry of every gated call (fake_gate.cc): returns NOT_INITIALIZED before
// cuInit and an injected failure; otherwise waits while the process is locked or
// checkpointed, then counts the call in flight until the guard is destroyed.
class CallGuard {
 public:
  explicit CallGuard(const char* call);
  ~CallGuard();
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;
  CUresult result() const { return result_; }

 private:
  CUresult result_ = CUDA_SUCCESS;
  bool entered_ = false;
};

// The device of the calling thread's current, active context.
CUresult CurrentDevice(int* device);

// Memory (fake_memory.cc). A range [p, p + bytes) lies inside one live allocation.
bool InAllocation(uint64_t p, uint64_t bytes);
uint64_t DeviceUsedBytes(int device);
// For the checkpoint service: every allocation's memory copied out and released,
// or brought back at the same addresses. Called with no call in flight.
CUresult ReleaseAllDeviceMemory();
CUresult RestoreAllDeviceMemory();

// The target side of the checkpoint API (fake_service.cc): publishes the state
// file and starts the service thread; called by the first successful cuInit.
void StartService();
// Mirrors the used bytes of all devices into the state file (for tests).
void PublishDeviceUsed(uint64_t bytes);

}  // namespace gpumigrate::cuda::fake
