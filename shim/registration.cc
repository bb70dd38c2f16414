// libgpumigrate_shim: what the application calls before gm_shim_start to say
// what moves and how (gpumigrate/shim.h): regions of host memory (gm_shim_alloc,
// gm_shim_register), CUDA device memory (gm_shim_register_cuda), how a device
// reaches the regions it writes by DMA (gm_shim_dma_iommufd, gm_shim_dma_logging)
// and how to save the application's other state (gm_shim_set_state).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "engine/devices/cuda/page_hash.h"
#include "shim/cuda_regions.h"
#include "shim/dma_regions.h"
#include "shim/shim_state.h"

using namespace gpumigrate::shimcore;
namespace w = gpumigrate::shimwire;

static_assert(w::kRegionDmaWritten == GM_SHIM_DMA_WRITTEN);

GM_EXPORT void* gm_shim_alloc(const char* name, size_t size, uint32_t hint, uint32_t flags) {
  if (name == nullptr || *name == '\0' || size == 0) {
    Fail(EINVAL, "gm_shim_alloc needs a name and a size");
    return nullptr;
  }
  size_t ps = PageSize();
  size = (size + ps - 1) / ps * ps;
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) {
    Fail(errno, "memfd_create: %s", std::strerror(errno));
    return nullptr;
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Fail(errno, "ftruncate memfd to %zu bytes: %s", size, std::strerror(errno));
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    Fail(errno, "mmap memfd: %s", std::strerror(errno));
    close(fd);
    return nullptr;
  }
  if (flags & GM_SHIM_HUGEPAGE) (void)madvise(p, size, MADV_HUGEPAGE);
  Region r{name, static_cast<std::byte*>(p), size, hint, flags, fd, false};
  if (AddRegion(r) != 0) {
    munmap(p, size);
    close(fd);
    return nullptr;
  }
  return p;
}

GM_EXPORT int gm_shim_register(const char* name, void* addr, size_t size, uint32_t hint, uint32_t flags) {
  size_t ps = PageSize();
  if (name == nullptr || *name == '\0' || addr == nullptr || size == 0) {
    return Fail(EINVAL, "gm_shim_register needs a name, an address and a size");
  }
  if (reinterpret_cast<uintptr_t>(addr) % ps != 0 || size % ps != 0) {
    return Fail(EINVAL, "region '%s' must be page aligned (address and size multiples of %zu)", name, ps);
  }
  if (flags & GM_SHIM_HUGEPAGE) (void)madvise(addr, size, MADV_HUGEPAGE);
  return AddRegion(Region{name, static_cast<std::byte*>(addr), size, hint, flags, -1, false});
}

GM_EXPORT int gm_shim_register_cuda(const char* name, unsigned long long dptr, size_t size, uint32_t hint,
                                    uint32_t flags) {
  constexpr size_t kGrain = gpumigrate::cuda::kHashMinPage;
  if (name == nullptr || *name == '\0' || dptr == 0 || size == 0) {
    return Fail(EINVAL, "gm_shim_register_cuda needs a name, a device pointer and a size");
  }
  if (dptr % 256 != 0 || size % kGrain != 0) {
    return Fail(EINVAL, "CUDA region '%s': the pointer must be 256-byte aligned and the size a multiple of %zu", name,
                kGrain);
  }
  std::string why;
  if (int e = gpumigrate::shimcuda::Register(dptr, size, &why); e != 0) {
    return Fail(-e, "CUDA region '%s': %s", name, why.c_str());
  }
  Region r{name, nullptr, size, hint, flags, -1, false, dptr};
  return AddRegion(std::move(r));
}

namespace {
int DeclareDma(const char* name, const gpumigrate::shimdma::Declared& d) {
  Shim& sh = S();
  {
    std::lock_guard lk(sh.mu);
    if (sh.serving) return Fail(EBUSY, "DMA declarations must come before gm_shim_start");
    auto r = std::find_if(sh.regions.begin(), sh.regions.end(), [&](const Region& x) { return x.name == name; });
    if (r == sh.regions.end()) return Fail(ENOENT, "no region named '%s'", name);
    if (!(r->flags & GM_SHIM_DMA_WRITTEN) || r->dptr != 0) {
      return Fail(EINVAL, "region '%s' is not a host region flagged GM_SHIM_DMA_WRITTEN", name);
    }
  }
  std::string why;
  if (int e = gpumigrate::shimdma::Declare(name, d, &why); e != 0) return Fail(-e, "%s", why.c_str());
  return 0;
}
}  // namespace

GM_EXPORT int gm_shim_dma_iommufd(const char* region, int iommufd, uint32_t dev_id, uint32_t hwpt_id, uint64_t iova) {
  if (region == nullptr) return Fail(EINVAL, "gm_shim_dma_iommufd needs a region name");
  return DeclareDma(region, {w::DmaKind::kIommufd, iommufd, dev_id, hwpt_id, iova});
}

GM_EXPORT int gm_shim_dma_logging(const char* region, int vfio_device_fd, uint64_t iova) {
  if (region == nullptr) return Fail(EINVAL, "gm_shim_dma_logging needs a region name");
  return DeclareDma(region, {w::DmaKind::kDmaLogging, vfio_device_fd, 0, 0, iova});
}

GM_EXPORT int gm_shim_set_state(gm_shim_save_fn save, void* ctx, size_t size_hint) {
  Shim& sh = S();
  std::lock_guard lk(sh.mu);
  sh.save = save;
  sh.save_ctx = ctx;
  sh.state_hint = size_hint;
  return 0;
}
