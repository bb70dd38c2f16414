// The fake device's memory: one anonymous mapping per allocation, whose address
// is the device pointer; per-device accounting against
// $GPUMIGRATE_FAKE_CUDA_MEMORY; bounds-checked copies; host registration; and
// the release and return of every allocation for the checkpoint service.
#include <sys/mman.h>

#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "tests/support/cuda/fake/fake_libcuda.h"

namespace gpumigrate::cuda::fake {
namespace {

constexpr uint64_t kGranule = 4096;  // accounting and mapping granule

struct Allocation {
  uint64_t bytes = 0;     // as asked
  uint64_t mapped = 0;    // rounded up to kGranule
  int device = 0;
  std::unique_ptr<std::byte[]> saved;  // while checkpointed: the contents
  bool released = false;               // checkpointed and not yet restored
};

struct Memory {
  std::mutex mu;
  std::map<uint64_t, Allocation> allocations;   // by base address
  std::map<uint64_t, uint64_t> registered;      // host registrations: base -> bytes
  std::vector<uint64_t> used;                   // per device, bytes mapped
};

Memory& TheMemory() {
  static Memory* m = [] {
    auto* mem = new Memory;  // never destroyed: detached threads may use it at exit
    mem->used.assign(static_cast<size_t>(std::max(GetConfig().devices, 1)), 0);
    return mem;
  }();
  return *m;
}

// The allocation holding [p, p + bytes), or nullptr. Caller holds mu.
Allocation* Find(Memory& m, uint64_t p, uint64_t bytes) {
  auto it = m.allocations.upper_bound(p);
  if (it == m.allocations.begin()) return nullptr;
  --it;
  const uint64_t base = it->first;
  if (p < base || bytes > it->second.bytes || p - base > it->second.bytes - bytes) return nullptr;
  return &it->second;
}

void PublishUsed(const Memory& m) {
  uint64_t total = 0;
  for (uint64_t u : m.used) total += u;
  PublishDeviceUsed(total);
}

}  // namespace

bool InAllocation(uint64_t p, uint64_t bytes) {
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  return Find(m, p, bytes) != nullptr;
}

uint64_t DeviceUsedBytes(int device) {
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  return device >= 0 && static_cast<size_t>(device) < m.used.size() ? m.used[static_cast<size_t>(device)] : 0;
}

CUresult ReleaseAllDeviceMemory() {
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  for (auto& [base, a] : m.allocations) {
    a.saved.reset(new (std::nothrow) std::byte[a.bytes]);
    if (a.saved == nullptr) {  // release nothing: the process stays as it was
      for (auto& entry : m.allocations) entry.second.saved.reset();
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    std::memcpy(a.saved.get(), reinterpret_cast<const void*>(base), a.bytes);
  }
  for (auto& [base, a] : m.allocations) {
    // The pages are really gone: discarded, and any access faults.
    madvise(reinterpret_cast<void*>(base), a.mapped, MADV_DONTNEED);
    mprotect(reinterpret_cast<void*>(base), a.mapped, PROT_NONE);
    m.used[static_cast<size_t>(a.device)] -= a.mapped;
    a.released = true;
  }
  PublishUsed(m);
  return CUDA_SUCCESS;
}

CUresult RestoreAllDeviceMemory() {
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  // A restore that failed part way is retried: the allocations it brought back
  // are skipped, so none is counted twice.
  for (auto& [base, a] : m.allocations) {
    if (!a.released) continue;
    if (mprotect(reinterpret_cast<void*>(base), a.mapped, PROT_READ | PROT_WRITE) != 0) {
      PublishUsed(m);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (a.saved != nullptr) std::memcpy(reinterpret_cast<void*>(base), a.saved.get(), a.bytes);
    a.saved.reset();
    a.released = false;
    m.used[static_cast<size_t>(a.device)] += a.mapped;
  }
  PublishUsed(m);
  return CUDA_SUCCESS;
}

}  // namespace gpumigrate::cuda::fake

using namespace gpumigrate::cuda;        // NOLINT: the exported C API below
using namespace gpumigrate::cuda::fake;  // NOLINT

#define GM_GATE(name, dev)                            \
  CallGuard guard(name);                              \
  if (guard.result() != CUDA_SUCCESS) return guard.result(); \
  int dev = 0;                                        \
  if (CUresult r_ = CurrentDevice(&dev)) return r_

GM_FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  GM_GATE("cuMemAlloc_v2", dev);
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t mapped = (bytes + kGranule - 1) / kGranule * kGranule;
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  uint64_t& used = m.used[static_cast<size_t>(dev)];
  if (mapped > GetConfig().memory_bytes - used) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto base = reinterpret_cast<uint64_t>(p);
  Allocation& a = m.allocations[base];
  a.bytes = bytes;
  a.mapped = mapped;
  a.device = dev;
  used += mapped;
  PublishUsed(m);
  *dptr = base;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  GM_GATE("cuMemFree_v2", dev);
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  auto it = m.allocations.find(dptr);
  if (it == m.allocations.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(reinterpret_cast<void*>(dptr), it->second.mapped);
  m.used[static_cast<size_t>(it->second.device)] -= it->second.mapped;
  m.allocations.erase(it);
  PublishUsed(m);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  GM_GATE("cuMemGetInfo_v2", dev);
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *total_bytes = GetConfig().memory_bytes;
  *free_bytes = GetConfig().memory_bytes - DeviceUsedBytes(dev);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  GM_GATE("cuMemcpyDtoH_v2", dev);
  if (dst == nullptr && bytes > 0) return CUDA_ERROR_INVALID_VALUE;
  if (!InAllocation(src, bytes)) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  GM_GATE("cuMemcpyHtoD_v2", dev);
  if (src == nullptr && bytes > 0) return CUDA_ERROR_INVALID_VALUE;
  if (!InAllocation(dst, bytes)) return CUDA_ERROR_INVALID_VALUE;
  std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t count) {
  GM_GATE("cuMemsetD32_v2", dev);
  if (dst % 4 != 0 || count > SIZE_MAX / 4) return CUDA_ERROR_INVALID_VALUE;
  if (!InAllocation(dst, count * 4)) return CUDA_ERROR_INVALID_VALUE;
  auto* p = reinterpret_cast<uint32_t*>(dst);
  for (size_t i = 0; i < count; ++i) p[i] = value;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuMemHostRegister_v2(void* p, size_t bytes, unsigned int flags) {
  GM_GATE("cuMemHostRegister_v2", dev);
  (void)flags;
  if (p == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const auto base = reinterpret_cast<uint64_t>(p);
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  auto next = m.registered.lower_bound(base);
  if (next != m.registered.end() && next->first < base + bytes) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  if (next != m.registered.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > base) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  m.registered[base] = bytes;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuMemHostUnregister(void* p) {
  GM_GATE("cuMemHostUnregister", dev);
  Memory& m = TheMemory();
  std::lock_guard lock(m.mu);
  if (m.registered.erase(reinterpret_cast<uint64_t>(p)) == 0) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  return CUDA_SUCCESS;
}

GM_FAKE_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  GM_GATE("cuStreamSynchronize", dev);
  const auto s = reinterpret_cast<uintptr_t>(stream);
  return s <= 2 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
