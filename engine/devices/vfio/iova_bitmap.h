// What the two IOMMU trackers share: checking regions, picking the page size
// to ask the kernel for, and reading a region's IOVA bitmap in bounded chunks
// into the engine's DirtyBitmap.
//
// Both uAPIs (IOMMU_HWPT_GET_DIRTY_BITMAP, DMA_LOGGING_REPORT) take an IOVA
// range, a power-of-two page size that the range must be aligned to, and a
// bitmap whose bit i stands for [iova + i * page_size, +page_size): relative to
// the requested iova, not to IOVA 0. The page size asked for is the largest
// power of two that divides the region's iova, size and engine page, so each
// hardware page lies inside exactly one engine page whatever the alignment.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "gpumigrate/common/bitmap.h"
#include "gpumigrate/devices/iommu_tracking.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::vfio {

inline constexpr uint64_t kIommuPage = 4096;
// Hardware pages per kernel call: a 256 KiB bitmap (8 GiB of IOVA at 4 KiB).
inline constexpr uint64_t kChunkPages = uint64_t{1} << 21;

struct HwRegion {
  IovaRegion r;
  uint64_t hw_page = 0;  // the page size asked of the kernel
};

// Checks each region and picks its hardware page size; `who` prefixes errors.
Result<std::vector<HwRegion>> PrepareRegions(std::vector<IovaRegion> regions, std::string_view who);
// What every Sync checks before asking the kernel: the region is tracked, `out`
// has its page count, and tracking has started.
Result<const HwRegion*> SyncTarget(const std::vector<HwRegion>& regions, uint32_t id, const DirtyBitmap& out,
                                   bool started, std::string_view who);

// One kernel call: OR the dirty bits of [iova, iova + length) at page_size into
// `data` (zeroed by the caller), clearing them in the IOMMU or device.
using ReadDirty = std::function<Status(uint64_t iova, uint64_t length, uint64_t page_size, uint64_t* data)>;

// Reads region `h` chunk by chunk and ORs its pages into `out`: straight into
// out's words when the hardware page is the engine page, else through `scratch`.
Status ReadRegionBitmap(const HwRegion& h, const ReadDirty& read, std::vector<uint64_t>& scratch, DirtyBitmap& out);

}  // namespace gpumigrate::vfio
