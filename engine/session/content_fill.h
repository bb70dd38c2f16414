// The destination's side of content-addressed pre-copy: the content store(s)
// opened for the page sizes of the manifest's regions, and what they filled.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpumigrate/content/content_store.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

class ContentFill {
 public:
  // Opens (indexing where needed) `dir` once per distinct page size of `regions`.
  // `worked` is told the bytes hashed as the index is built (liveness progress).
  static Result<std::unique_ptr<ContentFill>> Open(const std::string& dir, const std::vector<RegionInfo>& regions,
                                                    const std::function<void(uint64_t)>& worked);

  // Fills `out` (digests.size() pages) with the pages whose SHA-256 are
  // `digests`; filled[k] says whether page k was.
  void FillRun(uint32_t page_size, std::span<const ContentDigest> digests, std::span<std::byte> out,
               std::vector<bool>& filled);

  uint64_t indexed_pages() const;
  uint64_t filled_pages() const { return filled_pages_.load(); }
  uint64_t filled_bytes() const { return filled_bytes_.load(); }
  uint64_t answered_pages() const { return answered_.load(); }
  void Answered(uint64_t pages) { answered_.fetch_add(pages); }

 private:
  std::map<uint32_t, std::unique_ptr<ContentStore>> stores_;  // by page size
  static thread_local std::vector<FillResult> results_;
  std::atomic<uint64_t> filled_pages_{0}, filled_bytes_{0}, answered_{0};
};

}  // namespace gpumigrate
