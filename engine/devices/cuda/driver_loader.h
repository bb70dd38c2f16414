// Loads the CUDA driver API (libcuda.so.1) with dlopen and resolves the entry
// points gpumigrate uses by name, versioned names (_v2) first. No link-time
// dependency on CUDA: where no driver is installed, Load fails with a sentence
// that says so and every caller reports it. The path is libcuda.so.1, or
// $GPUMIGRATE_LIBCUDA when set (the tests point it at libcuda-fake.so).
//
// Self-contained (no fmt, no Status): the shim, which lives inside a workload
// process, compiles this file too. engine/devices/cuda/driver.h wraps it for the
// engine.
#pragma once

#include <cstddef>
#include <string>

#include "engine/devices/cuda/cuda_abi.h"

namespace gpumigrate::cuda {

// What a caller needs; Load fails naming the first needed symbol that is absent.
enum Need : unsigned {
  kNeedCore = 1u << 0,        // cuInit, cuDriverGetVersion, cuGetErrorName/String, devices
  kNeedMemory = 1u << 1,      // contexts, allocation, copies, host registration, streams
  kNeedModule = 1u << 2,      // cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel
  kNeedCheckpoint = 1u << 3,  // cuCheckpointProcess* (driver >= 570 / CUDA 12.8)
};

struct DriverApi {
  // core
  CUresult (*cuInit)(unsigned int flags) = nullptr;
  CUresult (*cuDriverGetVersion)(int* version) = nullptr;
  CUresult (*cuGetErrorName)(CUresult error, const char** str) = nullptr;
  CUresult (*cuGetErrorString)(CUresult error, const char** str) = nullptr;
  CUresult (*cuDeviceGetCount)(int* count) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice dev) = nullptr;
  CUresult (*cuDeviceGetUuid)(CUuuid* uuid, CUdevice dev) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t* bytes, CUdevice dev) = nullptr;
  // memory
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext ctx) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  // Optional (resolved with kNeedMemory when the driver has it; nullptr otherwise):
  // the shim records the application's current context with it.
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr* dptr, size_t bytes) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr dptr) = nullptr;
  CUresult (*cuMemGetInfo)(size_t* free_bytes, size_t* total_bytes) = nullptr;
  CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, size_t bytes) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, size_t bytes) = nullptr;
  CUresult (*cuMemsetD32)(CUdeviceptr dst, unsigned int value, size_t count) = nullptr;
  CUresult (*cuMemHostRegister)(void* p, size_t bytes, unsigned int flags) = nullptr;
  CUresult (*cuMemHostUnregister)(void* p) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream stream) = nullptr;
  // module
  CUresult (*cuModuleLoadData)(CUmodule* module, const void* image) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule module) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction* fn, CUmodule module, const char* name) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                             unsigned block_y, unsigned block_z, unsigned shared_bytes, CUstream stream,
                             void** params, void** extra) = nullptr;
  // checkpoint
  CUresult (*cuCheckpointProcessGetState)(int pid, CUprocessState* state) = nullptr;
  CUresult (*cuCheckpointProcessLock)(int pid, CUcheckpointLockArgs* args) = nullptr;
  CUresult (*cuCheckpointProcessCheckpoint)(int pid, CUcheckpointCheckpointArgs* args) = nullptr;
  CUresult (*cuCheckpointProcessRestore)(int pid, CUcheckpointRestoreArgs* args) = nullptr;
  CUresult (*cuCheckpointProcessUnlock)(int pid, CUcheckpointUnlockArgs* args) = nullptr;
  CUresult (*cuCheckpointProcessGetRestoreThreadId)(int pid, int* tid) = nullptr;
};

struct LoadedDriver {
  DriverApi api;
  void* handle = nullptr;  // from dlopen; never closed (the driver does not support unloading)
  std::string path;        // what was opened
  int version = 0;         // cuDriverGetVersion: 1000*major + 10*minor
};

// "$GPUMIGRATE_LIBCUDA" when set and non-empty, else "libcuda.so.1".
std::string DriverPath();

// Opens the driver, resolves what `needs` asks for, reads the driver version
// and, with kNeedCheckpoint, refuses a driver older than kCheckpointApiVersion.
// Returns an empty string on success, else what is wrong, in words (the path,
// dlopen's error, the missing symbol, the version found and the one needed).
// Does not call cuInit.
std::string LoadDriver(unsigned needs, LoadedDriver* out);

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)", or "CUresult 12345" when the
// driver does not know the code (or cannot say).
std::string ResultText(const DriverApi& api, CUresult r);

// "12.8" from 12080.
std::string VersionText(int version);

}  // namespace gpumigrate::cuda
