// The fake DMA log's rules (fake_dma_logging.h's table), through the kernel
// seam and the minimal device file that answers features 6/7/8.
#include "tests/support/vfio/fake_dma_logging.h"

#include <linux/vfio.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace gpumigrate::vfio::fake {
namespace {

constexpr uint64_t kBase = 0x100000000;  // 4 GiB
using Range = vfio_device_feature_dma_logging_range;

class FakeDmaLoggingTest : public ::testing::Test {
 protected:
  void SetUp() override { fd_ = k_.Install(std::make_shared<FakeDmaLoggingFile>(log_)); }
  int Call(uint32_t flags, const void* payload, size_t len) {
    std::vector<uint64_t> buf((sizeof(vfio_device_feature) + len + 7) / 8);
    vfio_device_feature h{};
    h.argsz = static_cast<uint32_t>(sizeof h + len);
    h.flags = flags;
    std::memcpy(buf.data(), &h, sizeof h);
    if (len != 0) std::memcpy(reinterpret_cast<std::byte*>(buf.data()) + sizeof h, payload, len);
    int rc = k_.Ioctl(fd_, VFIO_DEVICE_FEATURE, buf.data());
    if (len != 0) std::memcpy(const_cast<void*>(payload), reinterpret_cast<std::byte*>(buf.data()) + sizeof h, len);
    return rc;
  }
  int Start(std::vector<Range> r, uint64_t* page) {
    vfio_device_feature_dma_logging_control c{};
    c.page_size = *page;
    c.num_ranges = static_cast<uint32_t>(r.size());
    c.ranges = reinterpret_cast<uint64_t>(r.data());
    int rc = Call(VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_START, &c, sizeof c);
    *page = c.page_size;
    return rc;
  }
  int Report(uint64_t iova, uint64_t len, uint64_t page, uint64_t* bits,
             uint32_t op = VFIO_DEVICE_FEATURE_GET) {
    vfio_device_feature_dma_logging_report r{iova, len, page, reinterpret_cast<uint64_t>(bits)};
    return Call(op | VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT, &r, sizeof r);
  }
  int Stop() { return Call(VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP, nullptr, 0); }

  FakeKernel k_;
  std::shared_ptr<FakeDmaLogging> log_ = std::make_shared<FakeDmaLogging>();
  int fd_ = -1;
};

TEST_F(FakeDmaLoggingTest, StartChecksRangesAndRefusesASecondStart) {
  uint64_t page = 4096;
  EXPECT_EQ(Start({}, &page), -EINVAL) << "no ranges";
  EXPECT_EQ(Start({{kBase + 512, 4096}}, &page), -EINVAL) << "iova not aligned to page_size";
  EXPECT_EQ(Start({{kBase, 4096 + 1}}, &page), -EINVAL) << "length not aligned to page_size";
  EXPECT_EQ(Start({{kBase, 8192}, {kBase + 4096, 4096}}, &page), -EINVAL) << "overlapping ranges";
  EXPECT_EQ(Start(std::vector<Range>(257, Range{kBase, 4096}), &page), -E2BIG);
  EXPECT_FALSE(log_->started());
  ASSERT_EQ(Start({{kBase, 1 << 20}}, &page), 0);
  EXPECT_EQ(Start({{kBase, 1 << 20}}, &page), -EBUSY);
  ASSERT_EQ(Stop(), 0);
  EXPECT_FALSE(log_->started());
  EXPECT_EQ(Stop(), 0) << "stopping an idle log is harmless";
}

TEST_F(FakeDmaLoggingTest, OperationsNeedTheRightDirection) {
  uint64_t bits[4] = {};
  uint64_t page = 4096;
  ASSERT_EQ(Start({{kBase, 1 << 20}}, &page), 0);
  EXPECT_EQ(Report(kBase, 1 << 20, 4096, bits, VFIO_DEVICE_FEATURE_SET), -EINVAL) << "REPORT is GET only";
  EXPECT_EQ(Call(VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP, nullptr, 0), -EINVAL);
  EXPECT_EQ(Call(VFIO_DEVICE_FEATURE_PROBE | VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_START,
                 nullptr, 0),
            0);
  EXPECT_EQ(Call(VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET | 2, nullptr, 0), -EINVAL);
  EXPECT_EQ(Call(VFIO_DEVICE_FEATURE_GET | 2, nullptr, 0), -ENOTTY) << "feature 2 is not this file's";
  EXPECT_TRUE(log_->started());
}

TEST_F(FakeDmaLoggingTest, ReportIsInsideAStartedRangeRelativeToItsIovaAndClears) {
  uint64_t bits[4] = {};
  EXPECT_EQ(Report(kBase, 1 << 20, 4096, bits), -EINVAL) << "not started";
  uint64_t page = 4096;
  ASSERT_EQ(Start({{kBase, 1 << 20}, {kBase + (4 << 20), 1 << 20}}, &page), 0);
  EXPECT_EQ(Report(kBase, 2 << 20, 4096, bits), -EINVAL) << "past the range";
  EXPECT_EQ(Report(kBase, 1 << 20, 6144, bits), -EINVAL) << "page size not a power of two";
  EXPECT_EQ(Report(kBase, 1 << 20, 2048, bits), -EINVAL) << "page size under 4 KiB";
  log_->DmaWrite(kBase + 70 * 4096, 1);
  log_->DmaWrite(kBase + (2 << 20), 4096);  // outside every range: not logged
  ASSERT_EQ(Report(kBase + 67 * 4096, 64 * 4096, 4096, bits), 0);
  EXPECT_EQ(bits[0], uint64_t{1} << 3);
  bits[0] = 0;
  ASSERT_EQ(Report(kBase, 1 << 20, 4096, bits), 0);
  EXPECT_EQ(bits[0] | bits[1] | bits[2] | bits[3], 0u) << "read and cleared";
}

TEST_F(FakeDmaLoggingTest, TheDriverMayRoundThePageSize) {
  log_ = std::make_shared<FakeDmaLogging>(uint64_t{64} << 10, uint64_t{64} << 10);
  fd_ = k_.Install(std::make_shared<FakeDmaLoggingFile>(log_));
  uint64_t page = 4096;
  ASSERT_EQ(Start({{kBase, 1 << 20}}, &page), 0);
  EXPECT_EQ(page, uint64_t{64} << 10) << "written back";
  log_->DmaWrite(kBase + 17 * 4096, 1);
  uint64_t bits[4] = {};
  ASSERT_EQ(Report(kBase, 1 << 20, 4096, bits), 0);
  EXPECT_EQ(bits[0], uint64_t{0xffff} << 16) << "the whole 64 KiB device page reports";
}

}  // namespace
}  // namespace gpumigrate::vfio::fake
