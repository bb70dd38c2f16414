// The driver double's own semantics (tests/support/cuda/fake/fake_libcuda.h):
// what a test of the CUDA backend relies on must hold here first.
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/devices/cuda/page_hash.h"
#include "tests/support/cuda/fake/fake_shared_state.h"
#include "tests/support/cuda/fresh_fake.h"

namespace gpumigrate::cuda {
namespace {

using testing::FreshFake;
using testing::ScopedEnv;

constexpr unsigned kNeeds = kNeedCore | kNeedMemory | kNeedModule;

// PTX as nvcc writes it, cut down to what the fake looks at.
constexpr const char* kHashPtx =
    ".version 8.0\n.target sm_75\n.address_size 64\n"
    ".visible .entry gm_hash_pages(\n\t.param .u64 p0,\n\t.param .u64 p1,\n\t.param .u64 p2,\n\t.param .u64 p3\n)\n{\n\tret;\n}\n";

// A fresh fake, initialised, with device 0's primary context current.
class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(fake_.error(), "");
    ASSERT_EQ(a().cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(a().cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(a().cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
  }
  const DriverApi& a() const { return fake_.api(); }

  FreshFake fake_{GM_CUDA_FAKE, kNeeds};
  CUcontext ctx_ = nullptr;
};

TEST(FakeDriver, EveryCallBeforeCuInitIsNotInitialized) {
  FreshFake fake(GM_CUDA_FAKE, kNeeds);
  ASSERT_EQ(fake.error(), "");
  const DriverApi& a = fake.api();
  int n = -1;
  CUdeviceptr p = 0;
  EXPECT_EQ(a.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(a.cuMemAlloc(&p, 4096), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(a.cuCtxSynchronize(), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(a.cuInit(1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  ASSERT_EQ(a.cuDeviceGetCount(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, 1);
}

TEST(FakeDriver, DevicesComeFromTheEnvironment) {
  ScopedEnv devices("GPUMIGRATE_FAKE_CUDA_DEVICES", "3");
  FreshFake fake(GM_CUDA_FAKE, kNeeds);
  const DriverApi& a = fake.api();
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  int n = 0;
  ASSERT_EQ(a.cuDeviceGetCount(&n), CUDA_SUCCESS);
  EXPECT_EQ(n, 3);
  CUdevice d = -1;
  EXPECT_EQ(a.cuDeviceGet(&d, 2), CUDA_SUCCESS);
  EXPECT_EQ(a.cuDeviceGet(&d, 3), CUDA_ERROR_INVALID_DEVICE);
  CUuuid u0{}, u2{};
  ASSERT_EQ(a.cuDeviceGetUuid(&u0, 0), CUDA_SUCCESS);
  ASSERT_EQ(a.cuDeviceGetUuid(&u2, 2), CUDA_SUCCESS);
  EXPECT_NE(std::string(u0.bytes, 16), std::string(u2.bytes, 16));
}

TEST(FakeDriver, NoDeviceFailsCuInit) {
  ScopedEnv devices("GPUMIGRATE_FAKE_CUDA_DEVICES", "0");
  FreshFake fake(GM_CUDA_FAKE, kNeeds);
  EXPECT_EQ(fake.api().cuInit(0), CUDA_ERROR_NO_DEVICE);
}

TEST(FakeDriver, MemoryCallsNeedACurrentActiveContext) {
  FreshFake fake(GM_CUDA_FAKE, kNeeds);
  const DriverApi& a = fake.api();
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  EXPECT_EQ(a.cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  CUcontext ctx = nullptr;
  ASSERT_EQ(a.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  ASSERT_EQ(a.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  EXPECT_EQ(a.cuMemAlloc(&p, 4096), CUDA_SUCCESS);
  ASSERT_EQ(a.cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
  EXPECT_EQ(a.cuMemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(a.cuDevicePrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
}

TEST_F(FakeDriverTest, CopiesStayInsideOneLiveAllocation) {
  constexpr size_t kBytes = 10000;
  CUdeviceptr p = 0;
  ASSERT_EQ(a().cuMemAlloc(&p, kBytes), CUDA_SUCCESS);
  std::vector<unsigned char> in(kBytes), out(kBytes + 1);
  for (size_t i = 0; i < kBytes; ++i) in[i] = static_cast<unsigned char>(i * 7);
  ASSERT_EQ(a().cuMemcpyHtoD(p, in.data(), kBytes), CUDA_SUCCESS);
  ASSERT_EQ(a().cuMemcpyDtoH(out.data(), p, kBytes), CUDA_SUCCESS);
  EXPECT_TRUE(std::equal(in.begin(), in.end(), out.begin()));
  EXPECT_EQ(a().cuMemcpyDtoH(out.data(), p, kBytes + 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(a().cuMemcpyDtoH(out.data(), p + 1, kBytes), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(a().cuMemcpyHtoD(p - 1, in.data(), 2), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(a().cuMemsetD32(p + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);  // unaligned
  EXPECT_EQ(a().cuMemsetD32(p, 0, kBytes / 4 + 1), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(a().cuMemsetD32(p, 0xabcdef01u, kBytes / 4), CUDA_SUCCESS);
  uint32_t word = 0;
  ASSERT_EQ(a().cuMemcpyDtoH(&word, p + kBytes - 4, 4), CUDA_SUCCESS);
  EXPECT_EQ(word, 0xabcdef01u);
  ASSERT_EQ(a().cuMemFree(p), CUDA_SUCCESS);
  EXPECT_EQ(a().cuMemcpyDtoH(out.data(), p, 1), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(a().cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(a().cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
}

TEST(FakeDriver, AllocationsBeyondTheDeviceAreOutOfMemoryAndGetInfoCounts) {
  ScopedEnv memory("GPUMIGRATE_FAKE_CUDA_MEMORY", "64M");
  FreshFake fake(GM_CUDA_FAKE, kNeeds);
  const DriverApi& a = fake.api();
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  ASSERT_EQ(a.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  ASSERT_EQ(a.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(a.cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  EXPECT_EQ(total_bytes, 64u << 20);
  EXPECT_EQ(free_bytes, total_bytes);
  CUdeviceptr big = 0, more = 0, small = 0;
  ASSERT_EQ(a.cuMemAlloc(&big, 40u << 20), CUDA_SUCCESS);
  ASSERT_EQ(a.cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, (64u - 40u) << 20);
  EXPECT_EQ(a.cuMemAlloc(&more, 30u << 20), CUDA_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(a.cuMemAlloc(&small, 1), CUDA_SUCCESS);  // one 4 KiB granule
  ASSERT_EQ(a.cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, ((64u - 40u) << 20) - 4096);
  ASSERT_EQ(a.cuMemFree(big), CUDA_SUCCESS);
  ASSERT_EQ(a.cuMemFree(small), CUDA_SUCCESS);
  ASSERT_EQ(a.cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  EXPECT_EQ(free_bytes, total_bytes);
}

TEST_F(FakeDriverTest, HostRegistrationRefusesOverlapAndUnknownUnregister) {
  std::vector<char> buf(3 * 4096);
  ASSERT_EQ(a().cuMemHostRegister(buf.data(), 2 * 4096, CU_MEMHOSTREGISTER_PORTABLE), CUDA_SUCCESS);
  EXPECT_EQ(a().cuMemHostRegister(buf.data(), 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  EXPECT_EQ(a().cuMemHostRegister(buf.data() + 4096, 2 * 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  ASSERT_EQ(a().cuMemHostRegister(buf.data() + 2 * 4096, 4096, 0), CUDA_SUCCESS);  // adjacent
  EXPECT_EQ(a().cuMemHostUnregister(buf.data() + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  ASSERT_EQ(a().cuMemHostUnregister(buf.data()), CUDA_SUCCESS);
  EXPECT_EQ(a().cuMemHostUnregister(buf.data()), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  ASSERT_EQ(a().cuMemHostUnregister(buf.data() + 2 * 4096), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, ModulesDefineOnlyTheHashKernel) {
  CUmodule m = nullptr;
  EXPECT_EQ(a().cuModuleLoadData(&m, "not ptx at all"), CUDA_ERROR_INVALID_IMAGE);
  EXPECT_EQ(a().cuModuleLoadData(&m, ".version 8.0\n.visible .entry other_kernel()\n{}\n"), CUDA_ERROR_INVALID_IMAGE);
  ASSERT_EQ(a().cuModuleLoadData(&m, kHashPtx), CUDA_SUCCESS);
  CUfunction f = nullptr;
  EXPECT_EQ(a().cuModuleGetFunction(&f, m, "gm_hash_page"), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(a().cuModuleGetFunction(&f, m, "gm_hash_pages"), CUDA_SUCCESS);
  ASSERT_EQ(a().cuModuleUnload(m), CUDA_SUCCESS);
  EXPECT_EQ(a().cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(a().cuLaunchKernel(f, 1, 1, 1, kHashLanes, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_ERROR_INVALID_HANDLE);
}

TEST_F(FakeDriverTest, TheHashKernelEqualsHashPagesOnRandomMemory) {
  constexpr unsigned long long kPageBytes = 64 * 1024, kPages = 9;
  std::vector<unsigned char> host(kPageBytes * kPages);
  std::mt19937_64 rng(::testing::UnitTest::GetInstance()->random_seed());
  for (auto& b : host) b = static_cast<unsigned char>(rng());
  CUdeviceptr base = 0, digests = 0;
  ASSERT_EQ(a().cuMemAlloc(&base, host.size()), CUDA_SUCCESS);
  ASSERT_EQ(a().cuMemAlloc(&digests, kPages * 8), CUDA_SUCCESS);
  ASSERT_EQ(a().cuMemcpyHtoD(base, host.data(), host.size()), CUDA_SUCCESS);
  CUmodule m = nullptr;
  CUfunction f = nullptr;
  ASSERT_EQ(a().cuModuleLoadData(&m, kHashPtx), CUDA_SUCCESS);
  ASSERT_EQ(a().cuModuleGetFunction(&f, m, "gm_hash_pages"), CUDA_SUCCESS);
  unsigned long long page_bytes = kPageBytes, pages = kPages;
  void* params[] = {&base, &page_bytes, &pages, &digests};
  ASSERT_EQ(a().cuLaunchKernel(f, kPages, 1, 1, kHashLanes, 1, 1, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(a().cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  std::vector<uint64_t> got(kPages), want(kPages);
  ASSERT_EQ(a().cuMemcpyDtoH(got.data(), digests, kPages * 8), CUDA_SUCCESS);
  HashPages(reinterpret_cast<const std::byte*>(host.data()), kPageBytes, kPages, want.data());
  EXPECT_EQ(got, want);

  // The launch's shape and its memory are checked.
  EXPECT_EQ(a().cuLaunchKernel(f, kPages - 1, 1, 1, kHashLanes, 1, 1, 0, nullptr, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(a().cuLaunchKernel(f, kPages, 1, 1, 128, 1, 1, 0, nullptr, params, nullptr), CUDA_ERROR_INVALID_VALUE);
  pages = kPages + 1;
  EXPECT_EQ(a().cuLaunchKernel(f, kPages + 1, 1, 1, kHashLanes, 1, 1, 0, nullptr, params, nullptr),
            CUDA_ERROR_ILLEGAL_ADDRESS);
  pages = kPages;
  CUdeviceptr digests_short = digests + 8;
  void* short_params[] = {&base, &page_bytes, &pages, &digests_short};
  EXPECT_EQ(a().cuLaunchKernel(f, kPages, 1, 1, kHashLanes, 1, 1, 0, nullptr, short_params, nullptr),
            CUDA_ERROR_ILLEGAL_ADDRESS);
  page_bytes = kHashMinPage + 8;
  EXPECT_EQ(a().cuLaunchKernel(f, kPages, 1, 1, kHashLanes, 1, 1, 0, nullptr, params, nullptr),
            CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeDriverTest, InjectedFailuresReturnTheirCode) {
  CUdeviceptr p = 0;
  {
    ScopedEnv fail("GPUMIGRATE_FAKE_CUDA_FAIL", "cuInit=3,cuMemAlloc_v2=2");
    EXPECT_EQ(a().cuMemAlloc(&p, 4096), CUDA_ERROR_OUT_OF_MEMORY);
  }
  EXPECT_EQ(a().cuMemAlloc(&p, 4096), CUDA_SUCCESS);
}

TEST_F(FakeDriverTest, UnknownStreamsAreInvalidHandles) {
  EXPECT_EQ(a().cuStreamSynchronize(reinterpret_cast<CUstream>(0x2)), CUDA_SUCCESS);
  EXPECT_EQ(a().cuStreamSynchronize(reinterpret_cast<CUstream>(0x1000)), CUDA_ERROR_INVALID_HANDLE);
}

// Whether this process can read [p, p + bytes): false once the pages are gone.
bool Readable(CUdeviceptr p, size_t bytes) {
  std::vector<char> buf(bytes);
  iovec local{buf.data(), bytes};
  iovec remote{reinterpret_cast<void*>(p), bytes};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes);
}

// This process is both the CUDA process and its controller: the fake's service
// thread does the work, as it would for another process.
TEST(FakeDriver, CheckpointMovesDeviceMemoryOutAndBackInPlace) {
  FreshFake fake(GM_CUDA_FAKE, kNeeds | kNeedCheckpoint);
  ASSERT_EQ(fake.error(), "");
  const DriverApi& a = fake.api();
  const int self = getpid();
  CUprocessState state{};
  EXPECT_EQ(a.cuCheckpointProcessGetState(self, &state), CUDA_ERROR_INVALID_VALUE) << "no cuInit yet: no CUDA here";
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  ASSERT_EQ(a.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  ASSERT_EQ(a.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  constexpr size_t kBytes = 3 * 4096 + 100;
  ASSERT_EQ(a.cuMemAlloc(&p, kBytes), CUDA_SUCCESS);
  ASSERT_EQ(a.cuMemsetD32(p, 0x5a5a1234u, kBytes / 4), CUDA_SUCCESS);

  ASSERT_EQ(a.cuCheckpointProcessGetState(self, &state), CUDA_SUCCESS);
  EXPECT_EQ(state, CU_PROCESS_STATE_RUNNING);
  EXPECT_EQ(a.cuCheckpointProcessCheckpoint(self, nullptr), CUDA_ERROR_ILLEGAL_STATE);
  EXPECT_EQ(a.cuCheckpointProcessUnlock(self, nullptr), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(a.cuCheckpointProcessLock(self, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(a.cuCheckpointProcessLock(self, nullptr), CUDA_ERROR_ILLEGAL_STATE);
  EXPECT_EQ(a.cuCheckpointProcessRestore(self, nullptr), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(a.cuCheckpointProcessCheckpoint(self, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(a.cuCheckpointProcessGetState(self, &state), CUDA_SUCCESS);
  EXPECT_EQ(state, CU_PROCESS_STATE_CHECKPOINTED);
  EXPECT_FALSE(Readable(p, 4096)) << "checkpointed device pages are still mapped";
  {
    fake::SharedStateView view(fake.dir(), self);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view.get()->device_used_bytes.load(), 0u);
  }
  CUcheckpointGpuPair pair{};
  CUcheckpointRestoreArgs remap{};
  remap.gpuPairs = &pair;
  remap.gpuPairsCount = 1;
  EXPECT_EQ(a.cuCheckpointProcessRestore(self, &remap), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT_EQ(a.cuCheckpointProcessUnlock(self, nullptr), CUDA_ERROR_ILLEGAL_STATE);
  ASSERT_EQ(a.cuCheckpointProcessRestore(self, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(a.cuCheckpointProcessUnlock(self, nullptr), CUDA_SUCCESS);

  std::vector<uint32_t> words(kBytes / 4);
  ASSERT_EQ(a.cuMemcpyDtoH(words.data(), p, words.size() * 4), CUDA_SUCCESS);  // the same address
  EXPECT_EQ(std::count(words.begin(), words.end(), 0x5a5a1234u), static_cast<long>(words.size()));
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(a.cuMemGetInfo(&free_bytes, &total_bytes), CUDA_SUCCESS);
  EXPECT_EQ(total_bytes - free_bytes, 4 * 4096u);
  int tid = 0;
  ASSERT_EQ(a.cuCheckpointProcessGetRestoreThreadId(self, &tid), CUDA_SUCCESS);
  EXPECT_NE(tid, 0);
  EXPECT_NE(tid, self);
}

TEST(FakeDriver, ACallWhileLockedWaitsForTheUnlock) {
  FreshFake fake(GM_CUDA_FAKE, kNeeds | kNeedCheckpoint);
  ASSERT_EQ(fake.error(), "");
  const DriverApi& a = fake.api();
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  ASSERT_EQ(a.cuCheckpointProcessLock(getpid(), nullptr), CUDA_SUCCESS);
  std::atomic<int> result{-1};
  std::thread caller([&] {
    int n = 0;
    result.store(a.cuDeviceGetCount(&n));
  });
  fake::SharedStateView view(fake.dir(), getpid());
  ASSERT_TRUE(view.ok());
  while (view.get()->waiting_calls.load() == 0 && result.load() == -1) std::this_thread::yield();
  EXPECT_EQ(result.load(), -1) << "a call returned while the process was LOCKED";
  ASSERT_EQ(a.cuCheckpointProcessUnlock(getpid(), nullptr), CUDA_SUCCESS);
  caller.join();
  EXPECT_EQ(result.load(), CUDA_SUCCESS);
}

// "Restore requires persistence mode to be enabled or cuInit to have been
// called": the fake has no persistence mode, so without cuInit in the calling
// process its Restore is refused, whatever the pid.
TEST(FakeDriver, RestoreBeforeCuInitIsNotInitialized) {
  FreshFake fake(GM_CUDA_FAKE, kNeeds | kNeedCheckpoint);
  ASSERT_EQ(fake.error(), "");
  const DriverApi& a = fake.api();
  EXPECT_EQ(a.cuCheckpointProcessRestore(getpid(), nullptr), CUDA_ERROR_NOT_INITIALIZED);
  EXPECT_EQ(a.cuCheckpointProcessRestore(1, nullptr), CUDA_ERROR_NOT_INITIALIZED);
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  EXPECT_EQ(a.cuCheckpointProcessRestore(getpid(), nullptr), CUDA_ERROR_ILLEGAL_STATE) << "RUNNING: nothing to restore";
}

// A child forked after cuInit is not the process the state file names: what it
// does must not show in the parent's file, and its exit must not remove it.
TEST(FakeDriver, AChildForkedAfterCuInitLeavesTheParentsStateFileAlone) {
  FreshFake fake(GM_CUDA_FAKE, kNeeds | kNeedCheckpoint);
  ASSERT_EQ(fake.error(), "");
  const DriverApi& a = fake.api();
  ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  ASSERT_EQ(a.cuDevicePrimaryCtxRetain(&ctx, 0), CUDA_SUCCESS);
  ASSERT_EQ(a.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  const std::string file = fake::SharedStatePath(fake.dir(), getpid());
  ASSERT_TRUE(std::filesystem::exists(file));
  const pid_t child = fork();
  if (child == 0) {
    CUdeviceptr p = 0;
    const CUresult r = a.cuMemAlloc(&p, 1 << 20);
    std::exit(r == CUDA_SUCCESS ? 0 : 1);  // exit, not _exit: the atexit handlers run
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(std::filesystem::exists(file)) << "the child's exit removed the parent's state file";
  fake::SharedStateView view(fake.dir(), getpid());
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view.get()->device_used_bytes.load(), 0u) << "the child's allocation shows in the parent's state file";
}

}  // namespace
}  // namespace gpumigrate::cuda
