#include "shim/cuda_regions.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "engine/devices/cuda/driver_loader.h"
#include "engine/devices/cuda/page_hash.h"
#include "engine/devices/cuda/hash_ptx.h"

namespace gpumigrate::shimcuda {
namespace {

namespace w = shimwire;
using namespace gpumigrate::cuda;  // NOLINT: the driver's names

constexpr uint64_t kDefaultSlotBytes = 4u << 20;
constexpr uint32_t kDefaultSlots = 8;
constexpr uint64_t kHostHashBytes = 4u << 20;

struct State {
  std::mutex mu;  // Register (application threads) against each other
  bool loaded = false;
  LoadedDriver drv;
  bool module_api = false;
  std::string module_api_why;
  CUcontext ctx = nullptr;
  bool primary = false;  // ctx is device 0's primary context, retained here
  CUdevice dev = 0;
  // Server thread only.
  bool set_up = false;
  int staging_fd = -1;
  std::byte* staging = nullptr;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  bool pinned = false;
  std::byte* host = nullptr;  // staging for host hashing and unaligned zeroing
  uint64_t host_bytes = 0;
  bool host_pinned = false;
  bool module_tried = false;
  CUmodule module = nullptr;
  CUfunction fn = nullptr;
  std::string kernel_note;  // why there is no kernel, or which one runs
  CUdeviceptr digests = 0;
  w::CudaHashMode mode = w::CudaHashMode::kAuto;
};

State& S() {
  static State* s = new State;  // never destroyed: the server thread may outlive static destructors
  return *s;
}

const DriverApi& Api() { return S().drv.api; }
std::string Text(CUresult r) { return ResultText(Api(), r); }

int ReplyError(int sock, w::Msg type, int err, const std::string& text) {
  return w::SendMsg(sock, type, static_cast<uint32_t>(err),
                    std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

std::string LoadAndPickContext(State& s) {
  std::string e = LoadDriver(kNeedCore | kNeedMemory | kNeedModule, &s.drv);
  s.module_api = e.empty();
  if (!e.empty()) {
    s.module_api_why = e;
    e = LoadDriver(kNeedCore | kNeedMemory, &s.drv);
    if (!e.empty()) return e;
  }
  const DriverApi& a = s.drv.api;
  if (CUresult r = a.cuInit(0); r != CUDA_SUCCESS) return "cuInit failed: " + Text(r);
  CUcontext cur = nullptr;
  if (a.cuCtxGetCurrent != nullptr && a.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr) {
    s.ctx = cur;
    return {};
  }
  if (CUresult r = a.cuDeviceGet(&s.dev, 0); r != CUDA_SUCCESS) return "cuDeviceGet(0) failed: " + Text(r);
  if (CUresult r = a.cuDevicePrimaryCtxRetain(&s.ctx, s.dev); r != CUDA_SUCCESS) {
    return "no context is current and retaining device 0's primary context failed: " + Text(r);
  }
  s.primary = true;
  return {};
}

// Maps `bytes` of memfd-backed (staging) or anonymous memory and pins it.
std::byte* MapPinned(uint64_t bytes, int* fd, bool* pinned) {
  void* p = MAP_FAILED;
  if (fd != nullptr) {
    *fd = memfd_create("gpumigrate-cuda-staging", MFD_CLOEXEC);
    if (*fd < 0 || ftruncate(*fd, static_cast<off_t>(bytes)) != 0) return nullptr;
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, *fd, 0);
  } else {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  }
  if (p == MAP_FAILED) return nullptr;
  *pinned = Api().cuMemHostRegister(p, bytes, CU_MEMHOSTREGISTER_PORTABLE) == CUDA_SUCCESS;
  return static_cast<std::byte*>(p);
}

uint64_t StagingSlotBytes() {
  const char* env = std::getenv("GPUMIGRATE_CUDA_SLOT_BYTES");  // perf and tests: another slot size
  if (env == nullptr || *env == '\0') return kDefaultSlotBytes;
  const unsigned long long v = std::strtoull(env, nullptr, 10);
  return v >= 4096 && v <= (1ull << 30) ? v / 4096 * 4096 : kDefaultSlotBytes;
}

// Maps whichever of the staging and the host-hash buffer is missing.
std::string SetUp(State& s) {
  if (s.set_up) return {};
  if (s.staging == nullptr) {
    if (s.staging_fd >= 0) close(s.staging_fd);
    s.slot_bytes = StagingSlotBytes();
    s.slots = kDefaultSlots;
    s.staging = MapPinned(s.slot_bytes * s.slots, &s.staging_fd, &s.pinned);
    if (s.staging == nullptr) return std::string("cannot map the staging memfd: ") + std::strerror(errno);
  }
  if (s.host == nullptr) {
    s.host_bytes = kHostHashBytes;
    s.host = MapPinned(s.host_bytes, nullptr, &s.host_pinned);
    if (s.host == nullptr) return std::string("cannot map the host-hash buffer: ") + std::strerror(errno);
  }
  s.set_up = true;
  return {};
}

void LoadKernel(State& s) {
  if (s.module_tried) return;
  s.module_tried = true;
  if (!s.module_api) {
    s.kernel_note = "host hashing: " + s.module_api_why;
    return;
  }
  if (kGmHashPtxBytes == 0) {
    s.kernel_note = "host hashing: this shim was built without nvcc (no gm_hash_pages PTX embedded)";
    return;
  }
  if (CUresult r = Api().cuModuleLoadData(&s.module, kGmHashPtx); r != CUDA_SUCCESS) {
    s.module = nullptr;
    s.kernel_note = "host hashing: cuModuleLoadData of the gm_hash_pages PTX failed: " + Text(r);
    return;
  }
  if (CUresult r = Api().cuModuleGetFunction(&s.fn, s.module, "gm_hash_pages"); r != CUDA_SUCCESS) {
    s.fn = nullptr;
    s.kernel_note = "host hashing: cuModuleGetFunction(gm_hash_pages) failed: " + Text(r);
    return;
  }
  s.kernel_note = "gpu hashing: the gm_hash_pages kernel (PTX " GM_HASH_PTX_ARCH ", JIT-compiled by the driver " +
                  VersionText(s.drv.version) + ")";
}

int Info(int sock, std::span<const std::byte> payload) {
  State& s = S();
  w::CudaInfoReq req;
  if (payload.size() != sizeof(req)) return ReplyError(sock, w::Msg::kCudaInfo, EPROTO, "malformed CUDA info request");
  std::memcpy(&req, payload.data(), sizeof(req));
  if (std::string e = SetUp(s); !e.empty()) return ReplyError(sock, w::Msg::kCudaInfo, ENOMEM, e);
  LoadKernel(s);
  s.mode = static_cast<w::CudaHashMode>(req.hash_mode);
  w::CudaInfoReply rep;
  rep.slot_bytes = s.slot_bytes;
  rep.slots = s.slots;
  rep.staging_bytes = s.slot_bytes * s.slots;
  rep.pinned = s.pinned ? 1 : 0;
  rep.driver_version = s.drv.version;
  std::string note = s.kernel_note;
  if (s.mode == w::CudaHashMode::kHost) {
    note = "host hashing: forced (hash=host)";
  } else if (s.fn != nullptr) {
    rep.gpu_hash = 1;
  } else if (s.mode == w::CudaHashMode::kGpu) {
    return ReplyError(sock, w::Msg::kCudaInfo, ENOTSUP, "hash=gpu is not possible: " + note);
  }
  if (!s.pinned) note += "; staging memory is not pinned (cuMemHostRegister failed)";
  std::snprintf(rep.note, sizeof(rep.note), "%s", note.c_str());
  const int fds[] = {s.staging_fd};
  return w::SendMsg(sock, w::Msg::kCudaInfo, 0, std::as_bytes(std::span(&rep, 1)), fds);
}

// Empty when `x` names a CUDA region range the shim may touch.
std::string CheckXfer(const w::CudaXfer& x, std::span<const RegionRef> regions, bool slot) {
  const State& s = S();
  if (x.region >= regions.size() || regions[x.region].dptr == 0) {
    return "region " + std::to_string(x.region) + " is not a CUDA region";
  }
  const uint64_t size = regions[x.region].size;
  if (x.offset > size || x.len > size - x.offset) {
    return "range [" + std::to_string(x.offset) + ", +" + std::to_string(x.len) + ") lies outside region " +
           std::to_string(x.region) + " (" + std::to_string(size) + " bytes)";
  }
  if (slot && (!s.set_up || x.slot >= s.slots || x.len > s.slot_bytes)) {
    return "slot " + std::to_string(x.slot) + " / " + std::to_string(x.len) + " bytes does not fit the staging (" +
           std::to_string(s.slots) + " slots of " + std::to_string(s.slot_bytes) + " bytes; CudaInfo first)";
  }
  return {};
}

std::string Zero(CUdeviceptr at, uint64_t len) {
  State& s = S();
  if (at % 4 == 0 && len % 4 == 0) {
    CUresult r = Api().cuMemsetD32(at, 0, len / 4);
    return r == CUDA_SUCCESS ? std::string() : "cuMemsetD32: " + Text(r);
  }
  std::memset(s.host, 0, s.host_bytes);
  for (uint64_t done = 0; done < len;) {
    const uint64_t n = std::min(s.host_bytes, len - done);
    if (CUresult r = Api().cuMemcpyHtoD(at + done, s.host, n); r != CUDA_SUCCESS) return "cuMemcpyHtoD: " + Text(r);
    done += n;
  }
  return {};
}

int Xfer(int sock, w::Msg type, bool destination, std::span<const std::byte> payload,
         std::span<const RegionRef> regions) {
  State& s = S();
  w::CudaXfer x;
  if (payload.size() != sizeof(x)) return ReplyError(sock, type, EPROTO, "malformed CUDA transfer request");
  std::memcpy(&x, payload.data(), sizeof(x));
  if (type != w::Msg::kCudaRead && !destination) {
    return ReplyError(sock, type, EINVAL, "CUDA writes need a destination that has not adopted yet");
  }
  if (std::string e = CheckXfer(x, regions, type != w::Msg::kCudaZero); !e.empty()) {
    return ReplyError(sock, type, EINVAL, e);
  }
  const CUdeviceptr at = regions[x.region].dptr + x.offset;
  std::byte* slot = s.staging + x.slot * s.slot_bytes;
  std::string e;
  if (type == w::Msg::kCudaRead) {
    if (CUresult r = Api().cuMemcpyDtoH(slot, at, x.len); r != CUDA_SUCCESS) e = "cuMemcpyDtoH: " + Text(r);
  } else if (type == w::Msg::kCudaWrite) {
    if (CUresult r = Api().cuMemcpyHtoD(at, slot, x.len); r != CUDA_SUCCESS) e = "cuMemcpyHtoD: " + Text(r);
  } else {
    e = Zero(at, x.len);
  }
  if (!e.empty()) return ReplyError(sock, type, EIO, e + " (region " + std::to_string(x.region) + ")");
  return w::SendMsg(sock, type, 0, {});
}

std::string HashOnGpu(CUdeviceptr base, uint64_t page_bytes, uint64_t pages, uint64_t tail, uint64_t* out) {
  State& s = S();
  if (s.digests == 0) {
    if (CUresult r = Api().cuMemAlloc(&s.digests, w::kMaxHashPages * sizeof(uint64_t)); r != CUDA_SUCCESS) {
      s.digests = 0;
      return "cuMemAlloc of the digest buffer: " + Text(r);
    }
  }
  auto launch = [&](CUdeviceptr b, unsigned long long pb, unsigned long long n, CUdeviceptr d) -> std::string {
    void* params[] = {&b, &pb, &n, &d};
    CUresult r = Api().cuLaunchKernel(s.fn, static_cast<unsigned>(n), 1, 1, kHashLanes, 1, 1, 0, nullptr, params,
                                      nullptr);
    return r == CUDA_SUCCESS ? std::string() : "cuLaunchKernel(gm_hash_pages): " + Text(r);
  };
  const uint64_t full = tail != 0 ? pages - 1 : pages;
  if (full > 0) {
    if (std::string e = launch(base, page_bytes, full, s.digests); !e.empty()) return e;
  }
  if (tail != 0) {
    if (std::string e = launch(base + full * page_bytes, tail, 1, s.digests + full * sizeof(uint64_t)); !e.empty()) {
      return e;
    }
  }
  if (CUresult r = Api().cuMemcpyDtoH(out, s.digests, pages * sizeof(uint64_t)); r != CUDA_SUCCESS) {
    return "cuMemcpyDtoH of the digests (after gm_hash_pages): " + Text(r);
  }
  return {};
}

std::string HashOnHost(CUdeviceptr base, uint64_t page_bytes, uint64_t pages, uint64_t tail, uint64_t* out) {
  State& s = S();
  if (page_bytes > s.host_bytes) {  // pages larger than the buffer: grow it to one page
    if (s.host_pinned) (void)Api().cuMemHostUnregister(s.host);
    munmap(s.host, s.host_bytes);
    s.host_bytes = page_bytes;
    s.host = MapPinned(s.host_bytes, nullptr, &s.host_pinned);
    if (s.host == nullptr) {
      s.set_up = false;  // SetUp maps a default one again at the next CudaInfo
      return "cannot map " + std::to_string(page_bytes) + " bytes for host hashing: " + std::strerror(errno);
    }
  }
  const uint64_t per = s.host_bytes / page_bytes;
  for (uint64_t p = 0; p < pages; p += per) {
    const uint64_t n = std::min(per, pages - p);
    const bool has_tail = tail != 0 && p + n == pages;
    const uint64_t bytes = (has_tail ? n - 1 : n) * page_bytes + (has_tail ? tail : 0);
    if (CUresult r = Api().cuMemcpyDtoH(s.host, base + p * page_bytes, bytes); r != CUDA_SUCCESS) {
      return "cuMemcpyDtoH (staging pages for host hashing): " + Text(r);
    }
    for (uint64_t k = 0; k < n; ++k) {
      const bool last = has_tail && k == n - 1;
      out[p + k] = HashPage(s.host + k * page_bytes, last ? tail : page_bytes);
    }
  }
  return {};
}

int Hash(int sock, std::span<const std::byte> payload, std::span<const RegionRef> regions) {
  State& s = S();
  constexpr w::Msg kType = w::Msg::kCudaHash;
  w::CudaHashReq q;
  if (payload.size() != sizeof(q)) return ReplyError(sock, kType, EPROTO, "malformed CUDA hash request");
  std::memcpy(&q, payload.data(), sizeof(q));
  if (q.region >= regions.size() || regions[q.region].dptr == 0) {
    return ReplyError(sock, kType, EINVAL, "region " + std::to_string(q.region) + " is not a CUDA region");
  }
  const RegionRef& r = regions[q.region];
  if (q.page_bytes == 0 || q.page_bytes % kHashMinPage != 0 || q.page_bytes > (1ull << 30) || q.pages == 0 ||
      q.pages > w::kMaxHashPages || q.first_page >= r.size / q.page_bytes + 1 ||
      (q.first_page + q.pages - 1) * q.page_bytes >= r.size) {
    return ReplyError(sock, kType, EINVAL,
                      "hash request out of range: pages " + std::to_string(q.first_page) + "+" +
                          std::to_string(q.pages) + " of " + std::to_string(q.page_bytes) + " bytes in region " +
                          std::to_string(q.region) + " (" + std::to_string(r.size) + " bytes)");
  }
  const uint64_t end = (q.first_page + q.pages) * q.page_bytes;
  const uint64_t tail = end > r.size ? q.page_bytes - (end - r.size) : 0;
  const CUdeviceptr base = r.dptr + q.first_page * q.page_bytes;
  std::vector<uint64_t> digests(q.pages);
  const bool gpu = s.fn != nullptr && s.mode != w::CudaHashMode::kHost;
  std::string e = gpu ? HashOnGpu(base, q.page_bytes, q.pages, tail, digests.data())
                      : HashOnHost(base, q.page_bytes, q.pages, tail, digests.data());
  if (!e.empty()) return ReplyError(sock, kType, EIO, e + " (region " + std::to_string(q.region) + ")");
  return w::SendMsg(sock, kType, 0, std::as_bytes(std::span(digests)));
}

}  // namespace

int Register(uint64_t dptr, uint64_t size, std::string* why) {
  State& s = S();
  std::lock_guard lk(s.mu);
  if (!s.loaded) {
    if (std::string e = LoadAndPickContext(s); !e.empty()) {
      *why = e;
      return -ENODEV;
    }
    s.loaded = true;
  }
  // Touch both ends through the driver: a pointer the context does not own fails here, not mid-migration.
  if (CUresult r = Api().cuCtxSetCurrent(s.ctx); r != CUDA_SUCCESS) {
    *why = "cuCtxSetCurrent: " + Text(r);
    return -EIO;
  }
  uint64_t probe = 0;
  for (CUdeviceptr at : {dptr, dptr + size - sizeof(probe)}) {
    if (CUresult r = Api().cuMemcpyDtoH(&probe, at, sizeof(probe)); r != CUDA_SUCCESS) {
      *why = "device memory [" + std::to_string(dptr) + ", +" + std::to_string(size) +
             ") is not readable in the context: cuMemcpyDtoH: " + Text(r);
      return -EFAULT;
    }
  }
  return 0;
}

bool Active() {
  State& s = S();
  std::lock_guard lk(s.mu);
  return s.loaded;
}

int Handle(int sock, w::Msg type, bool destination, std::span<const std::byte> payload,
           std::span<const RegionRef> regions) {
  State& s = S();
  if (!Active()) return ReplyError(sock, type, ENODEV, "no CUDA region is registered in this process");
  if (CUresult r = Api().cuCtxSetCurrent(s.ctx); r != CUDA_SUCCESS) {
    return ReplyError(sock, type, EIO, "cuCtxSetCurrent (the application's context): " + Text(r));
  }
  if (type == w::Msg::kCudaInfo) return Info(sock, payload);
  if (!s.set_up) return ReplyError(sock, type, EPROTO, "CudaInfo first");
  if (type == w::Msg::kCudaHash) return Hash(sock, payload, regions);
  return Xfer(sock, type, destination, payload, regions);
}

std::string Synchronize() {
  if (!Active()) return {};
  State& s = S();
  if (CUresult r = Api().cuCtxSetCurrent(s.ctx); r != CUDA_SUCCESS) return "cuCtxSetCurrent: " + Text(r);
  if (CUresult r = Api().cuCtxSynchronize(); r != CUDA_SUCCESS) return "cuCtxSynchronize: " + Text(r);
  return {};
}

void ZeroAll(std::span<const RegionRef> regions) {
  if (!Active()) return;
  State& s = S();
  if (Api().cuCtxSetCurrent(s.ctx) != CUDA_SUCCESS) return;
  if (!s.set_up && !SetUp(s).empty()) return;
  for (const RegionRef& r : regions) {
    if (r.dptr != 0) (void)Zero(r.dptr, r.size);
  }
  (void)Api().cuCtxSynchronize();
}

void Release() {
  if (!Active()) return;
  State& s = S();
  (void)Api().cuCtxSetCurrent(s.ctx);
  auto unmap = [&](std::byte*& p, uint64_t bytes, bool& pinned) {
    if (p == nullptr) return;
    if (pinned) (void)Api().cuMemHostUnregister(p);
    munmap(p, bytes);
    p = nullptr;
    pinned = false;
  };
  unmap(s.staging, s.slot_bytes * s.slots, s.pinned);
  unmap(s.host, s.host_bytes, s.host_pinned);
  if (s.staging_fd >= 0) close(s.staging_fd);
  s.staging_fd = -1;
  if (s.module != nullptr) (void)Api().cuModuleUnload(s.module);
  s.module = nullptr;
  s.fn = nullptr;
  s.module_tried = false;
  if (s.digests != 0) (void)Api().cuMemFree(s.digests);
  s.digests = 0;
  s.set_up = false;
}

void Reset() {
  State& s = S();
  std::lock_guard lk(s.mu);
  if (s.loaded && s.primary) (void)s.drv.api.cuDevicePrimaryCtxRelease(s.dev);
  s.loaded = s.primary = false;
  s.ctx = nullptr;
  s.mode = w::CudaHashMode::kAuto;
}

}  // namespace gpumigrate::shimcuda
