#include "tests/support/vfio/fake_dma_logging.h"

#include <linux/vfio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpumigrate::vfio::fake {
namespace {

constexpr uint32_t kMaxRanges = 4096 / sizeof(vfio_device_feature_dma_logging_range);  // LOG_MAX_RANGES
constexpr uint32_t kOps = VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_PROBE;

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// vfio_check_feature(): 1 to act, 0 for a probe that succeeds, or -errno.
int CheckFeature(uint32_t flags, size_t argsz, uint32_t supported, size_t minsz) {
  if ((flags & (VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET)) & ~supported) return -EINVAL;
  if (flags & VFIO_DEVICE_FEATURE_PROBE) return 0;
  if (!(flags & (VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_SET))) return -EINVAL;
  if (argsz < minsz) return -EINVAL;
  return 1;
}

}  // namespace

int FakeDmaLogging::Feature(void* arg) {
  vfio_device_feature h;
  std::memcpy(&h, arg, sizeof h);
  if (h.argsz < sizeof h) return -EINVAL;
  if ((h.flags & ~(VFIO_DEVICE_FEATURE_MASK | kOps)) != 0) return -EINVAL;
  if ((h.flags & VFIO_DEVICE_FEATURE_GET) && (h.flags & VFIO_DEVICE_FEATURE_SET) &&
      !(h.flags & VFIO_DEVICE_FEATURE_PROBE)) {
    return -EINVAL;
  }
  const size_t argsz = h.argsz - sizeof h;
  const void* payload = static_cast<const std::byte*>(arg) + sizeof h;
  int rc;
  switch (h.flags & VFIO_DEVICE_FEATURE_MASK) {
    case VFIO_DEVICE_FEATURE_DMA_LOGGING_START:
      rc = CheckFeature(h.flags, argsz, VFIO_DEVICE_FEATURE_SET, sizeof(vfio_device_feature_dma_logging_control));
      return rc == 1 ? Start(payload) : rc;
    case VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP:
      rc = CheckFeature(h.flags, argsz, VFIO_DEVICE_FEATURE_SET, 0);
      return rc == 1 ? Stop() : rc;
    case VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT:
      rc = CheckFeature(h.flags, argsz, VFIO_DEVICE_FEATURE_GET, sizeof(vfio_device_feature_dma_logging_report));
      return rc == 1 ? Report(payload) : rc;
    default: return -ENOTTY;
  }
}

int FakeDmaLogging::Start(const void* payload) {
  vfio_device_feature_dma_logging_control c;
  std::memcpy(&c, payload, sizeof c);
  if (c.num_ranges == 0) return -EINVAL;
  if (c.num_ranges > kMaxRanges) return -E2BIG;
  if (!PowerOfTwo(c.page_size)) return -EINVAL;  // IS_ALIGNED() assumes one
  std::vector<vfio_device_feature_dma_logging_range> r(c.num_ranges);
  std::memcpy(r.data(), reinterpret_cast<const void*>(c.ranges), r.size() * sizeof r[0]);
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.iova < b.iova; });
  for (size_t i = 0; i < r.size(); ++i) {
    if (((r[i].iova | r[i].length) & (c.page_size - 1)) != 0) return -EINVAL;
    if (r[i].iova + r[i].length < r[i].iova) return -EOVERFLOW;
    if (i > 0 && r[i - 1].iova + r[i - 1].length > r[i].iova) return -EINVAL;  // overlap
  }
  std::unique_lock lk(mu_);
  if (!ranges_.empty()) return -EBUSY;
  page_ = std::clamp<uint64_t>(c.page_size, min_page_, max_page_);
  for (const auto& x : r) ranges_.push_back(std::make_unique<DirtyLog>(x.iova, x.length, page_));
  c.page_size = page_;
  std::memcpy(const_cast<void*>(payload), &c, sizeof c);  // written back, as copy_to_user does
  return 0;
}

int FakeDmaLogging::Report(const void* payload) {
  vfio_device_feature_dma_logging_report r;
  std::memcpy(&r, payload, sizeof r);
  if (r.page_size < 4096 || !PowerOfTwo(r.page_size)) return -EINVAL;
  if (r.iova + r.length < r.iova) return -EOVERFLOW;
  if (r.length == 0 || ((r.iova | r.length) & (r.page_size - 1)) != 0) return -EINVAL;
  std::shared_lock lk(mu_);
  if (ranges_.empty()) return -EINVAL;
  for (auto& log : ranges_) {
    if (r.iova >= log->iova() && r.iova + r.length <= log->end()) {
      if (r.bitmap == 0) return -EFAULT;
      log->Report(r.iova, r.iova + r.length, r.iova, r.page_size, true, reinterpret_cast<uint64_t*>(r.bitmap));
      return 0;
    }
  }
  return -EINVAL;
}

int FakeDmaLogging::Stop() {
  std::unique_lock lk(mu_);
  ranges_.clear();
  page_ = 0;
  return 0;
}

void FakeDmaLogging::DmaWrite(uint64_t iova, uint64_t len) {
  std::shared_lock lk(mu_);
  for (auto& log : ranges_) log->Mark(iova, len);
}

bool FakeDmaLogging::started() {
  std::shared_lock lk(mu_);
  return !ranges_.empty();
}

uint64_t FakeDmaLogging::page_size() {
  std::shared_lock lk(mu_);
  return page_;
}

int FakeDmaLoggingFile::Ioctl(FakeKernel&, unsigned long request, void* arg) {
  return request == VFIO_DEVICE_FEATURE ? log_->Feature(arg) : -ENOTTY;
}

}  // namespace gpumigrate::vfio::fake
