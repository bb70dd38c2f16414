// The proc backend's DMA-written regions tracked by the hardware's own record
// instead of hashing: the workload (this test process) declares how its device
// reaches the region (gm_shim_dma_iommufd / gm_shim_dma_logging); the shim
// passes the descriptor over its socket; the engine adopts it into a kernel and
// builds the IOMMU tracker for the region, or falls back to hashing and says
// why. This machine kind has no iommufd, so the descriptor is a memfd standing
// in for /dev/iommu (or the VFIO device fd) and the kernel is the fake one,
// whose FakeIommufd / FakeDmaLogging keep the dirty bits. The "device" is a
// thread that writes the region through a second path (pwrite to the memfd:
// page tables do not see it) and tells the fake which IOVAs it wrote, as the
// IOMMU would see them.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/iommu_tracking.h"
#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/shim.h"
#include "tests/integration/devices/proc/in_process_workload.h"
#include "tests/support/fake_device.h"
#include "tests/support/vfio/fake_dma_logging.h"
#include "tests/support/vfio/fake_iommufd.h"

namespace gpumigrate::testing {
namespace {

using vfio::fake::FakeDmaLogging;
using vfio::fake::FakeDmaLoggingFile;
using vfio::fake::FakeIommufd;
using vfio::fake::FakeKernel;

constexpr uint64_t kIova = 0x7f0012345000;  // 4 KiB aligned, not 64-page aligned
constexpr size_t kSize = 8u << 20;

enum class Kind { kIommufd, kDmaLogging };

// The fake hardware behind the declared descriptor, and the stand-in memfd the
// workload declares.
struct Hardware {
  FakeKernel kernel;
  std::shared_ptr<FakeIommufd> iommu;
  std::shared_ptr<FakeDmaLogging> log;
  uint32_t hwpt = 0;
  int stand_in = -1;
  Kind kind;

  Hardware(Kind k, bool dirty_capable = true) : kind(k) {
    if (k == Kind::kIommufd) {
      iommu = std::make_shared<FakeIommufd>(dirty_capable);
      // As the workload would: an IOAS with the region mapped, a dirty-tracking
      // HWPT the device is attached to.
      int fd = kernel.Install(iommu);
      uint32_t ioas = 0;
      EXPECT_EQ(vfio::fake::IoasAlloc(kernel, fd, &ioas), 0);
      EXPECT_EQ(vfio::fake::IoasMapFixed(kernel, fd, ioas, kIova, kSize), 0);
      if (dirty_capable) {
        auto h = AllocDirtyTrackingHwpt(kernel, fd, FakeIommufd::kDevId, ioas);
        EXPECT_TRUE(h.ok()) << h.status().ToString();
        hwpt = h.ok() ? *h : 0;
        EXPECT_EQ(iommu->AttachDevice(hwpt), 0);
      }
      EXPECT_EQ(kernel.Close(fd), 0);
      kernel.AddReceivable("fake-iommufd", iommu);
      stand_in = memfd_create("fake-iommufd", MFD_CLOEXEC);
    } else {
      log = std::make_shared<FakeDmaLogging>();
      kernel.AddReceivable("fake-vfio-device", std::make_shared<FakeDmaLoggingFile>(log));
      stand_in = memfd_create("fake-vfio-device", MFD_CLOEXEC);
    }
  }
  ~Hardware() {
    if (stand_in >= 0) close(stand_in);
  }
  int Declare(const char* region = "test") const {
    return kind == Kind::kIommufd ? gm_shim_dma_iommufd(region, stand_in, FakeIommufd::kDevId, hwpt, kIova)
                                  : gm_shim_dma_logging(region, stand_in, kIova);
  }
  // What the IOMMU (or the device's log) sees of a DMA write at `off`.
  void Saw(uint64_t off, uint64_t len) {
    if (iommu) iommu->DmaWrite(kIova + off, len);
    if (log) log->DmaWrite(kIova + off, len);
  }
};

// A device writing the region by DMA: through the memfd, not the mapping the
// engine's page-table trackers could see, bracketed by gm_shim_enter/leave so
// the switchover pauses it.
class DmaWriter {
 public:
  DmaWriter(InProcessWorkload& w, Hardware& hw) : w_(w), hw_(hw) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", reinterpret_cast<unsigned long>(w.mem()),
                  reinterpret_cast<unsigned long>(w.mem() + w.size()));
    fd_ = open(path, O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd_, 0) << path;
  }
  ~DmaWriter() {
    Stop();
    if (fd_ >= 0) close(fd_);
  }
  // One write of 8 bytes at `off`, then the IOMMU's record of it.
  void Write(uint64_t off, uint64_t value) {
    ASSERT_EQ(pwrite(fd_, &value, sizeof value, static_cast<off_t>(off)), static_cast<ssize_t>(sizeof value));
    hw_.Saw(off, sizeof value);
  }
  void Start() {
    thread_ = std::thread([this] {
      std::mt19937_64 rng(77);
      while (!stop_.load()) {
        if (gm_shim_enter() != 0) return;
        for (int k = 0; k < 8; ++k) Write((rng() % (w_.size() / 8)) * 8, ++writes_);
        gm_shim_leave();
        if (rng() % 8 == 0) std::this_thread::yield();
      }
    });
  }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint64_t writes() const { return writes_.load(); }

 private:
  InProcessWorkload& w_;
  Hardware& hw_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> writes_{0};
  std::thread thread_;
};

Result<std::unique_ptr<ProcDevice>> Connect(Hardware& hw, ProcTracking tracking = ProcTracking::kAuto) {
  return ProcDevice::Connect(ProcSpec{getpid(), tracking, 0}, ProcRole::kSource, std::chrono::seconds(10),
                             &hw.kernel);
}

class ProcDmaTracking : public ::testing::TestWithParam<Kind> {};

std::string KindName(const ::testing::TestParamInfo<Kind>& i) {
  return i.param == Kind::kIommufd ? "iommufd" : "dma_logging";
}

// The proc trackers' standard: a copy kept up to date from the reported pages
// equals the memory; quiet memory reports nothing; known DMA writes report
// exactly their pages; and a write the hardware did not see is not reported
// (so it is the hardware's record being read, not hashing).
TEST_P(ProcDmaTracking, ACopyUpdatedFromTheHardwaresDirtyBitsEqualsMemory) {
  Hardware hw(GetParam());
  InProcessWorkload w(MemKind::kMemfd, kSize, GM_SHIM_DMA_WRITTEN);
  ASSERT_TRUE(w.ok()) << gm_shim_last_error();
  ASSERT_EQ(hw.Declare(), 0) << gm_shim_last_error();
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  auto dev = Connect(hw);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  const bool iommu = GetParam() == Kind::kIommufd;
  EXPECT_EQ((*dev)->TrackerName(), iommu ? "iommufd" : "dma-logging") << (*dev)->TrackerReason();
  EXPECT_NE((*dev)->TrackerReason().find(iommu ? "'test' tracked by the IOMMU's dirty bits (iommufd HWPT"
                                               : "'test' tracked by the device's DMA log"),
            std::string::npos)
      << (*dev)->TrackerReason();
  EXPECT_EQ(hw.kernel.OpenFds(), 1u) << "the declared descriptor, adopted once";

  DirtyTracker* t = (*dev)->Tracker();
  const RegionInfo r = (*dev)->Regions()[0];
  ASSERT_TRUE(t->Start().ok());
  ShadowCopy copy(**dev);
  DmaWriter dma(w, hw);
  dma.Start();
  uint64_t reported = 0;
  // At least 20 syncs, and on until the device wrote enough to prove something
  // (bounded: 1000 syncs).
  for (int i = 0; i < 20 || (dma.writes() <= 2000 && i < 1000); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    reported += copy.SyncAndCopy(*t);
  }
  dma.Stop();
  copy.SyncAndCopy(*t);
  uint64_t first = 0;
  const uint64_t bad = copy.Differing(w.mem(), &first);
  EXPECT_EQ(bad, 0u) << bad << " pages written by DMA were never reported; first: page " << first;
  EXPECT_GT(dma.writes(), 1000u) << "the device hardly wrote: the check proves little";
  EXPECT_GT(reported, 0u);

  DirtyBitmap quiet(r.pages());
  ASSERT_TRUE(t->Sync(0, quiet).ok());
  EXPECT_EQ(quiet.Count(), 0u);
  const uint64_t pages[] = {1, 100, r.pages() - 1};
  for (uint64_t p : pages) dma.Write(p * 4096 + 16, 0xfeed);
  w.mem()[7 * 4096] = std::byte{0x11};  // unseen by the IOMMU: not reported (hashing would report it)
  DirtyBitmap three(r.pages());
  ASSERT_TRUE(t->Sync(0, three).ok());
  EXPECT_EQ(three.Count(), 3u);
  for (uint64_t p : pages) EXPECT_TRUE(three.Test(p)) << "page " << p;
  EXPECT_TRUE(t->Stop().ok());
  dev->reset();
  EXPECT_EQ(hw.kernel.OpenFds(), 0u) << "the adopted descriptor closed with the device";
}

// A whole migration while the device writes by DMA: the destination equals
// the source page for page once both are stopped.
TEST_P(ProcDmaTracking, AMigrationWhileTheDeviceWritesArrivesWhole) {
  Hardware hw(GetParam());
  InProcessWorkload w(MemKind::kMemfd, kSize, GM_SHIM_DMA_WRITTEN);
  ASSERT_TRUE(w.ok()) << gm_shim_last_error();
  ASSERT_EQ(hw.Declare(), 0) << gm_shim_last_error();
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  DmaWriter dma(w, hw);
  dma.Start();
  auto src = Connect(hw);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  FakeDevice dst((*src)->Regions(), DeviceState::kStop);
  LocalMigrationOptions o;
  o.data_streams = 2;
  o.source.max_rounds = 4;
  o.source.switch_when_not_converging = true;
  o.source.scrub = false;  // the source is compared with the destination afterwards
  uint64_t at_start = 0, at_stop = 0;
  o.source.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundStart && round == 0) {
      // Tracking is armed: the device is given its writes here, bounded, since on
      // two loaded cores its thread may not run during a short round.
      at_start = dma.writes();
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (dma.writes() < at_start + 500 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    if (p == Phase::kSwitchover) at_stop = dma.writes();
  };
  auto res = MigrateLocally(**src, dst, o);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_TRUE(res.source.verified);
  EXPECT_GT(at_stop, at_start + 100) << "the device hardly wrote during pre-copy";
  const auto& got = dst.memory(0);
  uint64_t bad = 0, first = 0;
  for (uint64_t p = 0; p < w.size() / 4096; ++p) {
    if (std::memcmp(got.data() + p * 4096, w.mem() + p * 4096, 4096) != 0 && bad++ == 0) first = p;
  }
  EXPECT_EQ(bad, 0u) << "first differing page " << first;
  ASSERT_TRUE((*src)->Release().ok());
}

INSTANTIATE_TEST_SUITE_P(BothTrackers, ProcDmaTracking, ::testing::Values(Kind::kIommufd, Kind::kDmaLogging),
                         KindName);

TEST(ProcDmaFallback, AnIommuWithoutDirtyBitsFallsBackToHashingAndSaysWhy) {
  Hardware hw(Kind::kIommufd, /*dirty_capable=*/false);
  InProcessWorkload w(MemKind::kMemfd, 1u << 20, GM_SHIM_DMA_WRITTEN);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(hw.Declare(), 0) << gm_shim_last_error();
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  auto dev = Connect(hw);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ((*dev)->TrackerName(), "hash");
  EXPECT_NE((*dev)->TrackerReason().find("'test' hashed: the IOMMU's dirty bits are unusable"), std::string::npos)
      << (*dev)->TrackerReason();
  EXPECT_NE((*dev)->TrackerReason().find("IOMMU_HW_CAP_DIRTY_TRACKING"), std::string::npos)
      << (*dev)->TrackerReason();
}

TEST(ProcDmaFallback, TrackerHashIgnoresTheDeclaration) {
  Hardware hw(Kind::kIommufd);
  InProcessWorkload w(MemKind::kMemfd, 1u << 20, GM_SHIM_DMA_WRITTEN);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(hw.Declare(), 0) << gm_shim_last_error();
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  auto dev = Connect(hw, ProcTracking::kHash);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ((*dev)->TrackerName(), "hash");
  EXPECT_EQ(hw.kernel.OpenFds(), 0u) << "nothing adopted when hashing is forced";
}

TEST(ProcDmaFallback, AnUndeclaredDmaRegionIsHashedAndTheReasonSaysHowToDeclareIt) {
  Hardware hw(Kind::kIommufd);
  InProcessWorkload w(MemKind::kMemfd, 1u << 20, GM_SHIM_DMA_WRITTEN);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  auto dev = Connect(hw);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ((*dev)->TrackerName(), "hash");
  EXPECT_NE((*dev)->TrackerReason().find("gm_shim_dma_iommufd"), std::string::npos) << (*dev)->TrackerReason();
}

TEST(ProcDmaDeclaration, BadDeclarationsAreRefusedByName) {
  Hardware hw(Kind::kIommufd);
  InProcessWorkload w(MemKind::kMemfd, 1u << 20, GM_SHIM_DMA_WRITTEN);
  ASSERT_TRUE(w.ok());
  ASSERT_NE(gm_shim_alloc("plain", 1u << 20, GM_SHIM_HINT_DYNAMIC, 0), nullptr);
  EXPECT_EQ(gm_shim_dma_iommufd("nope", hw.stand_in, 1, 2, kIova), -ENOENT);
  EXPECT_NE(std::string(gm_shim_last_error()).find("no region named 'nope'"), std::string::npos);
  EXPECT_EQ(gm_shim_dma_iommufd("plain", hw.stand_in, 1, 2, kIova), -EINVAL);
  EXPECT_NE(std::string(gm_shim_last_error()).find("not a host region flagged GM_SHIM_DMA_WRITTEN"),
            std::string::npos);
  EXPECT_EQ(gm_shim_dma_iommufd("test", 987654, 1, 2, kIova), -EBADF);
  EXPECT_EQ(gm_shim_dma_iommufd("test", hw.stand_in, 1, 2, kIova + 1), -EINVAL);
  ASSERT_EQ(hw.Declare(), 0) << gm_shim_last_error();
  EXPECT_EQ(hw.Declare(), -EEXIST);
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  EXPECT_EQ(gm_shim_dma_logging("test", hw.stand_in, kIova), -EBUSY);
}

}  // namespace
}  // namespace gpumigrate::testing
