// The DMA half of libgpumigrate_shim: how the application's device reaches the
// regions it writes by DMA (gm_shim_dma_iommufd, gm_shim_dma_logging), so that
// gpumigrate reads the IOMMU's dirty bits or the device's DMA log for them
// instead of hashing every page (engine/devices/proc/dma_tracking.h).
//
// The shim keeps one duplicate of each file descriptor the application names
// (one per distinct descriptor, whatever the number of regions), sends it once
// with each source Hello reply (SCM_RIGHTS), and closes it at gm_shim_shutdown.
//
// Threads: Declare on the application's threads before gm_shim_start; Describe
// on the server thread. One mutex of its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/wire/shim_protocol.h"

namespace gpumigrate::shimdma {

struct Declared {
  shimwire::DmaKind kind = shimwire::DmaKind::kNone;
  int fd = -1;  // the application's descriptor (duplicated by Declare)
  uint32_t dev_id = 0;
  uint32_t hwpt_id = 0;
  uint64_t iova = 0;
};

// Records how region `name` is reached (the caller checked that the region
// exists and is DMA-written). 0, or -errno with *why set.
int Declare(const std::string& name, const Declared& d, std::string* why);

// Fills the DMA fields of `desc` for region `name` (left as they are when none
// was declared), adding its descriptor to `fds` unless already there.
void Describe(const std::string& name, shimwire::RegionDesc& desc, std::vector<int>& fds);

// Closes the duplicates and forgets every declaration (gm_shim_shutdown).
void Reset();

}  // namespace gpumigrate::shimdma
