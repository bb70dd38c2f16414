// The two IOMMU trackers (iommufd, dma-logging) against the fakes, held to the
// proc trackers' standard: with DMA writers running on several threads, the
// pages reported over many syncs are exactly the pages written (none missed,
// none invented), quiet memory reports nothing, known writes report exactly
// their pages; at IOVAs not aligned to 64 pages, engine pages up to 1 GiB,
// regions bigger than one kernel call's bitmap, and every refusal path.
#include <linux/vfio.h>

#include <atomic>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "engine/devices/vfio/iommufd_compat.h"
#include "gpumigrate/devices/iommu_tracking.h"
#include "tests/support/vfio/fake_dma_logging.h"
#include "tests/support/vfio/fake_iommufd.h"
#include "tests/support/vfio/vfio_test_util.h"

namespace gpumigrate::vfio::fake {
namespace {

constexpr uint64_t KiB = 1024, MiB = KiB * KiB, GiB = MiB * KiB;

// A tracker under test with the fake that feeds it.
class Rig {
 public:
  virtual ~Rig() = default;
  virtual Result<std::unique_ptr<DirtyTracker>> Make(std::vector<IovaRegion> regions) = 0;
  virtual void Dma(uint64_t iova, uint64_t len) = 0;
  FakeKernel k;
};

// An IOAS with `maps` mapped, a dirty-tracking HWPT the device is attached to.
class IommufdRig : public Rig {
 public:
  explicit IommufdRig(const std::vector<IovaRegion>& maps, bool capable = true) {
    iommu = std::make_shared<FakeIommufd>(capable);
    fd = k.Install(iommu);
    EXPECT_EQ(IoasAlloc(k, fd, &ioas), 0);
    for (const auto& m : maps) EXPECT_EQ(IoasMapFixed(k, fd, ioas, m.iova, m.size), 0);
    if (!capable) return;
    auto h = AllocDirtyTrackingHwpt(k, fd, FakeIommufd::kDevId, ioas);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    hwpt = h.ok() ? *h : 0;
    EXPECT_EQ(iommu->AttachDevice(hwpt), 0);
  }
  Result<std::unique_ptr<DirtyTracker>> Make(std::vector<IovaRegion> regions) override {
    return MakeIommufdTracker(k, IommufdTarget{fd, FakeIommufd::kDevId, hwpt}, std::move(regions));
  }
  void Dma(uint64_t iova, uint64_t len) override { iommu->DmaWrite(iova, len); }

  std::shared_ptr<FakeIommufd> iommu;
  int fd = -1;
  uint32_t ioas = 0, hwpt = 0;
};

class DmaLoggingRig : public Rig {
 public:
  explicit DmaLoggingRig(uint64_t min_page = 4 * KiB)
      : log(std::make_shared<FakeDmaLogging>(min_page)), fd(k.Install(std::make_shared<FakeDmaLoggingFile>(log))) {}
  Result<std::unique_ptr<DirtyTracker>> Make(std::vector<IovaRegion> regions) override {
    return MakeDmaLoggingTracker(k, fd, std::move(regions));
  }
  void Dma(uint64_t iova, uint64_t len) override { log->DmaWrite(iova, len); }

  std::shared_ptr<FakeDmaLogging> log;
  int fd;
};

// The same DMA log behind the fake VFIO device's own fd (bound to an iommufd,
// as a cdev must be), as the tracker meets it on a real device.
struct DmaLoggingVfioRig : Rig {
  DmaLoggingVfioRig() : log(std::make_shared<FakeDmaLogging>()), host(Config(log)) {
    fd = host.kernel.Open(host.path.c_str(), 0);
    iommufd = Bind(host.kernel, fd);
  }
  static FakeVfioConfig Config(std::shared_ptr<FakeDmaLogging> l) {
    FakeVfioConfig cfg;
    cfg.dma_log = std::move(l);
    return cfg;
  }
  Result<std::unique_ptr<DirtyTracker>> Make(std::vector<IovaRegion> regions) override {
    if (fd < 0 || iommufd < 0) return Internal("the fake VFIO device did not open and bind");
    return MakeDmaLoggingTracker(host.kernel, fd, std::move(regions));
  }
  void Dma(uint64_t iova, uint64_t len) override { log->DmaWrite(iova, len); }

  std::shared_ptr<FakeDmaLogging> log;
  FakeHost host;
  int fd = -1, iommufd = -1;
};

enum class Kind { kIommufd, kDmaLogging, kDmaLoggingVfioDevice };

std::unique_ptr<Rig> MakeRig(Kind kind, const std::vector<IovaRegion>& regions) {
  if (kind == Kind::kIommufd) return std::make_unique<IommufdRig>(regions);
  if (kind == Kind::kDmaLoggingVfioDevice) return std::make_unique<DmaLoggingVfioRig>();
  return std::make_unique<DmaLoggingRig>();
}

// Which engine pages of a region writers have touched: marked before the DMA
// write, so a page that a sync reports is already here (release/acquire through
// the fake's dirty bits).
class Truth {
 public:
  explicit Truth(const IovaRegion& r) : r_(r), pages_(std::make_unique<std::atomic<bool>[]>(r.pages())) {}
  void Mark(uint64_t off, uint64_t len) {
    for (uint64_t p = off / r_.page_size; p <= (off + len - 1) / r_.page_size; ++p) {
      pages_[p].store(true, std::memory_order_release);
    }
  }
  bool Test(uint64_t p) const { return pages_[p].load(std::memory_order_acquire); }

 private:
  IovaRegion r_;
  std::unique_ptr<std::atomic<bool>[]> pages_;
};

// Regions that exercise the bitmap geometry: aligned; an IOVA 3 pages past a
// 64-page boundary with an odd page count; 2 MiB engine pages; and 64 KiB
// engine pages at an IOVA aligned only to 16 KiB (four hardware pages each).
std::vector<IovaRegion> MixedRegions() {
  return {{0, 0x10000000, 1 * MiB, 4 * KiB},
          {1, 0x20003000, 125 * 4 * KiB, 4 * KiB},
          {2, 0x40200000, 8 * MiB, 2 * MiB},
          {3, 0x50004000, 40 * 64 * KiB, 64 * KiB}};
}

class IommuTrackerTest : public ::testing::TestWithParam<Kind> {};

std::string KindName(const ::testing::TestParamInfo<Kind>& i) {
  return i.param == Kind::kIommufd ? "iommufd" : i.param == Kind::kDmaLogging ? "dma_logging" : "dma_logging_vfio_device";
}

TEST_P(IommuTrackerTest, ReportedPagesAreExactlyThePagesWrittenByConcurrentDma) {
  const auto regions = MixedRegions();
  auto rig = MakeRig(GetParam(), regions);
  auto t = rig->Make(regions);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::vector<std::unique_ptr<Truth>> truth;
  std::vector<DirtyBitmap> seen;
  for (const auto& r : regions) {
    truth.push_back(std::make_unique<Truth>(r));
    seen.emplace_back(r.pages());
  }
  ASSERT_TRUE((*t)->Start().ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 3; ++w) {
    writers.emplace_back([&, w] {
      std::mt19937_64 rng(w + 1);
      while (!stop.load(std::memory_order_relaxed)) {
        const IovaRegion& r = regions[rng() % regions.size()];
        const uint64_t off = rng() % r.size;
        const uint64_t len = std::min<uint64_t>(1 + rng() % (3 * 4 * KiB), r.size - off);
        // The truth first: a page the tracker reports must already be in it.
        truth[r.id]->Mark(off, len);
        rig->Dma(r.iova + off, len);
        if (rng() % 8 == 0) rig->Dma(0x30000000 + (rng() % 64) * 4 * KiB, 4 * KiB);  // unmapped, untracked
        writes.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  uint64_t invented = 0;
  auto sync_all = [&] {
    for (const auto& r : regions) {
      DirtyBitmap bm(r.pages());
      ASSERT_TRUE((*t)->Sync(r.id, bm).ok());
      for (uint64_t p = bm.NextSet(0); p < bm.pages(); p = bm.NextSet(p + 1)) invented += !truth[r.id]->Test(p);
      seen[r.id].OrWith(bm);
    }
  };
  // At least 200 rounds, and on until the writers have done 20000 writes (on two
  // shared cores they may start late).
  int rounds = 0;
  for (; (rounds < 200 || writes.load() < 20000) && rounds < 1000000 && !HasFatalFailure(); ++rounds) {
    sync_all();
    std::this_thread::yield();
  }
  stop = true;
  for (auto& th : writers) th.join();
  sync_all();
  EXPECT_EQ(invented, 0u) << "pages reported that no writer had touched";
  for (const auto& r : regions) {
    uint64_t missed = 0, extra = 0;
    for (uint64_t p = 0; p < r.pages(); ++p) {
      missed += truth[r.id]->Test(p) && !seen[r.id].Test(p);
      extra += !truth[r.id]->Test(p) && seen[r.id].Test(p);
    }
    EXPECT_EQ(missed, 0u) << "region " << r.id << ": written pages never reported";
    EXPECT_EQ(extra, 0u) << "region " << r.id << ": reported pages never written";
  }
  EXPECT_GE(writes.load(), 20000u) << "the writers hardly ran (" << rounds << " rounds): the check proves little";
  // Quiet memory reports nothing.
  for (const auto& r : regions) {
    DirtyBitmap quiet(r.pages());
    ASSERT_TRUE((*t)->Sync(r.id, quiet).ok());
    EXPECT_EQ(quiet.Count(), 0u) << "region " << r.id;
  }
  EXPECT_TRUE((*t)->Stop().ok());
}

// Each page written exactly once, three writers interleaved page by page (so
// they share every 64-page word while the reader clears it): a write lost to a
// racing clear could not hide behind a later write to the same page. Every page
// must be reported exactly once (read-and-clear: never twice).
TEST_P(IommuTrackerTest, PagesWrittenOnceAreEachReportedExactlyOnce) {
  const IovaRegion r{0, 0x100003000, 1 * GiB, 4 * KiB};
  auto rig = MakeRig(GetParam(), {r});
  auto t = rig->Make({r});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Start().ok());
  constexpr uint64_t kWriters = 3;
  std::atomic<uint64_t> done{0}, syncs{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> writers;
  for (uint64_t w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      for (uint64_t p = w; p < r.pages(); p += kWriters) {
        rig->Dma(r.iova + p * r.page_size + 8, 8);
        // Every 3072 pages, wait for the reader's next sync: on two shared cores
        // the writers could otherwise finish before the reader ran at all.
        if (p % 3072 == w) {
          for (uint64_t s0 = syncs.load(); syncs.load() == s0 && !failed.load();) std::this_thread::yield();
        }
      }
      done.fetch_add(1);
    });
  }
  std::vector<uint8_t> times(r.pages(), 0);
  uint64_t busy = 0;
  auto sync = [&] {
    DirtyBitmap bm(r.pages());
    ASSERT_TRUE((*t)->Sync(0, bm).ok());
    syncs.fetch_add(1);
    busy += bm.Any() ? 1 : 0;
    for (uint64_t p = bm.NextSet(0); p < bm.pages(); p = bm.NextSet(p + 1)) times[p] = static_cast<uint8_t>(std::min(times[p] + 1, 9));
  };
  while (done.load() < kWriters) {
    sync();
    if (HasFatalFailure()) failed = true;  // the writers stop waiting for syncs
  }
  for (auto& th : writers) th.join();
  sync();
  uint64_t missed = 0, twice = 0;
  for (uint64_t p = 0; p < r.pages(); ++p) {
    missed += times[p] == 0;
    twice += times[p] > 1;
  }
  EXPECT_EQ(missed, 0u) << "pages written once and never reported (" << syncs.load() << " syncs)";
  EXPECT_EQ(twice, 0u) << "pages written once and reported more than once";
  EXPECT_GT(busy, 50u) << "the reader hardly overlapped the writers: the check proves little";
  EXPECT_TRUE((*t)->Stop().ok());
}

// Writes the given offsets of one region (quietly otherwise) and expects
// exactly the given engine pages at the next sync.
void ExpectExactly(Rig& rig, DirtyTracker& t, const IovaRegion& r, const std::vector<uint64_t>& offsets,
                   const std::vector<uint64_t>& pages) {
  for (uint64_t off : offsets) rig.Dma(r.iova + off, 1);
  DirtyBitmap bm(r.pages());
  ASSERT_TRUE(t.Sync(r.id, bm).ok());
  EXPECT_EQ(bm.Count(), pages.size()) << "region " << r.id;
  for (uint64_t p : pages) EXPECT_TRUE(bm.Test(p)) << "region " << r.id << " page " << p;
}

TEST_P(IommuTrackerTest, KnownWritesReportExactlyTheirPagesAtUnalignedIovas) {
  const auto regions = MixedRegions();
  auto rig = MakeRig(GetParam(), regions);
  auto t = rig->Make(regions);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Start().ok());
  ExpectExactly(*rig, **t, regions[0], {0, 100 * 4 * KiB, 1 * MiB - 1}, {0, 100, 255});
  // Region 1 starts 3 pages past a 64-page boundary: page 61 is the first of a
  // new 64-page word in IOVA terms, bit 61 relative to the region.
  ExpectExactly(*rig, **t, regions[1], {0, 61 * 4 * KiB, 124 * 4 * KiB + 4095}, {0, 61, 124});
  ExpectExactly(*rig, **t, regions[2], {2 * MiB + 5, 8 * MiB - 1}, {1, 3});
  ExpectExactly(*rig, **t, regions[3], {64 * KiB - 1, 64 * KiB, 39 * 64 * KiB}, {0, 1, 39});
  EXPECT_TRUE((*t)->Stop().ok());
}

TEST_P(IommuTrackerTest, GigabytePagesAndRegionsLargerThanOneKernelCall) {
  // 1 GiB engine pages on a 1 GiB-aligned IOVA (one hardware page each); 1 GiB
  // engine pages on an IOVA aligned only to 2 MiB (512 hardware pages each); and
  // 8 GiB + 64 KiB of 4 KiB pages: more than one call's 2^21-page bitmap; and
  // 8 GiB + 4 KiB of 64 KiB pages read at 4 KiB: a second call whose hardware
  // pages fold 16 to an engine page.
  const std::vector<IovaRegion> regions = {{0, 4 * GiB, 4 * GiB, 1 * GiB},
                                           {1, 10 * GiB + 2 * MiB, 2 * GiB + 4 * KiB, 1 * GiB},
                                           {2, 64 * GiB, 8 * GiB + 64 * KiB, 4 * KiB},
                                           {3, 128 * GiB, 8 * GiB + 4 * KiB, 64 * KiB}};
  auto rig = MakeRig(GetParam(), regions);
  auto t = rig->Make(regions);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE((*t)->Start().ok());
  ExpectExactly(*rig, **t, regions[0], {2 * GiB + 12345}, {2});
  ExpectExactly(*rig, **t, regions[0], {0, 4 * GiB - 1}, {0, 3});
  ExpectExactly(*rig, **t, regions[1], {1 * GiB - 1, 2 * GiB}, {0, 2});
  const uint64_t chunk = uint64_t{1} << 21;
  ExpectExactly(*rig, **t, regions[2], {(chunk - 1) * 4 * KiB, chunk * 4 * KiB, 8 * GiB + 60 * KiB},
                {chunk - 1, chunk, chunk + 15});
  ExpectExactly(*rig, **t, regions[3], {8 * GiB - 1, 8 * GiB, 100 * 64 * KiB}, {131071, 131072, 100});
  EXPECT_TRUE((*t)->Stop().ok());
}

TEST_P(IommuTrackerTest, RefusesMisalignedRegionsAndSyncOutsideItsLife) {
  auto rig = MakeRig(GetParam(), MixedRegions());
  for (IovaRegion bad : {IovaRegion{0, 0x10000000 + 512, 4 * KiB, 4 * KiB}, IovaRegion{0, 0x10000000, 100, 4 * KiB},
                         IovaRegion{0, 0x10000000, 8 * KiB, 6 * KiB}}) {
    auto t = rig->Make({bad});
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("4 KiB"), std::string::npos) << t.status().ToString();
  }
  auto t = rig->Make(MixedRegions());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  DirtyBitmap bm(256);
  EXPECT_EQ((*t)->Sync(0, bm).code(), StatusCode::kFailedPrecondition) << "Sync before Start";
  ASSERT_TRUE((*t)->Start().ok());
  EXPECT_EQ((*t)->Sync(9, bm).code(), StatusCode::kInvalidArgument) << "unknown region";
  DirtyBitmap wrong(255);
  EXPECT_EQ((*t)->Sync(0, wrong).code(), StatusCode::kInvalidArgument) << "bitmap of the wrong size";
  EXPECT_TRUE((*t)->Stop().ok());
  EXPECT_EQ((*t)->Sync(0, bm).code(), StatusCode::kFailedPrecondition) << "Sync after Stop";
}

INSTANTIATE_TEST_SUITE_P(Both, IommuTrackerTest, ::testing::Values(Kind::kIommufd, Kind::kDmaLogging, Kind::kDmaLoggingVfioDevice),
                         KindName);

// Refusals that belong to one uAPI each; every kernel error names its ioctl and errno.
TEST(IommufdTracker, SaysWhyWhenTheIommuHasNoDirtyBits) {
  const auto regions = MixedRegions();
  IommufdRig rig(regions, /*capable=*/false);
  auto t = rig.Make(regions);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(t.status().message().find("IOMMU_HW_CAP_DIRTY_TRACKING"), std::string::npos) << t.status().ToString();
  auto h = AllocDirtyTrackingHwpt(rig.k, rig.fd, FakeIommufd::kDevId, rig.ioas);
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("IOMMU_HWPT_ALLOC"), std::string::npos) << h.status().ToString();
  EXPECT_NE(h.status().message().find("Operation not supported"), std::string::npos) << h.status().ToString();
  auto gone = MakeIommufdTracker(rig.k, IommufdTarget{rig.fd, 42, 0}, regions);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("IOMMU_GET_HW_INFO"), std::string::npos) << gone.status().ToString();
}

TEST(IommufdTracker, KernelRefusalsNameTheIoctlAndErrno) {
  const auto regions = MixedRegions();
  IommufdRig rig(regions);
  // A HWPT allocated without DIRTY_TRACKING cannot have tracking switched on.
  iommu_hwpt_alloc a{};
  a.size = sizeof a;
  a.dev_id = FakeIommufd::kDevId;
  a.pt_id = rig.ioas;
  ASSERT_EQ(rig.k.Ioctl(rig.fd, IOMMU_HWPT_ALLOC, &a), 0);
  auto plain = MakeIommufdTracker(rig.k, IommufdTarget{rig.fd, FakeIommufd::kDevId, a.out_hwpt_id}, regions);
  ASSERT_TRUE(plain.ok());
  Status s = (*plain)->Start();
  EXPECT_NE(s.message().find("IOMMU_HWPT_SET_DIRTY_TRACKING"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("Operation not supported"), std::string::npos) << s.ToString();
  // Tracking switched off behind the tracker's back: the read is refused.
  auto t = rig.Make(regions);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Start().ok());
  iommu_hwpt_set_dirty_tracking off{};
  off.size = sizeof off;
  off.hwpt_id = rig.hwpt;
  ASSERT_EQ(rig.k.Ioctl(rig.fd, IOMMU_HWPT_SET_DIRTY_TRACKING, &off), 0);
  DirtyBitmap bm(regions[0].pages());
  s = (*t)->Sync(0, bm);
  EXPECT_NE(s.message().find("IOMMU_HWPT_GET_DIRTY_BITMAP"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("Invalid argument"), std::string::npos) << s.ToString();
  // A region whose IOVA range is not (wholly) mapped.
  auto unmapped = rig.Make({IovaRegion{7, 0x30000000, 1 * MiB, 4 * KiB}});
  ASSERT_TRUE(unmapped.ok());
  ASSERT_TRUE((*unmapped)->Start().ok());
  DirtyBitmap ubm(256);
  s = (*unmapped)->Sync(7, ubm);
  EXPECT_NE(s.message().find("IOMMU_HWPT_GET_DIRTY_BITMAP"), std::string::npos) << s.ToString();
}

TEST(DmaLoggingTracker, SaysWhyWhenTheDeviceKeepsNoLog) {
  FakeKernel k;
  int fd = k.Install(std::make_shared<File>());  // answers every ioctl with ENOTTY
  auto t = MakeDmaLoggingTracker(k, fd, MixedRegions());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(t.status().message().find("DMA_LOGGING_START"), std::string::npos) << t.status().ToString();
}

TEST(DmaLoggingTracker, ASecondStartIsRefusedByTheDevice) {
  DmaLoggingRig rig;
  auto a = rig.Make(MixedRegions());
  auto b = rig.Make(MixedRegions());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Start().ok());
  Status s = (*b)->Start();
  EXPECT_NE(s.message().find("DMA_LOGGING_START"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("Device or resource busy"), std::string::npos) << s.ToString();
  EXPECT_TRUE((*a)->Stop().ok());
  EXPECT_FALSE(rig.log->started());
  // Overlapping regions make overlapping ranges, which START refuses.
  auto overlap = rig.Make({IovaRegion{0, 0x10000000, 1 * MiB, 4 * KiB}, IovaRegion{1, 0x10080000, 1 * MiB, 4 * KiB}});
  ASSERT_TRUE(overlap.ok());
  s = (*overlap)->Start();
  EXPECT_NE(s.message().find("Invalid argument"), std::string::npos) << s.ToString();
}

// A device that logs at 64 KiB though 4 KiB was asked: every write is still
// reported (with its neighbours in the same device page), none is lost.
TEST(DmaLoggingTracker, ACoarserDevicePageOverReportsButMissesNothing) {
  DmaLoggingRig rig(64 * KiB);
  const IovaRegion r{0, 0x10000000, 1 * MiB, 4 * KiB};
  auto t = rig.Make({r});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->Start().ok());
  EXPECT_EQ(rig.log->page_size(), 64 * KiB);
  rig.Dma(r.iova + 17 * 4 * KiB, 1);
  DirtyBitmap bm(r.pages());
  ASSERT_TRUE((*t)->Sync(0, bm).ok());
  EXPECT_EQ(bm.Count(), 16u);
  for (uint64_t p = 16; p < 32; ++p) EXPECT_TRUE(bm.Test(p)) << p;
  EXPECT_TRUE((*t)->Stop().ok());
}

}  // namespace
}  // namespace gpumigrate::vfio::fake
