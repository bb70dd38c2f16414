// Dirty tracking by the IOMMU or the device itself, for memory that a device
// writes by DMA (which page-table tracking cannot see):
//
//   iommufd      the IOMMU's dirty bits (Intel VT-d SSADS, AMD IOMMU HD, ARM
//                SMMUv3 HTTU) through /dev/iommu: IOMMU_GET_HW_INFO says whether
//                the IOMMU can, a HWPT allocated with DIRTY_TRACKING has them
//                switched on with IOMMU_HWPT_SET_DIRTY_TRACKING and read-and-
//                cleared with IOMMU_HWPT_GET_DIRTY_BITMAP (kernel >= 6.7).
//   dma-logging  the device's own DMA log through its VFIO device fd
//                (VFIO_DEVICE_FEATURE_DMA_LOGGING_START/REPORT/STOP; mlx5, pds).
//
// Both are DirtyTrackers with read-and-clear semantics. The file descriptors are
// borrowed (the VMM or the vfio: device owns them). Every kernel error comes back
// as a Status naming the ioctl and the errno.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

namespace vfio {
class Kernel;
}

// A region as the device sees it: [iova, iova + size) in its IO address space.
// iova and size are multiples of 4 KiB; page_size is the engine's page (a
// multiple of 4 KiB, up to 1 GiB); Sync's bitmap has pages() bits.
struct IovaRegion {
  uint32_t id = 0;
  uint64_t iova = 0;
  uint64_t size = 0;
  uint64_t page_size = 4096;
  uint64_t pages() const { return (size + page_size - 1) / page_size; }
};

struct IommufdTarget {
  int iommufd = -1;      // /dev/iommu, borrowed
  uint32_t dev_id = 0;   // the device's id in that iommufd (VFIO_DEVICE_BIND_IOMMUFD)
  uint32_t hwpt_id = 0;  // the HWPT the device is attached to, allocated with DIRTY_TRACKING
};

// Allocates a HWPT with IOMMU_HWPT_ALLOC_DIRTY_TRACKING on `ioas_id` for the device.
Result<uint32_t> AllocDirtyTrackingHwpt(vfio::Kernel& k, int iommufd, uint32_t dev_id, uint32_t ioas_id);

// Fails with kUnavailable, saying why, when the device's IOMMU does not report
// IOMMU_HW_CAP_DIRTY_TRACKING; with kInvalidArgument for a region that is not
// 4 KiB aligned.
Result<std::unique_ptr<DirtyTracker>> MakeIommufdTracker(vfio::Kernel& k, IommufdTarget target,
                                                         std::vector<IovaRegion> regions);

// Fails, saying why, when the device does not offer DMA logging (PROBE).
Result<std::unique_ptr<DirtyTracker>> MakeDmaLoggingTracker(vfio::Kernel& k, int device_fd,
                                                            std::vector<IovaRegion> regions);

}  // namespace gpumigrate
