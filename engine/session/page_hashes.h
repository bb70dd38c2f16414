// Per-page XXH3-64 hashes of what was sent (source) or applied (destination),
// and the per-region digest both sides compare at Prepare: XXH3-64 over the
// little-endian array of page hashes. Pages never sent hash as zero pages, which
// is what a fresh destination holds. Keeping hashes as pages go means nothing is
// re-read during the stun. Not thread-safe: callers serialize per page.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "gpumigrate/devices/device.h"

namespace gpumigrate {

uint64_t HashPage(std::span<const std::byte> page);
uint64_t ZeroPageHash(uint64_t length);

class PageHashes {
 public:
  explicit PageHashes(const std::vector<RegionInfo>& regions);
  // `index` is the position of the region in the vector given to the constructor.
  void Set(size_t index, uint64_t page, uint64_t hash) { hashes_[index][page] = hash; }
  uint64_t Get(size_t index, uint64_t page) const { return hashes_[index][page]; }
  void SetZero(size_t index, uint64_t page);
  uint64_t RegionDigest(size_t index) const;
  const std::vector<std::vector<uint64_t>>& All() const { return hashes_; }
  // Replaces every hash (what a destination already holds); false, unchanged,
  // when the shape differs from the regions'.
  bool Assign(const std::vector<std::vector<uint64_t>>& hashes);

 private:
  std::vector<RegionInfo> regions_;
  std::vector<std::vector<uint64_t>> hashes_;
};

}  // namespace gpumigrate
