// The device's own DMA log through VFIO_DEVICE_FEATURE (DMA_LOGGING_START /
// REPORT / STOP): START with every region's IOVA range at one page size (the
// largest that all ranges are aligned to; the driver may pick another), REPORT
// (read-and-clear) per region at Sync, STOP at Stop.
#include <linux/vfio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "engine/devices/vfio/iova_bitmap.h"
#include "engine/devices/vfio/kernel.h"

namespace gpumigrate {
namespace {

using vfio::HwRegion;

// VFIO_DEVICE_FEATURE with `flags` and `len` bytes of payload (read back after).
int Feature(vfio::Kernel& k, int fd, uint32_t flags, void* payload = nullptr, size_t len = 0) {
  alignas(8) std::byte buf[sizeof(vfio_device_feature) + sizeof(vfio_device_feature_dma_logging_report)];
  vfio_device_feature h{};
  h.argsz = static_cast<uint32_t>(sizeof h + len);
  h.flags = flags;
  std::memcpy(buf, &h, sizeof h);
  if (len != 0) std::memcpy(buf + sizeof h, payload, len);
  int rc = k.Ioctl(fd, VFIO_DEVICE_FEATURE, buf);
  if (len != 0) std::memcpy(payload, buf + sizeof h, len);
  return rc;
}

class DmaLoggingTracker : public DirtyTracker {
 public:
  DmaLoggingTracker(vfio::Kernel& k, int fd, std::vector<HwRegion> regions)
      : k_(k), fd_(fd), regions_(std::move(regions)) {}
  ~DmaLoggingTracker() override {
    if (started_) (void)Stop();
  }

  std::string Name() const override { return "dma-logging"; }

  Status Start() override {
    std::vector<vfio_device_feature_dma_logging_range> ranges;
    uint64_t page = uint64_t{1} << 30;
    for (const auto& h : regions_) {
      ranges.push_back({h.r.iova, h.r.size});
      page = std::min(page, h.hw_page);  // powers of two: the smallest divides every range
    }
    vfio_device_feature_dma_logging_control c{};
    c.page_size = page;
    c.num_ranges = static_cast<uint32_t>(ranges.size());
    c.ranges = reinterpret_cast<uint64_t>(ranges.data());
    int rc = Feature(k_, fd_, VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_START, &c, sizeof c);
    if (rc < 0) {
      return Status::FromErrno(rc, fmt::format("dma-logging: VFIO_DEVICE_FEATURE SET DMA_LOGGING_START "
                                               "({} ranges, page {:#x})",
                                               ranges.size(), page));
    }
    // c.page_size is now what the device chose: a coarser one only over-reports
    // (each dirty device page sets every bit it covers), a finer one is exact.
    started_ = true;
    return Status::Ok();
  }

  Status Sync(uint32_t region, DirtyBitmap& out) override {
    GM_ASSIGN_OR_RETURN(const HwRegion* h, vfio::SyncTarget(regions_, region, out, started_, "dma-logging"));
    auto read = [&](uint64_t iova, uint64_t length, uint64_t page_size, uint64_t* data) {
      vfio_device_feature_dma_logging_report r{};
      r.iova = iova;
      r.length = length;
      r.page_size = page_size;
      r.bitmap = reinterpret_cast<uint64_t>(data);
      int rc = Feature(k_, fd_, VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT, &r, sizeof r);
      if (rc >= 0) return Status::Ok();
      return Status::FromErrno(rc, fmt::format("dma-logging: VFIO_DEVICE_FEATURE GET DMA_LOGGING_REPORT for "
                                               "region {} (iova {:#x}, length {:#x}, page {:#x})",
                                               region, iova, length, page_size));
    };
    return vfio::ReadRegionBitmap(*h, read, scratch_, out);
  }

  Status Stop() override {
    if (!started_) return Status::Ok();
    started_ = false;
    int rc = Feature(k_, fd_, VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP);
    if (rc >= 0) return Status::Ok();
    return Status::FromErrno(rc, "dma-logging: VFIO_DEVICE_FEATURE SET DMA_LOGGING_STOP");
  }

 private:
  vfio::Kernel& k_;
  const int fd_;
  const std::vector<HwRegion> regions_;
  std::vector<uint64_t> scratch_;
  bool started_ = false;
};

}  // namespace

Result<std::unique_ptr<DirtyTracker>> MakeDmaLoggingTracker(vfio::Kernel& k, int device_fd,
                                                            std::vector<IovaRegion> regions) {
  GM_ASSIGN_OR_RETURN(auto hw, vfio::PrepareRegions(std::move(regions), "dma-logging"));
  if (hw.empty()) return InvalidArgument("dma-logging: no regions to track (START needs at least one range)");
  int rc = Feature(k, device_fd,
                   VFIO_DEVICE_FEATURE_PROBE | VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_DMA_LOGGING_START);
  if (rc == -ENOTTY) {
    return Unavailable("dma-logging: the device's driver keeps no DMA log (VFIO_DEVICE_FEATURE PROBE "
                       "DMA_LOGGING_START: ENOTTY); only some variant drivers do (mlx5, pds)");
  }
  if (rc < 0) {
    return Status::FromErrno(rc, "dma-logging: VFIO_DEVICE_FEATURE PROBE DMA_LOGGING_START");
  }
  return std::unique_ptr<DirtyTracker>(std::make_unique<DmaLoggingTracker>(k, device_fd, std::move(hw)));
}

}  // namespace gpumigrate
