// Dirty tracking for the regions of a live process that a device writes by DMA
// (GM_SHIM_DMA_WRITTEN): page tables do not see those writes, so pagemap-scan
// and sync-wp cannot track them. When the workload has said how its device
// reaches such a region (gm_shim_dma_iommufd, gm_shim_dma_logging), the
// hardware's own record is read instead of hashing every page at every sync:
//
//   iommufd      the IOMMU's dirty bits for the HWPT the device is attached to
//                (the workload's /dev/iommu fd, passed over the shim socket)
//   dma-logging  the device's own DMA log, through its VFIO device fd
//
// Where the hardware cannot (no IOMMU_HW_CAP_DIRTY_TRACKING, no DMA logging
// feature, a region the trackers refuse), the region falls back to hashing and
// the reason says why, region by region. Pure selection: the trackers do the
// ioctls, through `kernel` (the real one, or a fake in tests).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/wire/shim_protocol.h"
#include "engine/devices/vfio/kernel.h"
#include "gpumigrate/devices/dirty_tracker.h"

namespace gpumigrate::proc {

// A DMA-written region as the shim described it.
struct DmaRegion {
  uint32_t id = 0;
  std::string name;
  uint64_t size = 0;
  uint64_t page_size = 0;  // the engine's page for the region
  shimwire::DmaKind kind = shimwire::DmaKind::kNone;
  int fd = -1;  // the iommufd or VFIO device fd, in `kernel`'s numbering; borrowed
  uint32_t dev_id = 0;   // iommufd: the device's id in that iommufd
  uint32_t hwpt_id = 0;  // iommufd: the HWPT allocated with DIRTY_TRACKING
  uint64_t iova = 0;     // where the region starts in the device's IO address space
};

struct DmaTracking {
  // One hardware tracker per iommufd HWPT or VFIO device, with the regions it covers.
  std::vector<std::pair<std::vector<uint32_t>, std::unique_ptr<DirtyTracker>>> parts;
  std::vector<uint32_t> hashed;  // the regions left to page hashing
  std::string reason;            // what tracks each region and why, in words ("" when none)
};

// Regions with kind kNone go to `hashed` (the workload did not say how its
// device reaches them). The trackers borrow the fds: they must outlive them.
DmaTracking MakeDmaTracking(vfio::Kernel& kernel, const std::vector<DmaRegion>& regions);

}  // namespace gpumigrate::proc
