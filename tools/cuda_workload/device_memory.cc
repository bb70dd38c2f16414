#include "tools/cuda_workload/device_memory.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "engine/devices/cuda/page_hash.h"
#include "tools/workload/pattern.h"

namespace gpumigrate::cudaworkload {
namespace {

constexpr uint64_t kChunk = 4u << 20;
constexpr uint64_t kDigestPage = 64u << 10;

uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t WeightWord(uint64_t seed, uint64_t index) { return Mix(seed * 0x9e3779b97f4a7c15ull + index); }

uint32_t MemsetValue(uint64_t seed, uint32_t page, uint32_t version) {
  return static_cast<uint32_t>(Mix(seed ^ (uint64_t{page} << 32) ^ version)) | 1u;  // never 0: not "unwritten"
}

std::string DeviceMemory::Call(const char* what, cuda::CUresult r) const {
  return r == cuda::CUDA_SUCCESS ? std::string() : fmt::format("{}: {}", what, cuda::ResultText(drv_.api, r));
}

std::string DeviceMemory::Open(int ordinal, uint64_t weights_bytes, uint64_t kv_bytes, uint32_t kv_page) {
  if (std::string e = cuda::LoadDriver(cuda::kNeedCore | cuda::kNeedMemory, &drv_); !e.empty()) return e;
  const cuda::DriverApi& a = drv_.api;
  weights_bytes_ = weights_bytes;
  kv_bytes_ = kv_bytes;
  kv_page_ = kv_page;
  cuda::CUdevice dev = 0;
  std::string e = Call("cuInit", a.cuInit(0));
  if (e.empty()) e = Call("cuDeviceGet", a.cuDeviceGet(&dev, ordinal));
  if (e.empty()) e = Call("cuDevicePrimaryCtxRetain", a.cuDevicePrimaryCtxRetain(&ctx_, dev));
  if (e.empty()) e = Bind();
  if (e.empty()) e = Call("cuMemAlloc (weights)", a.cuMemAlloc(&weights_, weights_bytes));
  if (e.empty()) e = Call("cuMemAlloc (kv cache)", a.cuMemAlloc(&kv_, kv_bytes));
  if (e.empty()) e = Call("cuMemsetD32 (weights)", a.cuMemsetD32(weights_, 0, weights_bytes / 4));
  if (e.empty()) e = Call("cuMemsetD32 (kv cache)", a.cuMemsetD32(kv_, 0, kv_bytes / 4));
  if (e.empty()) e = Call("cuCtxSynchronize", a.cuCtxSynchronize());
  return e;
}

std::string DeviceMemory::Bind() const { return Call("cuCtxSetCurrent", drv_.api.cuCtxSetCurrent(ctx_)); }

std::string DeviceMemory::FillWeights(uint64_t seed) {
  std::vector<uint64_t> buf(kChunk / 8);
  for (uint64_t off = 0; off < weights_bytes_; off += kChunk) {
    const uint64_t n = std::min(kChunk, weights_bytes_ - off);
    for (uint64_t i = 0; i < n / 8; ++i) buf[i] = WeightWord(seed, off / 8 + i);
    if (auto e = Call("cuMemcpyHtoD (weights)", drv_.api.cuMemcpyHtoD(weights_ + off, buf.data(), n)); !e.empty()) {
      return e;
    }
  }
  return {};
}

std::string DeviceMemory::WriteKv(uint64_t seed, uint32_t page, uint32_t version, std::vector<std::byte>& scratch) {
  const unsigned long long at = kv_ + uint64_t{page} * kv_page_;
  if (version % 2 == 0) {
    return Call("cuMemsetD32 (kv cache)", drv_.api.cuMemsetD32(at, MemsetValue(seed, page, version), kv_page_ / 4));
  }
  scratch.resize(kv_page_);
  workload::FillPage(scratch, seed, page, version);
  return Call("cuMemcpyHtoD (kv cache)", drv_.api.cuMemcpyHtoD(at, scratch.data(), kv_page_));
}

std::string DeviceMemory::CheckWeights(uint64_t seed, std::vector<std::byte>& buf) {
  for (uint64_t off = 0; off < weights_bytes_; off += kChunk) {
    const uint64_t n = std::min(kChunk, weights_bytes_ - off);
    buf.resize(n);
    if (auto e = Call("cuMemcpyDtoH (weights)", drv_.api.cuMemcpyDtoH(buf.data(), weights_ + off, n)); !e.empty()) {
      return e;
    }
    for (uint64_t i = 0; i < n / 8; ++i) {
      uint64_t w;
      std::memcpy(&w, buf.data() + i * 8, 8);
      if (w != WeightWord(seed, off / 8 + i)) {
        return fmt::format("weights: word {} (byte {}) is {:#x}, expected {:#x}", off / 8 + i, off + i * 8, w,
                           WeightWord(seed, off / 8 + i));
      }
    }
  }
  return {};
}

std::string DeviceMemory::Check(uint64_t seed, std::span<const uint32_t> versions) {
  std::vector<std::byte> buf;
  if (auto e = CheckWeights(seed, buf); !e.empty()) return e;
  if (versions.size() != kv_pages()) return fmt::format("{} page versions for {} kv pages", versions.size(), kv_pages());
  buf.resize(kv_page_);
  uint64_t bad = 0;
  std::string first;
  for (uint32_t p = 0; p < kv_pages(); ++p) {
    const unsigned long long at = kv_ + uint64_t{p} * kv_page_;
    if (auto e = Call("cuMemcpyDtoH (kv cache)", drv_.api.cuMemcpyDtoH(buf.data(), at, kv_page_)); !e.empty()) return e;
    std::string why;
    const uint32_t v = versions[p];
    if (v == 0 || v % 2 == 1) {
      why = workload::CheckPage(buf, seed, p, v);
    } else {
      const uint32_t want = MemsetValue(seed, p, v);
      for (uint64_t i = 0; i < kv_page_ / 4 && why.empty(); ++i) {
        uint32_t got;
        std::memcpy(&got, buf.data() + i * 4, 4);
        if (got != want) why = fmt::format("expected the memset of version {} ({:#x}), word {} is {:#x}", v, want, i, got);
      }
    }
    if (!why.empty() && bad++ == 0) first = fmt::format("kv page {}: {}", p, why);
  }
  if (bad != 0) return fmt::format("{} of {} kv pages wrong; first: {}", bad, kv_pages(), first);
  return {};
}

std::string DeviceMemory::Digests(std::vector<uint64_t>* out) {
  out->clear();
  std::vector<std::byte> buf(kDigestPage);
  for (auto [base, bytes] : {std::pair{weights_, weights_bytes_}, std::pair{kv_, kv_bytes_}}) {
    for (uint64_t off = 0; off < bytes; off += kDigestPage) {
      const uint64_t n = std::min(kDigestPage, bytes - off);
      if (auto e = Call("cuMemcpyDtoH", drv_.api.cuMemcpyDtoH(buf.data(), base + off, n)); !e.empty()) return e;
      out->push_back(cuda::HashPage(buf.data(), n / cuda::kHashMinPage * cuda::kHashMinPage));
    }
  }
  return {};
}

}  // namespace gpumigrate::cudaworkload
