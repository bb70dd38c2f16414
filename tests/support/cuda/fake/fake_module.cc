// Modules and launches: the fake knows one kernel, gm_hash_pages (the page
// digest of engine/devices/cuda/page_hash.h), loaded from PTX text that defines
// it, and runs it on the CPU when launched.
#include <cstring>
#include <mutex>
#include <set>

#include "engine/devices/cuda/page_hash.h"
#include "tests/support/cuda/fake/fake_libcuda.h"

namespace gpumigrate::cuda::fake {
namespace {

constexpr const char* kHashKernel = "gm_hash_pages";

struct Module {
  int function = 0;  // the address of this member is the kernel's CUfunction
};

std::mutex g_mod_mu;
std::set<Module*>& Modules() {
  static auto* modules = new std::set<Module*>;  // never destroyed: see fake_gate.cc
  return *modules;
}

bool DefinesHashKernel(const char* ptx) {
  // PTX is text; a kernel is defined by ".entry NAME(" (possibly with spaces).
  if (std::strstr(ptx, ".version") == nullptr) return false;
  for (const char* p = std::strstr(ptx, ".entry"); p != nullptr; p = std::strstr(p + 1, ".entry")) {
    const char* q = p + std::strlen(".entry");
    while (*q == ' ' || *q == '\t') ++q;
    const size_t n = std::strlen(kHashKernel);
    if (std::strncmp(q, kHashKernel, n) == 0 && (q[n] == '(' || q[n] == ' ' || q[n] == '\n' || q[n] == '\t')) {
      return true;
    }
  }
  return false;
}

// gm_hash_pages(base, page_bytes, pages, digests), grid (pages,1,1), block (256,1,1).
CUresult RunHashKernel(unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x, unsigned block_y,
                       unsigned block_z, void** params) {
  if (params == nullptr || params[0] == nullptr || params[1] == nullptr || params[2] == nullptr ||
      params[3] == nullptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const uint64_t base = *static_cast<const uint64_t*>(params[0]);
  const uint64_t page_bytes = *static_cast<const uint64_t*>(params[1]);
  const uint64_t pages = *static_cast<const uint64_t*>(params[2]);
  const uint64_t digests = *static_cast<const uint64_t*>(params[3]);
  if (grid_x == 0 || grid_x != pages || grid_y != 1 || grid_z != 1 || block_x != kHashLanes || block_y != 1 ||
      block_z != 1) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (page_bytes == 0 || page_bytes % kHashMinPage != 0 || page_bytes > UINT64_MAX / pages) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!InAllocation(base, pages * page_bytes) || !InAllocation(digests, pages * sizeof(uint64_t))) {
    return CUDA_ERROR_ILLEGAL_ADDRESS;
  }
  HashPages(reinterpret_cast<const std::byte*>(base), page_bytes, pages, reinterpret_cast<uint64_t*>(digests));
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace gpumigrate::cuda::fake

using namespace gpumigrate::cuda;        // NOLINT: the exported C API below
using namespace gpumigrate::cuda::fake;  // NOLINT

GM_FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  CallGuard g("cuModuleLoadData");
  if (g.result() != CUDA_SUCCESS) return g.result();
  int dev = 0;
  if (CUresult r = CurrentDevice(&dev)) return r;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!DefinesHashKernel(static_cast<const char*>(image))) return CUDA_ERROR_INVALID_IMAGE;
  auto* m = new Module;
  std::lock_guard lock(g_mod_mu);
  Modules().insert(m);
  *module = reinterpret_cast<CUmodule>(m);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuModuleUnload(CUmodule module) {
  CallGuard g("cuModuleUnload");
  if (g.result() != CUDA_SUCCESS) return g.result();
  auto* m = reinterpret_cast<Module*>(module);
  std::lock_guard lock(g_mod_mu);
  if (Modules().erase(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
  delete m;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* fn, CUmodule module, const char* name) {
  CallGuard g("cuModuleGetFunction");
  if (g.result() != CUDA_SUCCESS) return g.result();
  if (fn == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto* m = reinterpret_cast<Module*>(module);
  std::lock_guard lock(g_mod_mu);
  if (Modules().count(m) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (std::strcmp(name, kHashKernel) != 0) return CUDA_ERROR_NOT_FOUND;
  *fn = reinterpret_cast<CUfunction>(&m->function);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                                       unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                                       CUstream stream, void** params, void** extra) {
  CallGuard g("cuLaunchKernel");
  if (g.result() != CUDA_SUCCESS) return g.result();
  int dev = 0;
  if (CUresult r = CurrentDevice(&dev)) return r;
  (void)shared_bytes;
  if (extra != nullptr) return CUDA_ERROR_INVALID_VALUE;  // the fake takes kernelParams only
  if (reinterpret_cast<uintptr_t>(stream) > 2) return CUDA_ERROR_INVALID_HANDLE;
  {
    std::lock_guard lock(g_mod_mu);
    bool known = false;
    for (Module* m : Modules()) known = known || reinterpret_cast<CUfunction>(&m->function) == f;
    if (!known) return CUDA_ERROR_INVALID_HANDLE;
  }
  return RunHashKernel(grid_x, grid_y, grid_z, block_x, block_y, block_z, params);
}
