#include "engine/devices/cuda/driver_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <initializer_list>

namespace gpumigrate::cuda {
namespace {

// Resolves the first of `names` the library exports. Returns false when none is.
template <typename Fn>
bool Resolve(void* handle, Fn*& slot, std::initializer_list<const char*> names, std::string* missing) {
  for (const char* n : names) {
    if (void* p = dlsym(handle, n)) {
      slot = reinterpret_cast<Fn*>(p);
      return true;
    }
  }
  *missing = *names.begin();
  return false;
}

bool ResolveCore(void* h, DriverApi& a, std::string* m) {
  return Resolve(h, a.cuInit, {"cuInit"}, m) && Resolve(h, a.cuDriverGetVersion, {"cuDriverGetVersion"}, m) &&
         Resolve(h, a.cuGetErrorName, {"cuGetErrorName"}, m) &&
         Resolve(h, a.cuGetErrorString, {"cuGetErrorString"}, m) &&
         Resolve(h, a.cuDeviceGetCount, {"cuDeviceGetCount"}, m) && Resolve(h, a.cuDeviceGet, {"cuDeviceGet"}, m) &&
         Resolve(h, a.cuDeviceGetName, {"cuDeviceGetName"}, m) &&
         Resolve(h, a.cuDeviceGetUuid, {"cuDeviceGetUuid_v2", "cuDeviceGetUuid"}, m) &&
         Resolve(h, a.cuDeviceTotalMem, {"cuDeviceTotalMem_v2"}, m);
}

bool ResolveMemory(void* h, DriverApi& a, std::string* m) {
  return Resolve(h, a.cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}, m) &&
         Resolve(h, a.cuDevicePrimaryCtxRelease, {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"}, m) &&
         Resolve(h, a.cuCtxSetCurrent, {"cuCtxSetCurrent"}, m) &&
         Resolve(h, a.cuCtxSynchronize, {"cuCtxSynchronize"}, m) &&
         Resolve(h, a.cuMemAlloc, {"cuMemAlloc_v2"}, m) && Resolve(h, a.cuMemFree, {"cuMemFree_v2"}, m) &&
         Resolve(h, a.cuMemGetInfo, {"cuMemGetInfo_v2"}, m) &&
         Resolve(h, a.cuMemcpyDtoH, {"cuMemcpyDtoH_v2"}, m) && Resolve(h, a.cuMemcpyHtoD, {"cuMemcpyHtoD_v2"}, m) &&
         Resolve(h, a.cuMemsetD32, {"cuMemsetD32_v2"}, m) &&
         Resolve(h, a.cuMemHostRegister, {"cuMemHostRegister_v2", "cuMemHostRegister"}, m) &&
         Resolve(h, a.cuMemHostUnregister, {"cuMemHostUnregister"}, m) &&
         Resolve(h, a.cuStreamSynchronize, {"cuStreamSynchronize"}, m);
}

bool ResolveModule(void* h, DriverApi& a, std::string* m) {
  return Resolve(h, a.cuModuleLoadData, {"cuModuleLoadData"}, m) &&
         Resolve(h, a.cuModuleUnload, {"cuModuleUnload"}, m) &&
         Resolve(h, a.cuModuleGetFunction, {"cuModuleGetFunction"}, m) &&
         Resolve(h, a.cuLaunchKernel, {"cuLaunchKernel"}, m);
}

bool ResolveCheckpoint(void* h, DriverApi& a, std::string* m) {
  return Resolve(h, a.cuCheckpointProcessGetState, {"cuCheckpointProcessGetState"}, m) &&
         Resolve(h, a.cuCheckpointProcessLock, {"cuCheckpointProcessLock"}, m) &&
         Resolve(h, a.cuCheckpointProcessCheckpoint, {"cuCheckpointProcessCheckpoint"}, m) &&
         Resolve(h, a.cuCheckpointProcessRestore, {"cuCheckpointProcessRestore"}, m) &&
         Resolve(h, a.cuCheckpointProcessUnlock, {"cuCheckpointProcessUnlock"}, m) &&
         Resolve(h, a.cuCheckpointProcessGetRestoreThreadId, {"cuCheckpointProcessGetRestoreThreadId"}, m);
}

}  // namespace

std::string DriverPath() {
  const char* env = std::getenv("GPUMIGRATE_LIBCUDA");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("libcuda.so.1");
}

std::string VersionText(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

std::string LoadDriver(unsigned needs, LoadedDriver* out) {
  *out = LoadedDriver{};
  out->path = DriverPath();
  void* h = dlopen(out->path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    return "the CUDA driver could not be loaded (" + out->path + "): " + (e != nullptr ? e : "unknown dlopen error") +
           "; no NVIDIA driver is installed here, or set GPUMIGRATE_LIBCUDA to its libcuda.so.1";
  }
  out->handle = h;
  DriverApi& a = out->api;
  std::string missing;
  const bool ok = ResolveCore(h, a, &missing) && (!(needs & kNeedMemory) || ResolveMemory(h, a, &missing)) &&
                  (!(needs & kNeedModule) || ResolveModule(h, a, &missing)) &&
                  (!(needs & kNeedCheckpoint) || ResolveCheckpoint(h, a, &missing));
  if (!ok) {
    return "the CUDA driver " + out->path + " lacks " + missing +
           ((needs & kNeedCheckpoint) && missing.rfind("cuCheckpoint", 0) == 0
                ? " (the checkpoint API needs driver 570 / CUDA 12.8 or newer)"
                : "");
  }
  if (needs & kNeedMemory) {
    std::string optional;
    (void)Resolve(h, a.cuCtxGetCurrent, {"cuCtxGetCurrent"}, &optional);
  }
  int v = 0;
  const CUresult r = a.cuDriverGetVersion(&v);
  if (r != CUDA_SUCCESS) {
    return "cuDriverGetVersion failed on " + out->path + ": " + ResultText(a, r) +
           (r == CUDA_ERROR_STUB_LIBRARY ? " (this is the stub library of the CUDA toolkit, not a driver)" : "");
  }
  out->version = v;
  if ((needs & kNeedCheckpoint) && v < kCheckpointApiVersion) {
    return "the CUDA driver " + out->path + " is version " + VersionText(v) +
           "; the checkpoint API needs " + VersionText(kCheckpointApiVersion) + " (driver 570) or newer";
  }
  return {};
}

std::string ResultText(const DriverApi& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName == nullptr || api.cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) {
    return "CUresult " + std::to_string(r);
  }
  std::string s = name;
  if (api.cuGetErrorString != nullptr && api.cuGetErrorString(r, &text) == CUDA_SUCCESS && text != nullptr) {
    s += " (";
    s += text;
    s += ")";
  }
  return s;
}

}  // namespace gpumigrate::cuda
