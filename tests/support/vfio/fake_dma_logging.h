// A fake of a VFIO device's own DMA dirty log (the DMA_LOGGING features of
// VFIO_DEVICE_FEATURE, as mlx5 and pds implement them), as a class the fake
// VFIO device can own, and a minimal fake::File (FakeDmaLoggingFile) that
// answers VFIO_DEVICE_FEATURE for features 6/7/8 only, for the tracker's tests.
//
// Rules enforced, and where they come from (torvalds/linux):
//   rule                                                     source
//   argsz < 8 + the feature struct, flags outside              vfio_main.c vfio_ioctl_device_feature,
//     GET|SET|PROBE|mask, GET and SET without PROBE -> -EINVAL  vfio_check_feature
//   START/STOP only with SET, REPORT only with GET, else      vfio_main.c vfio_check_feature(.., supported_ops)
//     -EINVAL; PROBE answers 0 without acting
//   START: num_ranges 0 -> -EINVAL, > 256 (a page of ranges)  vfio_main.c vfio_ioctl_device_feature_logging_start
//     -> -E2BIG; a range's iova/length not aligned to          (LOG_MAX_RANGES, IS_ALIGNED, interval tree overlap)
//     page_size -> -EINVAL; overlapping ranges -> -EINVAL;
//     iova+length overflowing -> -EOVERFLOW
//   START: the driver may pick another page size and writes   uapi vfio.h comment on
//     it back to control.page_size (here: clamped to the        vfio_device_feature_dma_logging_control
//     device's [min, max], configurable)                      ("On output the device will return the page size")
//   START while started -> -EBUSY                              uapi vfio.h "Another start is not allowed in the
//                                                              meantime" (errno: this fake's choice)
//   REPORT: page_size < 4 KiB or not a power of two ->         vfio_main.c vfio_ioctl_device_feature_logging_report
//     -EINVAL; iova+length overflowing -> -EOVERFLOW
//   REPORT while not started -> -EINVAL                        mlx5 mlx5vf_tracker_read_and_clear (!log_active)
//   REPORT: [iova, iova+length) inside one started range, and  stricter than the kernel (which only bounds the
//     iova/length aligned to page_size, else -EINVAL           bitmap): a tracker that passes here passes there
//   REPORT: bit for addr = (addr - iova) / page_size, only     uapi vfio.h vfio_device_feature_dma_logging_report;
//     set in the user's bitmap; the log is read and cleared    iova_bitmap.c iova_bitmap_set ("During querying
//                                                              the log is cleared for the IOVA range")
//   STOP (SET) ends logging and drops the log; 0 when idle    vfio_main.c vfio_ioctl_device_feature_logging_stop
//   only DMA writes inside a started range are logged          uapi vfio.h "Only DMA WRITEs are logged"
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "tests/support/vfio/fake_dirty_log.h"
#include "tests/support/vfio/fake_kernel.h"

namespace gpumigrate::vfio::fake {

class FakeDmaLogging {
 public:
  // The page sizes the device can log at (powers of two).
  FakeDmaLogging(uint64_t min_page = 4096, uint64_t max_page = uint64_t{1} << 30)
      : min_page_(min_page), max_page_(max_page) {}

  // The body of VFIO_DEVICE_FEATURE (header + payload, `argsz` bytes in all)
  // for features 6/7/8: 0 or -errno; -ENOTTY for any other feature.
  int Feature(void* arg);
  // A DMA write by the device: logged only while started, only inside a range.
  void DmaWrite(uint64_t iova, uint64_t len);
  bool started();
  uint64_t page_size();  // the page size the device chose at START (0 when idle)

 private:
  int Start(const void* payload);
  int Report(const void* payload);
  int Stop();

  const uint64_t min_page_, max_page_;
  std::shared_mutex mu_;  // exclusive: START/STOP; shared: writes and reports
  uint64_t page_ = 0;
  std::vector<std::unique_ptr<DirtyLog>> ranges_;  // sorted by iova; empty when idle
};

// A device file that knows only the DMA logging features (others: -ENOTTY).
class FakeDmaLoggingFile final : public File {
 public:
  explicit FakeDmaLoggingFile(std::shared_ptr<FakeDmaLogging> log) : log_(std::move(log)) {}
  int Ioctl(FakeKernel& k, unsigned long request, void* arg) override;

 private:
  std::shared_ptr<FakeDmaLogging> log_;
};

}  // namespace gpumigrate::vfio::fake
