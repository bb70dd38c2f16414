// The fake driver's configuration, fault injection, initialisation, error
// names, devices and primary contexts.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <vector>

#include "tests/support/cuda/fake/fake_libcuda.h"

namespace gpumigrate::cuda::fake {
namespace {

uint64_t ParseBytes(const char* s, uint64_t fallback) {
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  uint64_t v = std::strtoull(s, &end, 10);
  switch (*end) {
    case 'K': case 'k': v <<= 10; break;
    case 'M': case 'm': v <<= 20; break;
    case 'G': case 'g': v <<= 30; break;
    default: break;
  }
  return v;
}

int ParseInt(const char* s, int fallback) {
  return s != nullptr && *s != '\0' ? std::atoi(s) : fallback;
}

// The value of "name=value" for `call` in a comma-separated list, or nullptr.
const char* ListValue(const char* list, const char* call) {
  if (list == nullptr) return nullptr;
  const size_t n = std::strlen(call);
  for (const char* p = list; *p != '\0';) {
    if (std::strncmp(p, call, n) == 0 && p[n] == '=') return p + n + 1;
    const char* comma = std::strchr(p, ',');
    if (comma == nullptr) break;
    p = comma + 1;
  }
  return nullptr;
}

std::atomic<bool> g_initialized{false};

struct Context {
  int device = 0;
  int refs = 0;  // guarded by g_ctx_mu
};
std::mutex g_ctx_mu;
std::vector<Context>& Contexts() {
  static std::vector<Context> contexts(static_cast<size_t>(std::max(GetConfig().devices, 0)));
  return contexts;
}
thread_local CUcontext t_current = nullptr;

Context* FromHandle(CUcontext c) {
  auto& all = Contexts();
  for (auto& ctx : all) {
    if (reinterpret_cast<CUcontext>(&ctx) == c) return &ctx;
  }
  return nullptr;
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_TIMEOUT, "CUDA_ERROR_TIMEOUT", "timeout occurred"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* FindError(CUresult r) {
  for (const auto& e : kErrors) {
    if (e.code == r) return &e;
  }
  return nullptr;
}

CUresult CheckDevice(CUdevice dev) {
  return dev >= 0 && dev < GetConfig().devices ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

}  // namespace

const Config& GetConfig() {
  static const Config config = [] {
    Config c;
    c.version = ParseInt(std::getenv("GPUMIGRATE_FAKE_CUDA_VERSION"), c.version);
    c.devices = ParseInt(std::getenv("GPUMIGRATE_FAKE_CUDA_DEVICES"), c.devices);
    c.memory_bytes = ParseBytes(std::getenv("GPUMIGRATE_FAKE_CUDA_MEMORY"), c.memory_bytes);
    const char* dir = std::getenv("GPUMIGRATE_FAKE_CUDA_DIR");
    if (dir != nullptr && *dir != '\0') c.dir = dir;
    return c;
  }();
  return config;
}

CUresult InjectedFailure(const char* call) {
  const char* v = ListValue(std::getenv("GPUMIGRATE_FAKE_CUDA_FAIL"), call);
  return v != nullptr ? std::atoi(v) : CUDA_SUCCESS;
}

unsigned SlowMs(const char* call) {
  const char* v = ListValue(std::getenv("GPUMIGRATE_FAKE_CUDA_SLOW"), call);
  return v != nullptr ? static_cast<unsigned>(std::strtoul(v, nullptr, 10)) : 0;
}

bool Initialized() { return g_initialized.load(std::memory_order_acquire); }

CUresult CurrentDevice(int* device) {
  if (t_current == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  std::lock_guard lock(g_ctx_mu);
  Context* c = FromHandle(t_current);
  if (c == nullptr || c->refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *device = c->device;
  return CUDA_SUCCESS;
}

}  // namespace gpumigrate::cuda::fake

using namespace gpumigrate::cuda;        // NOLINT: the exported C API below
using namespace gpumigrate::cuda::fake;  // NOLINT

GM_FAKE_EXPORT CUresult cuInit(unsigned int flags) {
  if (CUresult f = InjectedFailure("cuInit")) return f;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (GetConfig().devices <= 0) return CUDA_ERROR_NO_DEVICE;
  {
    std::lock_guard lock(g_ctx_mu);
    auto& all = Contexts();
    for (size_t i = 0; i < all.size(); ++i) all[i].device = static_cast<int>(i);
  }
  if (!g_initialized.exchange(true)) StartService();
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
  if (CUresult f = InjectedFailure("cuDriverGetVersion")) return f;
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // Read at every call, unlike the rest of the configuration, so that a test can
  // present an older driver without a new process.
  *version = ParseInt(std::getenv("GPUMIGRATE_FAKE_CUDA_VERSION"), GetConfig().version);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = FindError(error);
  *str = e != nullptr ? e->name : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

GM_FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = FindError(error);
  *str = e != nullptr ? e->text : nullptr;
  return e != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

GM_FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  CallGuard g("cuDeviceGetCount");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = GetConfig().devices;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  CallGuard g("cuDeviceGet");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(ordinal)) return r;
  *device = ordinal;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  CallGuard g("cuDeviceGetName");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev)) return r;
  const std::string n = "gpumigrate fake GPU " + std::to_string(dev);
  std::strncpy(name, n.c_str(), static_cast<size_t>(len) - 1);
  name[len - 1] = '\0';
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice dev) {
  CallGuard g("cuDeviceGetUuid_v2");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev)) return r;
  static constexpr char kBase[16] = {'g', 'm', '-', 'f', 'a', 'k', 'e', '-', 'c', 'u', 'd', 'a', 0, 0, 0, 0};
  std::memcpy(uuid->bytes, kBase, sizeof(kBase));
  uuid->bytes[15] = static_cast<char>(dev);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  CallGuard g("cuDeviceTotalMem_v2");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev)) return r;
  *bytes = GetConfig().memory_bytes;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice dev) {
  CallGuard g("cuDevicePrimaryCtxRetain");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckDevice(dev)) return r;
  std::lock_guard lock(g_ctx_mu);
  Context& c = Contexts()[static_cast<size_t>(dev)];
  ++c.refs;
  *ctx = reinterpret_cast<CUcontext>(&c);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  CallGuard g("cuDevicePrimaryCtxRelease_v2");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (CUresult r = CheckDevice(dev)) return r;
  std::lock_guard lock(g_ctx_mu);
  Context& c = Contexts()[static_cast<size_t>(dev)];
  if (c.refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --c.refs;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  CallGuard g("cuCtxSetCurrent");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (ctx != nullptr) {
    std::lock_guard lock(g_ctx_mu);
    if (FromHandle(ctx) == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  }
  t_current = ctx;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  CallGuard g("cuCtxGetCurrent");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ctx = t_current;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuCtxSynchronize() {
  CallGuard g("cuCtxSynchronize");
  if (g.result() != CUDA_SUCCESS) return g.result();
  int dev = 0;
  return CurrentDevice(&dev);
}
