#include "engine/devices/vfio/iova_bitmap.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

namespace gpumigrate::vfio {
namespace {

// ORs `n` hardware-page bits (chunk-relative) into `out`, starting at hardware
// page `first` of the region; `ratio` (> 1) hardware pages make one engine page.
void Fold(const std::vector<uint64_t>& bits, uint64_t n, uint64_t first, uint64_t ratio, DirtyBitmap& out) {
  for (uint64_t w = 0; w < (n + 63) / 64; ++w) {
    for (uint64_t v = bits[w]; v != 0; v &= v - 1) {
      uint64_t b = w * 64 + static_cast<uint64_t>(std::countr_zero(v));
      if (b < n) out.Set((first + b) / ratio);
    }
  }
}

}  // namespace

Result<std::vector<HwRegion>> PrepareRegions(std::vector<IovaRegion> regions, std::string_view who) {
  std::vector<HwRegion> out;
  for (const auto& r : regions) {
    if (r.size == 0 || r.page_size == 0 || ((r.iova | r.size | r.page_size) & (kIommuPage - 1)) != 0) {
      return InvalidArgument(fmt::format(
          "{}: region {} (iova {:#x}, size {:#x}, page {:#x}) is not made of whole 4 KiB IOMMU pages", who, r.id,
          r.iova, r.size, r.page_size));
    }
    if (r.iova + r.size < r.iova) return InvalidArgument(fmt::format("{}: region {} wraps the IOVA space", who, r.id));
    const uint64_t all = r.iova | r.size | r.page_size;
    out.push_back(HwRegion{r, all & (~all + 1)});  // the lowest set bit: largest common power of two
  }
  return out;
}

Result<const HwRegion*> SyncTarget(const std::vector<HwRegion>& regions, uint32_t id, const DirtyBitmap& out,
                                   bool started, std::string_view who) {
  for (const auto& h : regions) {
    if (h.r.id != id) continue;
    if (out.pages() != h.r.pages()) return InvalidArgument(fmt::format("{}: bitmap size does not match the region", who));
    if (!started) return FailedPrecondition(fmt::format("{}: Sync before Start", who));
    return &h;
  }
  return InvalidArgument(fmt::format("{}: region {} is not tracked", who, id));
}

Status ReadRegionBitmap(const HwRegion& h, const ReadDirty& read, std::vector<uint64_t>& scratch, DirtyBitmap& out) {
  const uint64_t hw_pages = h.r.size / h.hw_page;
  const uint64_t ratio = h.r.page_size / h.hw_page;
  for (uint64_t first = 0; first < hw_pages; first += kChunkPages) {
    const uint64_t n = std::min(kChunkPages, hw_pages - first);
    const uint64_t iova = h.r.iova + first * h.hw_page;  // the bitmap's bit 0 is this IOVA's page
    if (ratio == 1) {
      // One hardware page per engine page: the kernel only sets bits, so it may
      // OR straight into the engine's bitmap (first is a multiple of 64).
      uint64_t* into = out.words().data() + first / 64;
      GM_RETURN_IF_ERROR(read(iova, n * h.hw_page, h.hw_page, into));
      continue;
    }
    scratch.assign((n + 63) / 64, 0);  // the kernel only sets bits
    GM_RETURN_IF_ERROR(read(iova, n * h.hw_page, h.hw_page, scratch.data()));
    Fold(scratch, n, first, ratio, out);
  }
  return Status::Ok();
}

}  // namespace gpumigrate::vfio
