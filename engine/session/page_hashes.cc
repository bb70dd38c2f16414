#include "engine/session/page_hashes.h"

#include <vector>

#include <xxhash.h>

namespace gpumigrate {

uint64_t HashPage(std::span<const std::byte> page) { return XXH3_64bits(page.data(), page.size()); }

uint64_t ZeroPageHash(uint64_t length) {
  std::vector<std::byte> zeros(length);
  return HashPage(zeros);
}

PageHashes::PageHashes(const std::vector<RegionInfo>& regions) : regions_(regions) {
  hashes_.resize(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    const RegionInfo& r = regions[i];
    hashes_[i].assign(r.pages(), ZeroPageHash(r.page_size));
    uint64_t tail = r.size_bytes % r.page_size;
    if (tail != 0) hashes_[i].back() = ZeroPageHash(tail);
  }
}

void PageHashes::SetZero(size_t index, uint64_t page) {
  const RegionInfo& r = regions_[index];
  uint64_t len = std::min<uint64_t>(r.page_size, r.size_bytes - page * r.page_size);
  // Full pages share one precomputed value; only a short tail page is hashed anew.
  static thread_local uint64_t cached_len = 0, cached_hash = 0;
  if (len != cached_len) {
    cached_len = len;
    cached_hash = ZeroPageHash(len);
  }
  hashes_[index][page] = cached_hash;
}

uint64_t PageHashes::RegionDigest(size_t index) const {
  const auto& h = hashes_[index];
  return XXH3_64bits(h.data(), h.size() * sizeof(uint64_t));
}

bool PageHashes::Assign(const std::vector<std::vector<uint64_t>>& hashes) {
  if (hashes.size() != hashes_.size()) return false;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (hashes[i].size() != hashes_[i].size()) return false;
  }
  hashes_ = hashes;
  return true;
}

}  // namespace gpumigrate
