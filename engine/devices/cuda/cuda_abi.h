// The subset of the CUDA driver API's ABI that gpumigrate uses, declared here so
// that nothing needs cuda.h to build: the driver is loaded with dlopen at run time
// (driver_loader.h). Values and layouts follow CUDA 13.0's cuda.h; the test
// tests/unit/devices/cuda/cuda_abi_test.cc compares them with cuda.h where it is
// installed. Argument structs are zero-initialised before use, as the
// documentation of the checkpoint API asks ("reserved, must be zeroed").
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpumigrate::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT: the driver's own type
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
inline constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
inline constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_IMAGE = 200;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712;
inline constexpr CUresult CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_STATE = 401;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
inline constexpr CUresult CUDA_ERROR_LAUNCH_FAILED = 719;
inline constexpr CUresult CUDA_ERROR_NOT_PERMITTED = 800;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_TIMEOUT = 909;
inline constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

enum CUprocessState : int {
  CU_PROCESS_STATE_RUNNING = 0,
  CU_PROCESS_STATE_LOCKED = 1,
  CU_PROCESS_STATE_CHECKPOINTED = 2,
  CU_PROCESS_STATE_FAILED = 3,
};

struct CUuuid {
  char bytes[16];
};

struct CUcheckpointLockArgs {
  unsigned int timeoutMs;  // 0: no timeout
  unsigned int reserved0;
  uint64_t reserved1[7];
};
struct CUcheckpointCheckpointArgs {
  uint64_t reserved[8];
};
struct CUcheckpointGpuPair {
  CUuuid oldUuid;
  CUuuid newUuid;
};
struct CUcheckpointRestoreArgs {
  CUcheckpointGpuPair* gpuPairs;
  unsigned int gpuPairsCount;
  char reserved[52 - sizeof(CUcheckpointGpuPair*)];
  uint64_t reserved1;
};
struct CUcheckpointUnlockArgs {
  uint64_t reserved[8];
};
static_assert(sizeof(CUcheckpointLockArgs) == 64);
static_assert(sizeof(CUcheckpointCheckpointArgs) == 64);
static_assert(sizeof(CUcheckpointRestoreArgs) == 64);
static_assert(sizeof(CUcheckpointUnlockArgs) == 64);

inline constexpr unsigned int CU_MEMHOSTREGISTER_PORTABLE = 0x01;

// cuDriverGetVersion() reports 1000*major + 10*minor; the checkpoint driver API
// arrived with CUDA 12.8 (driver 570).
inline constexpr int kCheckpointApiVersion = 12080;

}  // namespace gpumigrate::cuda
