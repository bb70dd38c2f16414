#include "engine/session/page_classifier.h"

#include <algorithm>

#include "engine/session/page_hashes.h"
#include "gpumigrate/codec/codec.h"

namespace gpumigrate {

void PageClassifier::Classify(std::span<const std::byte> chunk, uint64_t page_size) {
  runs_.clear();
  hashes_.clear();
  for (uint64_t off = 0, k = 0; off < chunk.size(); off += page_size, ++k) {
    auto page = chunk.subspan(off, std::min<uint64_t>(page_size, chunk.size() - off));
    const bool zero = IsZeroPage(page);
    if (zero) {
      if (page.size() != zero_len_) {
        zero_len_ = page.size();
        zero_hash_ = ZeroPageHash(zero_len_);
      }
      hashes_.push_back(zero_hash_);
    } else {
      hashes_.push_back(HashPage(page));
    }
    if (runs_.empty() || runs_.back().zero != zero) runs_.push_back(PageRun{k, 0, off, 0, zero});
    PageRun& run = runs_.back();
    ++run.pages;
    run.length_bytes += page.size();
  }
}

uint64_t AppendUnknownParts(const PageRun& run, std::span<const uint64_t> hashes, std::span<const uint64_t> held,
                            uint64_t page_size, std::vector<PageRun>& out) {
  uint64_t same = 0;
  const uint64_t end = run.first_page + run.pages;
  for (uint64_t k = run.first_page; k < end;) {
    if (hashes[k] == held[k]) {
      ++same;
      ++k;
      continue;
    }
    uint64_t j = k;
    while (j < end && hashes[j] != held[j]) ++j;
    PageRun part = run;
    part.first_page = k;
    part.pages = j - k;
    part.offset_bytes = run.offset_bytes + (k - run.first_page) * page_size;
    part.length_bytes =
        std::min(run.offset_bytes + run.length_bytes, run.offset_bytes + (j - run.first_page) * page_size) -
        part.offset_bytes;
    out.push_back(part);
    k = j;
  }
  return same;
}

}  // namespace gpumigrate
