// The cuda: device against the real shim and the driver double (libcuda-fake.so,
// GM_CUDA_FAKE): the test process allocates "device" memory, registers it with
// gm_shim_register_cuda and connects a cuda: device to its own pid. Reads through
// the staging slots, digest tracking with the kernel and with host hashing,
// destination writes and zeroing, bounds, pause with synchronisation, and the
// errors a wrong process or a missing driver gives.
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "engine/devices/cuda/driver_loader.h"
#include "gpumigrate/devices/cuda.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/shim.h"

namespace gpumigrate::cuda {
namespace {

constexpr uint64_t kSize = 9u << 20;  // more than two 4 MiB staging slots, not a multiple of one

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("GPUMIGRATE_LIBCUDA", GM_CUDA_FAKE, 1);
    ASSERT_EQ(LoadDriver(kNeedCore | kNeedMemory, &drv_), "");
    const DriverApi& a = drv_.api;
    ASSERT_EQ(a.cuInit(0), CUDA_SUCCESS);
    ASSERT_EQ(a.cuDevicePrimaryCtxRetain(&ctx_, 0), CUDA_SUCCESS);
    ASSERT_EQ(a.cuCtxSetCurrent(ctx_), CUDA_SUCCESS);
    ASSERT_EQ(a.cuMemAlloc(&mem_, kSize), CUDA_SUCCESS);
    host_.resize(kSize);
    std::mt19937_64 rng(11);
    for (size_t i = 0; i < kSize; i += 8) {
      uint64_t v = rng();
      std::memcpy(host_.data() + i, &v, 8);
    }
    ASSERT_EQ(a.cuMemcpyHtoD(mem_, host_.data(), kSize), CUDA_SUCCESS);
  }
  void TearDown() override {
    gm_shim_shutdown();
    if (mem_ != 0) (void)drv_.api.cuMemFree(mem_);
  }

  void Serve(bool adopt = false) {
    ASSERT_EQ(gm_shim_register_cuda("vram", mem_, kSize, GM_SHIM_HINT_DYNAMIC, 0), 0) << gm_shim_last_error();
    ASSERT_EQ(adopt ? gm_shim_start_adopt() : gm_shim_start(), 0) << gm_shim_last_error();
  }

  std::unique_ptr<ProcDevice> Connect(CudaHash hash, ProcRole role = ProcRole::kSource, uint32_t page = 64u << 10) {
    auto dev = ProcDevice::Connect(ProcSpecForCuda(CudaSpec{getpid(), page, hash}), role);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    return dev.ok() ? std::move(dev).value() : nullptr;
  }

  std::vector<std::byte> DeviceBytes() {
    std::vector<std::byte> out(kSize);
    EXPECT_EQ(drv_.api.cuMemcpyDtoH(out.data(), mem_, kSize), CUDA_SUCCESS);
    return out;
  }

  LoadedDriver drv_;
  CUcontext ctx_ = nullptr;
  CUdeviceptr mem_ = 0;
  std::vector<std::byte> host_;
};

TEST_F(CudaDeviceTest, ReadsEveryByteThroughTheStagingSlots) {
  Serve();
  auto dev = Connect(CudaHash::kAuto);
  ASSERT_NE(dev, nullptr);
  ASSERT_EQ(dev->Regions().size(), 1u);
  EXPECT_EQ(dev->Regions()[0].size_bytes, kSize);
  EXPECT_EQ(dev->Regions()[0].page_size, 64u << 10);
  EXPECT_EQ(dev->Regions()[0].name, "vram");
  std::vector<std::byte> all(kSize);
  ASSERT_TRUE(dev->Read(0, 0, all).ok());
  EXPECT_EQ(all, host_);
  std::vector<std::byte> odd(12345);  // unaligned, straddling a slot boundary
  ASSERT_TRUE(dev->Read(0, (4u << 20) - 77, odd).ok());
  EXPECT_EQ(0, std::memcmp(odd.data(), host_.data() + (4u << 20) - 77, odd.size()));
  Status st = dev->Read(0, kSize - 10, std::span(odd.data(), 11));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("region"), std::string::npos) << st.message();
  EXPECT_NE(dev->Describe().find("cuda:"), std::string::npos) << dev->Describe();
}

void ExpectExactSync(ProcDevice& dev, DriverApi a, CUdeviceptr mem) {
  DirtyTracker* t = dev.Tracker();
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Start().ok());
  const uint64_t page = 64u << 10;
  std::vector<std::byte> junk(100, std::byte{0x5a});
  ASSERT_EQ(a.cuMemcpyHtoD(mem + 3 * page + 5, junk.data(), junk.size()), CUDA_SUCCESS);   // page 3
  ASSERT_EQ(a.cuMemsetD32(mem + 100 * page, 0x1234, 4), CUDA_SUCCESS);                     // page 100
  ASSERT_EQ(a.cuMemcpyHtoD(mem + kSize - 8, junk.data(), 8), CUDA_SUCCESS);                // last page
  DirtyBitmap b(kSize / page);
  ASSERT_TRUE(t->Sync(0, b).ok());
  std::vector<uint64_t> got;
  for (uint64_t p = b.NextSet(0); p < b.pages(); p = b.NextSet(p + 1)) got.push_back(p);
  EXPECT_EQ(got, (std::vector<uint64_t>{3, 100, kSize / page - 1})) << dev.TrackerName();
  DirtyBitmap again(kSize / page);
  ASSERT_TRUE(t->Sync(0, again).ok());
  EXPECT_EQ(again.Count(), 0u);
  ASSERT_TRUE(t->Stop().ok());
}

TEST_F(CudaDeviceTest, GpuDigestsFindExactlyTheWrittenPages) {
  Serve();
  auto dev = Connect(CudaHash::kAuto);
  ASSERT_NE(dev, nullptr);
  if (dev->TrackerName() != "gpu-hash") GTEST_SKIP() << "no kernel: " << dev->TrackerReason();
  EXPECT_NE(dev->TrackerReason().find("gm_hash_pages kernel"), std::string::npos) << dev->TrackerReason();
  ExpectExactSync(*dev, drv_.api, mem_);
}

TEST_F(CudaDeviceTest, HostHashingFindsTheSamePages) {
  Serve();
  auto dev = Connect(CudaHash::kHost);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->TrackerName(), "host-hash");
  EXPECT_NE(dev->TrackerReason().find("forced (hash=host)"), std::string::npos) << dev->TrackerReason();
  ExpectExactSync(*dev, drv_.api, mem_);
}

TEST_F(CudaDeviceTest, KernelRefusedFallsBackOrFailsAsAsked) {
  setenv("GPUMIGRATE_FAKE_CUDA_FAIL", "cuModuleLoadData=200", 1);
  Serve();
  auto gpu = ProcDevice::Connect(ProcSpecForCuda(CudaSpec{getpid(), 64u << 10, CudaHash::kGpu}), ProcRole::kSource);
  EXPECT_FALSE(gpu.ok());
  EXPECT_NE(gpu.status().message().find("hash=gpu is not possible"), std::string::npos) << gpu.status().message();
  auto dev = Connect(CudaHash::kAuto);
  unsetenv("GPUMIGRATE_FAKE_CUDA_FAIL");
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(dev->TrackerName(), "host-hash");
  EXPECT_NE(dev->TrackerReason().find("cuModuleLoadData"), std::string::npos) << dev->TrackerReason();
  ExpectExactSync(*dev, drv_.api, mem_);
}

TEST_F(CudaDeviceTest, DestinationWritesAndZeroesDeviceMemory) {
  Serve(/*adopt=*/true);
  auto dev = Connect(CudaHash::kAuto, ProcRole::kDestination);
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(dev->SetState(DeviceState::kResuming).ok());
  std::vector<std::byte> data(5u << 20, std::byte{0x77});
  ASSERT_TRUE(dev->Write(0, 1000, data).ok());
  ASSERT_TRUE(dev->WriteZeros(0, 0, 64u << 10).ok());
  ASSERT_TRUE(dev->WriteZeros(0, (64u << 10) + 1, 3).ok());  // unaligned: not a memset
  auto bytes = DeviceBytes();
  for (uint64_t i = 0; i < (64u << 10); ++i) ASSERT_EQ(bytes[i], std::byte{0}) << i;
  EXPECT_EQ(bytes[(64u << 10)], std::byte{0x77});
  EXPECT_EQ(bytes[(64u << 10) + 1], std::byte{0});
  EXPECT_EQ(bytes[(64u << 10) + 3], std::byte{0});
  EXPECT_EQ(bytes[(64u << 10) + 4], std::byte{0x77});
  EXPECT_EQ(bytes[1000 + data.size() - 1], std::byte{0x77});
  EXPECT_EQ(bytes[1000 + data.size()], host_[1000 + data.size()]);
  EXPECT_FALSE(dev->Write(0, kSize - 1, std::span(data.data(), 2)).ok());
  // A discarded migration zeroes the device memory.
  ASSERT_TRUE(dev->SetState(DeviceState::kError).ok());
  bytes = DeviceBytes();
  EXPECT_EQ(bytes, std::vector<std::byte>(kSize));
}

TEST_F(CudaDeviceTest, StopCopyPausesAndAProcessWithoutCudaRegionsIsRefused) {
  Serve();
  auto dev = Connect(CudaHash::kAuto);
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(dev->SetState(DeviceState::kPreCopy).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStopCopy).ok());
  EXPECT_TRUE(dev->SaveState().ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kRunning).ok());
  dev.reset();
  gm_shim_shutdown();
  void* host = gm_shim_alloc("host-only", 1u << 20, GM_SHIM_HINT_DYNAMIC, 0);
  ASSERT_NE(host, nullptr);
  ASSERT_EQ(gm_shim_start(), 0);
  auto no = ProcDevice::Connect(ProcSpecForCuda(CudaSpec{getpid()}), ProcRole::kSource);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.status().message().find("registered no CUDA regions"), std::string::npos) << no.status().message();
}

TEST_F(CudaDeviceTest, RegistrationChecksAlignmentAndOwnership) {
  EXPECT_EQ(gm_shim_register_cuda("odd", mem_ + 8, 1u << 20, 0, 0), -EINVAL);
  EXPECT_NE(std::string(gm_shim_last_error()).find("256-byte aligned"), std::string::npos) << gm_shim_last_error();
  EXPECT_EQ(gm_shim_register_cuda("odd", mem_, 1000, 0, 0), -EINVAL);
  EXPECT_EQ(gm_shim_register_cuda("wild", mem_ + kSize, 1u << 20, 0, 0), -EFAULT);  // past the allocation
  EXPECT_NE(std::string(gm_shim_last_error()).find("not readable in the context"), std::string::npos)
      << gm_shim_last_error();
}

}  // namespace
}  // namespace gpumigrate::cuda
