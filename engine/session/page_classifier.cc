#include "engine/session/page_classifier.h"

#include <algorithm>

#include "engine/session/page_hashes.h"
#include "gpumigrate/codec.h"

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

}  // namespace gpumigrate
