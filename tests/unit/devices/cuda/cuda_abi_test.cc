// engine/devices/cuda/cuda_abi.h against the driver's own cuda.h, where the CUDA
// toolkit is installed (GM_HAVE_CUDA_H): sizes, offsets and values must agree,
// or gpumigrate would pass the driver misread arguments.
#include "engine/devices/cuda/cuda_abi.h"

#include <cstddef>

#include <gtest/gtest.h>

// cuda.h makes this name a macro: take our value before including it.
constexpr unsigned kOurHostRegisterPortable = gpumigrate::cuda::CU_MEMHOSTREGISTER_PORTABLE;

#ifdef GM_HAVE_CUDA_H
#include <cuda.h>
#endif

namespace gm = gpumigrate::cuda;

namespace {

#ifdef GM_HAVE_CUDA_H

TEST(CudaAbi, ScalarTypesMatch) {
  EXPECT_EQ(sizeof(gm::CUdeviceptr), sizeof(::CUdeviceptr));
  EXPECT_EQ(sizeof(gm::CUresult), sizeof(::CUresult));
  EXPECT_EQ(sizeof(gm::CUdevice), sizeof(::CUdevice));
  EXPECT_EQ(sizeof(gm::CUprocessState), sizeof(::CUprocessState));
  EXPECT_EQ(sizeof(gm::CUuuid), sizeof(::CUuuid));
  EXPECT_EQ(kOurHostRegisterPortable, static_cast<unsigned>(CU_MEMHOSTREGISTER_PORTABLE));
}

TEST(CudaAbi, ResultCodesMatch) {
  EXPECT_EQ(gm::CUDA_SUCCESS, ::CUDA_SUCCESS);
  EXPECT_EQ(gm::CUDA_ERROR_INVALID_VALUE, ::CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(gm::CUDA_ERROR_OUT_OF_MEMORY, ::CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(gm::CUDA_ERROR_NOT_INITIALIZED, ::CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(gm::CUDA_ERROR_DEINITIALIZED, ::CUDA_ERROR_DEINITIALIZED);
  EXPECT_EQ(gm::CUDA_ERROR_STUB_LIBRARY, ::CUDA_ERROR_STUB_LIBRARY);
  EXPECT_EQ(gm::CUDA_ERROR_NO_DEVICE, ::CUDA_ERROR_NO_DEVICE);
  EXPECT_EQ(gm::CUDA_ERROR_INVALID_DEVICE, ::CUDA_ERROR_INVALID_DEVICE);
  EXPECT_EQ(gm::CUDA_ERROR_INVALID_IMAGE, ::CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(gm::CUDA_ERROR_INVALID_CONTEXT, ::CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(gm::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, ::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(gm::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, ::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  EXPECT_EQ(gm::CUDA_ERROR_INVALID_HANDLE, ::CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(gm::CUDA_ERROR_ILLEGAL_STATE, ::CUDA_ERROR_ILLEGAL_STATE);
  EXPECT_EQ(gm::CUDA_ERROR_NOT_FOUND, ::CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(gm::CUDA_ERROR_NOT_READY, ::CUDA_ERROR_NOT_READY);
  EXPECT_EQ(gm::CUDA_ERROR_ILLEGAL_ADDRESS, ::CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(gm::CUDA_ERROR_LAUNCH_FAILED, ::CUDA_ERROR_LAUNCH_FAILED);
  EXPECT_EQ(gm::CUDA_ERROR_NOT_PERMITTED, ::CUDA_ERROR_NOT_PERMITTED);
  EXPECT_EQ(gm::CUDA_ERROR_NOT_SUPPORTED, ::CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(gm::CUDA_ERROR_TIMEOUT, ::CUDA_ERROR_TIMEOUT);
  EXPECT_EQ(gm::CUDA_ERROR_UNKNOWN, ::CUDA_ERROR_UNKNOWN);
}

TEST(CudaAbi, ProcessStatesMatch) {
  EXPECT_EQ(gm::CU_PROCESS_STATE_RUNNING, static_cast<int>(::CU_PROCESS_STATE_RUNNING));
  EXPECT_EQ(gm::CU_PROCESS_STATE_LOCKED, static_cast<int>(::CU_PROCESS_STATE_LOCKED));
  EXPECT_EQ(gm::CU_PROCESS_STATE_CHECKPOINTED, static_cast<int>(::CU_PROCESS_STATE_CHECKPOINTED));
  EXPECT_EQ(gm::CU_PROCESS_STATE_FAILED, static_cast<int>(::CU_PROCESS_STATE_FAILED));
}

TEST(CudaAbi, CheckpointArgumentLayoutsMatch) {
  EXPECT_EQ(sizeof(gm::CUcheckpointLockArgs), sizeof(::CUcheckpointLockArgs));
  EXPECT_EQ(offsetof(gm::CUcheckpointLockArgs, timeoutMs), offsetof(::CUcheckpointLockArgs, timeoutMs));
  EXPECT_EQ(offsetof(gm::CUcheckpointLockArgs, reserved1), offsetof(::CUcheckpointLockArgs, reserved1));
  EXPECT_EQ(sizeof(gm::CUcheckpointCheckpointArgs), sizeof(::CUcheckpointCheckpointArgs));
  EXPECT_EQ(sizeof(gm::CUcheckpointUnlockArgs), sizeof(::CUcheckpointUnlockArgs));
  EXPECT_EQ(sizeof(gm::CUcheckpointGpuPair), sizeof(::CUcheckpointGpuPair));
  EXPECT_EQ(offsetof(gm::CUcheckpointGpuPair, newUuid), offsetof(::CUcheckpointGpuPair, newUuid));
  EXPECT_EQ(sizeof(gm::CUcheckpointRestoreArgs), sizeof(::CUcheckpointRestoreArgs));
  EXPECT_EQ(offsetof(gm::CUcheckpointRestoreArgs, gpuPairs), offsetof(::CUcheckpointRestoreArgs, gpuPairs));
  EXPECT_EQ(offsetof(gm::CUcheckpointRestoreArgs, gpuPairsCount), offsetof(::CUcheckpointRestoreArgs, gpuPairsCount));
  EXPECT_EQ(offsetof(gm::CUcheckpointRestoreArgs, reserved1), offsetof(::CUcheckpointRestoreArgs, reserved1));
}

TEST(CudaAbi, TheCheckpointApiVersionIsThatOfCuda12_8) {
  EXPECT_GE(CUDA_VERSION, gm::kCheckpointApiVersion) << "cuda.h predates the checkpoint API";
  EXPECT_EQ(gm::kCheckpointApiVersion, 12080);
}

#else

TEST(CudaAbi, NeedsCudaH) {
  (void)kOurHostRegisterPortable;
  GTEST_SKIP() << "cuda.h not installed (looked in /usr/local/cuda/include): nothing to compare";
}

#endif

}  // namespace
