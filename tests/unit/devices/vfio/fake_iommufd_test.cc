// The fake iommufd's rules (fake_iommufd.h's table), straight through the
// kernel seam: what the IOMMU tracker's tests rely on it to refuse.
#include "tests/support/vfio/fake_iommufd.h"

#include <cerrno>

#include <gtest/gtest.h>

#include "engine/devices/vfio/iommufd_compat.h"

namespace gpumigrate::vfio::fake {
namespace {

constexpr uint64_t kBase = 0x40000000;  // 1 GiB

class FakeIommufdTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(true); }
  void Open(bool capable) {
    iommu_ = std::make_shared<FakeIommufd>(capable);
    fd_ = k_.Install(iommu_);
    ASSERT_EQ(IoasAlloc(k_, fd_, &ioas_), 0);
  }
  int Map(uint64_t iova, uint64_t len) { return IoasMapFixed(k_, fd_, ioas_, iova, len); }
  int Alloc(uint32_t flags, uint32_t* id) {
    iommu_hwpt_alloc a{};
    a.size = sizeof a;
    a.flags = flags;
    a.dev_id = FakeIommufd::kDevId;
    a.pt_id = ioas_;
    int rc = k_.Ioctl(fd_, IOMMU_HWPT_ALLOC, &a);
    *id = a.out_hwpt_id;
    return rc;
  }
  int Track(uint32_t hwpt, bool on) {
    iommu_hwpt_set_dirty_tracking s{};
    s.size = sizeof s;
    s.flags = on ? IOMMU_HWPT_DIRTY_TRACKING_ENABLE : 0;
    s.hwpt_id = hwpt;
    return k_.Ioctl(fd_, IOMMU_HWPT_SET_DIRTY_TRACKING, &s);
  }
  int Get(uint32_t hwpt, uint64_t iova, uint64_t len, uint64_t page, uint64_t* data, uint32_t flags = 0) {
    iommu_hwpt_get_dirty_bitmap g{};
    g.size = sizeof g;
    g.hwpt_id = hwpt;
    g.flags = flags;
    g.iova = iova;
    g.length = len;
    g.page_size = page;
    g.data = reinterpret_cast<uint64_t>(data);
    return k_.Ioctl(fd_, IOMMU_HWPT_GET_DIRTY_BITMAP, &g);
  }
  // A dirty-tracking HWPT over [kBase, kBase + 64 MiB), attached, tracking on.
  uint32_t Tracking() {
    uint32_t h = 0;
    EXPECT_EQ(Map(kBase, 64 << 20), 0);
    EXPECT_EQ(Alloc(IOMMU_HWPT_ALLOC_DIRTY_TRACKING, &h), 0);
    EXPECT_EQ(iommu_->AttachDevice(h), 0);
    EXPECT_EQ(Track(h, true), 0);
    return h;
  }

  FakeKernel k_;
  std::shared_ptr<FakeIommufd> iommu_;
  int fd_ = -1;
  uint32_t ioas_ = 0;
};

TEST_F(FakeIommufdTest, HwInfoReportsTheDirtyCapabilityOnlyWhenTheIommuHasIt) {
  for (bool capable : {true, false}) {
    Open(capable);
    iommu_hw_info i{};
    i.size = sizeof i;
    i.dev_id = FakeIommufd::kDevId;
    ASSERT_EQ(k_.Ioctl(fd_, IOMMU_GET_HW_INFO, &i), 0);
    EXPECT_EQ((i.out_capabilities & IOMMU_HW_CAP_DIRTY_TRACKING) != 0, capable);
    i.dev_id = 99;
    EXPECT_EQ(k_.Ioctl(fd_, IOMMU_GET_HW_INFO, &i), -ENOENT);
    i.dev_id = FakeIommufd::kDevId;
    i.size = 8;  // shorter than the 6.7 struct's required part
    EXPECT_EQ(k_.Ioctl(fd_, IOMMU_GET_HW_INFO, &i), -EINVAL);
  }
  EXPECT_EQ(k_.Ioctl(fd_, IOMMU_IOAS_ALLOC - 1, nullptr), -ENOTTY);
}

TEST_F(FakeIommufdTest, DirtyTrackingHwptIsRefusedWithoutTheCapability) {
  Open(false);
  ASSERT_EQ(Map(kBase, 1 << 20), 0);
  uint32_t h = 0;
  EXPECT_EQ(Alloc(IOMMU_HWPT_ALLOC_DIRTY_TRACKING, &h), -EOPNOTSUPP);
  EXPECT_EQ(Alloc(1u << 7, &h), -EOPNOTSUPP);
  ASSERT_EQ(Alloc(0, &h), 0);
  EXPECT_EQ(Track(h, true), -EOPNOTSUPP) << "a HWPT without dirty ops cannot track";
  uint64_t bits[1] = {};
  EXPECT_EQ(Get(h, kBase, 1 << 20, 4096, bits), -EOPNOTSUPP);
}

TEST_F(FakeIommufdTest, MapsMustBeAlignedAndDisjoint) {
  EXPECT_EQ(Map(kBase + 100, 4096), -EINVAL);
  EXPECT_EQ(Map(kBase, 4095), -EINVAL);
  ASSERT_EQ(Map(kBase, 1 << 20), 0);
  EXPECT_EQ(Map(kBase + (1 << 19), 1 << 20), -EEXIST);
  EXPECT_EQ(Map(kBase - 4096, 8192), -EEXIST);
  EXPECT_EQ(Map(kBase + (1 << 20), 4096), 0);
}

TEST_F(FakeIommufdTest, BitmapNeedsTrackingOnAndAlignedMappedRanges) {
  uint32_t h = Tracking();
  uint64_t bits[256] = {};
  EXPECT_EQ(Get(h, kBase, 1 << 20, 3 * 4096, bits), -EINVAL) << "not a power of two";
  EXPECT_EQ(Get(h, kBase, 1 << 20, 2048, bits), -EINVAL) << "below the IOMMU page";
  EXPECT_EQ(Get(h, kBase + 4096, 1 << 20, 1 << 21, bits), -EINVAL) << "iova not aligned to page_size";
  EXPECT_EQ(Get(h, kBase, (1 << 20) + 4096, 1 << 20, bits), -EINVAL) << "length not aligned to page_size";
  EXPECT_EQ(Get(h, kBase, 0, 4096, bits), -EINVAL);
  EXPECT_EQ(Get(h, kBase - 4096, 8192, 4096, bits), -EINVAL) << "partly unmapped";
  EXPECT_EQ(Get(h, kBase, 4096, 4096, bits, 2), -EOPNOTSUPP) << "unknown flag";
  EXPECT_EQ(Get(h + 100, kBase, 4096, 4096, bits), -ENOENT);
  EXPECT_EQ(Get(h, kBase, 1 << 20, 4096, bits), 0);
  ASSERT_EQ(Track(h, false), 0);
  EXPECT_EQ(Get(h, kBase, 1 << 20, 4096, bits), -EINVAL) << "tracking is off";
}

TEST_F(FakeIommufdTest, BitmapIsRelativeToTheRequestedIovaAndClearsUnlessNoClear) {
  uint32_t h = Tracking();
  EXPECT_EQ(iommu_->DmaWrite(kBase + 70 * 4096 + 5, 10), 0u);
  uint64_t bits[2] = {};
  // From page 67: page 70 is bit 3, not bit 70 % 64 = 6.
  ASSERT_EQ(Get(h, kBase + 67 * 4096, 128 * 4096, 4096, bits, IOMMU_HWPT_GET_DIRTY_BITMAP_NO_CLEAR), 0);
  EXPECT_EQ(bits[0], uint64_t{1} << 3);
  EXPECT_EQ(bits[1], 0u);
  bits[0] = 0;
  ASSERT_EQ(Get(h, kBase, 1 << 20, 1 << 20, bits), 0) << "still there after NO_CLEAR";
  EXPECT_EQ(bits[0], 1u);
  bits[0] = 0;
  ASSERT_EQ(Get(h, kBase, 1 << 20, 4096, bits), 0);
  EXPECT_EQ(bits[0], 0u) << "the read before cleared it";
  bits[0] = uint64_t{1} << 9;
  ASSERT_EQ(Get(h, kBase, 1 << 20, 4096, bits), 0);
  EXPECT_EQ(bits[0], uint64_t{1} << 9) << "the kernel only sets bits in the user's bitmap";
}

TEST_F(FakeIommufdTest, DmaToUnmappedIovaFaultsAndWritesBeforeTrackingAreNotLogged) {
  uint32_t h = Tracking();
  ASSERT_EQ(Track(h, false), 0);
  EXPECT_EQ(iommu_->DmaWrite(kBase, 4096), 0u);  // mapped, tracking off: nothing logged
  ASSERT_EQ(Track(h, true), 0);
  EXPECT_EQ(iommu_->DmaWrite(kBase - 8192, 3 * 4096), 2u) << "two unmapped pages fault";
  uint64_t bits[1] = {};
  ASSERT_EQ(Get(h, kBase, 64 * 4096, 4096, bits), 0);
  EXPECT_EQ(bits[0], 1u) << "only the mapped page of the faulting write";
  EXPECT_EQ(iommu_->faults(), 2u);
}

TEST_F(FakeIommufdTest, AZeroLengthWriteTouchesNoPage) {
  // At IOVA 0 the last byte of an empty write would underflow; at an unaligned
  // IOVA it would name a page that nothing wrote.
  uint32_t h = Tracking();
  EXPECT_EQ(iommu_->DmaWrite(0, 0), 0u);
  EXPECT_EQ(iommu_->DmaWrite(kBase + 5, 0), 0u);
  uint64_t bits[1] = {};
  ASSERT_EQ(Get(h, kBase, 64 * 4096, 4096, bits), 0);
  EXPECT_EQ(bits[0], 0u);
  EXPECT_EQ(iommu_->faults(), 0u);
}

TEST_F(FakeIommufdTest, EnablingTrackingStartsClean) {
  uint32_t h = Tracking();
  EXPECT_EQ(iommu_->DmaWrite(kBase, 4096), 0u);
  ASSERT_EQ(Track(h, true), 0);
  uint64_t bits[1] = {};
  ASSERT_EQ(Get(h, kBase, 64 * 4096, 4096, bits), 0);
  EXPECT_EQ(bits[0], 0u);
}

}  // namespace
}  // namespace gpumigrate::vfio::fake
