// On a machine with an NVIDIA GPU and its driver (the real libcuda.so.1, never
// $GPUMIGRATE_LIBCUDA): the embedded gm_hash_pages PTX computes exactly
// page_hash.h's digests, and gpumigrate-cuda-workload migrates between two
// processes on one GPU with every byte checked (tests/cli/cuda_migration_test.sh
// in its `real` mode). Each test skips, saying why, where the driver cannot be
// loaded, no device exists, or the build had no nvcc. Run by scripts/gpu-check.
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/devices/cuda/driver_loader.h"
#include "engine/devices/cuda/hash_ptx.h"
#include "engine/devices/cuda/page_hash.h"

namespace gpumigrate::cuda {
namespace {

// The real driver with a current primary context on device 0, or why not.
class RealGpu {
 public:
  std::string Open() {
    unsetenv("GPUMIGRATE_LIBCUDA");  // the real driver, not a double
    if (std::string e = LoadDriver(kNeedCore | kNeedMemory | kNeedModule, &drv_); !e.empty()) return e;
    const DriverApi& a = drv_.api;
    int count = 0;
    if (CUresult r = a.cuInit(0); r != CUDA_SUCCESS) return "cuInit: " + ResultText(a, r);
    if (CUresult r = a.cuDeviceGetCount(&count); r != CUDA_SUCCESS || count == 0) return "no CUDA device";
    if (CUresult r = a.cuDevicePrimaryCtxRetain(&ctx_, 0); r != CUDA_SUCCESS) return "retain: " + ResultText(a, r);
    if (CUresult r = a.cuCtxSetCurrent(ctx_); r != CUDA_SUCCESS) return "cuCtxSetCurrent: " + ResultText(a, r);
    return {};
  }
  const DriverApi& api() const { return drv_.api; }
  std::string Text(CUresult r) const { return ResultText(drv_.api, r); }

 private:
  LoadedDriver drv_;
  CUcontext ctx_ = nullptr;
};

#define ASSERT_CU(call) \
  do {                  \
    CUresult r_ = (call); \
    ASSERT_EQ(r_, CUDA_SUCCESS) << #call << ": " << gpu.Text(r_); \
  } while (0)

void CheckKernel(RealGpu& gpu, CUfunction fn, uint64_t page_bytes, uint64_t pages, unsigned grid) {
  const DriverApi& a = gpu.api();
  std::vector<std::byte> host(page_bytes * pages);
  std::mt19937_64 rng(page_bytes ^ pages);
  for (size_t i = 0; i + 8 <= host.size(); i += 8) {
    const uint64_t v = (i / 8) % 7 == 0 ? 0 : rng();  // zero words too
    std::memcpy(host.data() + i, &v, 8);
  }
  CUdeviceptr base = 0, digests = 0;
  ASSERT_CU(a.cuMemAlloc(&base, host.size()));
  ASSERT_CU(a.cuMemAlloc(&digests, pages * 8));
  ASSERT_CU(a.cuMemcpyHtoD(base, host.data(), host.size()));
  unsigned long long pb = page_bytes, n = pages;
  void* params[] = {&base, &pb, &n, &digests};
  ASSERT_CU(a.cuLaunchKernel(fn, grid, 1, 1, kHashLanes, 1, 1, 0, nullptr, params, nullptr));
  std::vector<uint64_t> got(pages), want(pages);
  ASSERT_CU(a.cuMemcpyDtoH(got.data(), digests, pages * 8));
  HashPages(host.data(), page_bytes, pages, want.data());
  for (uint64_t p = 0; p < pages; ++p) {
    ASSERT_EQ(got[p], want[p]) << "page " << p << " of " << pages << " (" << page_bytes << " bytes, grid " << grid
                               << "): the kernel and page_hash.h disagree";
  }
  ASSERT_CU(a.cuMemFree(base));
  ASSERT_CU(a.cuMemFree(digests));
}

TEST(CudaGpu, HashKernelMatchesPageHash) {
  RealGpu gpu;
  if (std::string why = gpu.Open(); !why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
  if (kGmHashPtxBytes == 0) GTEST_SKIP() << "built without nvcc: no gm_hash_pages PTX to check";
  const DriverApi& a = gpu.api();
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  ASSERT_CU(a.cuModuleLoadData(&mod, kGmHashPtx));
  ASSERT_CU(a.cuModuleGetFunction(&fn, mod, "gm_hash_pages"));
  CheckKernel(gpu, fn, kHashMinPage, 33, 33);
  CheckKernel(gpu, fn, 4096, 64, 64);
  CheckKernel(gpu, fn, 64u << 10, 256, 256);
  CheckKernel(gpu, fn, 64u << 10, 100, 7);  // fewer blocks than pages: the grid strides
  CheckKernel(gpu, fn, 2u << 20, 8, 8);
  CheckKernel(gpu, fn, (64u << 10) + kHashMinPage, 3, 3);  // a page size that is no power of two
  ASSERT_CU(a.cuModuleUnload(mod));
}

TEST(CudaGpu, MigrationBetweenTwoProcessesOnOneGpu) {
  RealGpu gpu;
  if (std::string why = gpu.Open(); !why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
  const std::string cmd = std::string("bash ") + GM_CUDA_MIGRATION_SCRIPT + " " + GM_CLI + " " + GM_CUDA_WORKLOAD +
                          " real " + (kGmHashPtxBytes != 0 ? "ON" : "OFF") + " " + GM_WORKLOAD + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("FAIL"), std::string::npos) << out;
  EXPECT_NE(out.find("ok: auto: destination device memory equals the source's"), std::string::npos) << out;
  std::printf("%s", out.c_str());
}

}  // namespace
}  // namespace gpumigrate::cuda
