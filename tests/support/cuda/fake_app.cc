// A CUDA process for the checkpoint tests: loads the driver ($GPUMIGRATE_LIBCUDA,
// the fake), allocates device memory, fills it with a pattern, then loops for
// ever: copy it back and verify it, run the hash kernel over it, synchronise
// the stream (which $GPUMIGRATE_FAKE_CUDA_SLOW can make long). Progress goes to
// the file named by argv[1] (fake_app.h). Exits 1 on the first failed call.
//
//   cuda_fake_app PROGRESS_FILE [BYTES]
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/devices/cuda/driver_loader.h"
#include "engine/devices/cuda/page_hash.h"
#include "tests/support/cuda/fake_app.h"

namespace {

using namespace gpumigrate::cuda;  // NOLINT

constexpr const char* kHashPtx = ".version 8.0\n.target sm_75\n.address_size 64\n.visible .entry gm_hash_pages(\n)\n";
constexpr uint64_t kPageBytes = 64 * 1024;

uint64_t Pattern(uint64_t i) { return (i + 1) * 0x9e3779b97f4a7c15ull; }

testing::AppProgress* g_progress = nullptr;

void Fail(const char* call, CUresult r) {
  std::fprintf(stderr, "cuda_fake_app: %s failed: %d\n", call, r);
  g_progress->last_error.store(r);
  g_progress->failed.store(1);
  std::exit(1);
}

#define CALL(expr)                          \
  do {                                      \
    if (CUresult r_ = (expr)) Fail(#expr, r_); \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: cuda_fake_app PROGRESS_FILE [BYTES]\n");
    return 2;
  }
  g_progress = testing::MapProgress(argv[1], false);
  if (g_progress == nullptr) return 2;
  const uint64_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1u << 20;
  const uint64_t pages = bytes / kPageBytes;
  LoadedDriver d;
  if (std::string e = LoadDriver(kNeedCore | kNeedMemory | kNeedModule, &d); !e.empty()) {
    std::fprintf(stderr, "cuda_fake_app: %s\n", e.c_str());
    return 2;
  }
  const DriverApi& a = d.api;
  CUcontext ctx = nullptr;
  CUdeviceptr dptr = 0, digests = 0;
  CUmodule module = nullptr;
  CUfunction hash = nullptr;
  CALL(a.cuInit(0));
  CALL(a.cuDevicePrimaryCtxRetain(&ctx, 0));
  CALL(a.cuCtxSetCurrent(ctx));
  CALL(a.cuMemAlloc(&dptr, bytes));
  CALL(a.cuMemAlloc(&digests, pages * sizeof(uint64_t)));
  CALL(a.cuModuleLoadData(&module, kHashPtx));
  CALL(a.cuModuleGetFunction(&hash, module, "gm_hash_pages"));
  std::vector<uint64_t> want(bytes / 8), got(bytes / 8), want_digests(pages), got_digests(pages);
  for (uint64_t i = 0; i < want.size(); ++i) want[i] = Pattern(i);
  HashPages(reinterpret_cast<const std::byte*>(want.data()), kPageBytes, pages, want_digests.data());
  CALL(a.cuMemcpyHtoD(dptr, want.data(), bytes));
  g_progress->device_ptr.store(dptr);
  g_progress->bytes.store(bytes);
  g_progress->ready.store(1);
  unsigned long long page_bytes = kPageBytes, n = pages;
  void* params[] = {&dptr, &page_bytes, &n, &digests};
  for (;;) {
    CALL(a.cuMemcpyDtoH(got.data(), dptr, bytes));
    bool ok = got == want;
    CALL(a.cuLaunchKernel(hash, static_cast<unsigned>(pages), 1, 1, kHashLanes, 1, 1, 0, nullptr, params, nullptr));
    CALL(a.cuMemcpyDtoH(got_digests.data(), digests, pages * sizeof(uint64_t)));
    ok = ok && got_digests == want_digests;
    CALL(a.cuStreamSynchronize(nullptr));
    if (!ok) g_progress->verify_failures.fetch_add(1);
    g_progress->iterations.fetch_add(1);
    // Leave the two shared cores to the test; no test reads anything into this pause.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}
