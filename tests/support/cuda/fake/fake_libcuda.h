// libcuda-fake.so: a test double of the CUDA driver API (the subset gpumigrate
// loads, engine/devices/cuda/driver_loader.h), exported under the driver's own
// symbol names so that GPUMIGRATE_LIBCUDA can point at it. "Device memory" is
// host memory (one mmap per allocation); a device pointer is its address.
// Kernels run on the CPU, synchronously. libcuda-fake-old.so is the same
// library without the cuCheckpointProcess* symbols (a driver older than 570).
//
// Behaviour, and the documentation (D: CUDA driver API reference, QEMU-FACTS §8,
// KERNEL-FACTS "CUDA") or assumption (A) it follows:
//
// | behaviour                                                        | source |
// |------------------------------------------------------------------|--------|
// | every call but cuDriverGetVersion, cuGetError*, cuCheckpoint*    | D      |
// |   returns CUDA_ERROR_NOT_INITIALIZED before a successful cuInit  |        |
// | cuInit(flags != 0) -> CUDA_ERROR_INVALID_VALUE                   | D      |
// | cuDriverGetVersion = $GPUMIGRATE_FAKE_CUDA_VERSION (13000), read  | A      |
// |   at every call                                                  |        |
// | device count = $GPUMIGRATE_FAKE_CUDA_DEVICES (1); 0 devices:     | D      |
// |   cuInit -> CUDA_ERROR_NO_DEVICE                                 |        |
// | cuDeviceGet out of range -> CUDA_ERROR_INVALID_DEVICE            | D      |
// | each device has $GPUMIGRATE_FAKE_CUDA_MEMORY bytes (4 GiB);      | A      |
// |   accepts suffixes K, M, G                                       |        |
// | memory calls with no current context -> CUDA_ERROR_INVALID_CONTEXT | D    |
// | a primary context released to refcount 0 is inactive: current    | D      |
// |   but released -> CUDA_ERROR_INVALID_CONTEXT; its memory stays     | A      |
// | cuMemAlloc(0) -> CUDA_ERROR_INVALID_VALUE                        | D      |
// | allocations beyond the device's free bytes -> OUT_OF_MEMORY;     | D      |
// |   accounting rounds each allocation up to 4 KiB                  | A      |
// | cuMemGetInfo: total = device memory, free = total - allocated    | D      |
// | copies/memset touching bytes outside one live allocation, or     | A (the |
// |   freed memory -> CUDA_ERROR_INVALID_VALUE (a real GPU may fault) | brief)|
// | cuMemFree of a pointer that is not an allocation's base ->       | D      |
// |   CUDA_ERROR_INVALID_VALUE                                       |        |
// | cuMemsetD32 needs a 4-byte aligned pointer                       | D      |
// | cuMemHostRegister of an overlapping range -> 712, unregister of a | D     |
// |   pointer not registered (as a base) -> 713                      |        |
// | streams: only the NULL, legacy (0x1) and per-thread (0x2) streams | A     |
// |   exist; others -> CUDA_ERROR_INVALID_HANDLE                     |        |
// | cuModuleLoadData takes NUL-terminated PTX text whose              | A     |
// |   ".entry gm_hash_pages" makes the one kernel; else INVALID_IMAGE |       |
// | cuModuleGetFunction of another name -> CUDA_ERROR_NOT_FOUND      | D      |
// | unknown module/function handle -> CUDA_ERROR_INVALID_HANDLE      | D      |
// | cuLaunchKernel(gm_hash_pages): grid (pages,1,1), block (256,1,1),| A (the |
// |   else INVALID_VALUE; params (base, page_bytes, pages, digests); | kernel)|
// |   page_bytes a multiple of kHashMinPage, else INVALID_VALUE;      |       |
// |   source or digests outside allocations -> ILLEGAL_ADDRESS (not   | A     |
// |   sticky here); runs gpumigrate::cuda::HashPages synchronously    |        |
// | checkpoint API: states RUNNING 0, LOCKED 1, CHECKPOINTED 2        | D     |
// | Lock: RUNNING -> LOCKED once the target's in-flight calls return; | D     |
// |   new calls wait meanwhile; timeoutMs expired -> stays RUNNING,   | D     |
// |   and the call returns CUDA_ERROR_TIMEOUT; timeoutMs 0 = no limit | A     |
// | while LOCKED or CHECKPOINTED every gated call of the target waits | D     |
// | Checkpoint: LOCKED -> CHECKPOINTED, device memory copied to host  | D     |
// |   memory and released (pages discarded, PROT_NONE; the device's   |       |
// |   used bytes drop to 0)                                          |        |
// | Restore: CHECKPOINTED -> LOCKED, same addresses, contents intact; | D     |
// |   gpuPairs other than NULL/0 -> CUDA_ERROR_NOT_SUPPORTED          | A     |
// | Unlock: LOCKED -> RUNNING                                         | D     |
// | any other transition -> CUDA_ERROR_ILLEGAL_STATE                  | D     |
// | a pid with no live CUDA process (no state file, process gone, pid | A     |
// |   reused) -> CUDA_ERROR_INVALID_VALUE                             |       |
// | cuCheckpoint* do not need cuInit in the calling process           | A     |
// | GetRestoreThreadId: the tid of the target's service thread        | D      |
// | $GPUMIGRATE_FAKE_CUDA_FAIL="call=code[,call=code]": that call      | test  |
// |   returns code (before doing anything) in the process that makes it|      |
// | $GPUMIGRATE_FAKE_CUDA_SLOW="call=ms[,...]": that call, once inside | test  |
// |   (counted in flight), sleeps ms                                  |       |
// | $GPUMIGRATE_FAKE_CUDA_DIR (/dev/shm): where gm-fake-cuda.PID lives | test  |
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
