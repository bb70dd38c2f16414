#include "tests/support/vfio/fake_dirty_log.h"

#include <algorithm>
#include <bit>

namespace gpumigrate::vfio::fake {

DirtyLog::DirtyLog(uint64_t iova, uint64_t length, uint64_t grain)
    : iova_(iova), length_(length), grain_(grain), nbits_((length + grain - 1) / grain) {
  words_ = std::make_unique<std::atomic<uint64_t>[]>((nbits_ + 63) / 64);
  ClearAll();
}

void DirtyLog::Mark(uint64_t iova, uint64_t len) {
  uint64_t lo = std::max(iova, iova_), hi = std::min(iova + len, end());
  if (len == 0 || lo >= hi) return;
  for (uint64_t b = (lo - iova_) / grain_; b <= (hi - 1 - iova_) / grain_; ++b) {
    words_[b >> 6].fetch_or(uint64_t{1} << (b & 63), std::memory_order_release);
  }
}

void DirtyLog::ClearAll() {
  for (uint64_t w = 0; w < (nbits_ + 63) / 64; ++w) words_[w].store(0, std::memory_order_relaxed);
}

void DirtyLog::Report(uint64_t from, uint64_t to, uint64_t base, uint64_t page_size, bool clear, uint64_t* data) {
  from = std::max(from, iova_);
  to = std::min(to, end());
  if (from >= to) return;
  const uint64_t first = (from - iova_) / grain_, last = (to - 1 - iova_) / grain_;
  for (uint64_t w = first >> 6; w <= last >> 6; ++w) {
    uint64_t mask = ~uint64_t{0};
    if (w == first >> 6) mask &= ~uint64_t{0} << (first & 63);
    if (w == last >> 6) mask &= ~uint64_t{0} >> (63 - (last & 63));
    // A plain load first: clean words (the common case) cost no locked operation.
    uint64_t v = words_[w].load(std::memory_order_acquire) & mask;
    if (v == 0) continue;
    if (clear) v = words_[w].fetch_and(~mask, std::memory_order_acq_rel) & mask;
    for (; v != 0; v &= v - 1) {
      uint64_t b = (w << 6) + static_cast<uint64_t>(std::countr_zero(v));
      uint64_t lo = std::max(iova_ + b * grain_, from), hi = std::min(iova_ + (b + 1) * grain_, to);
      SetBitRun(data, (lo - base) / page_size, (hi - 1 - base) / page_size);
    }
  }
}

void SetBitRun(uint64_t* data, uint64_t first, uint64_t last) {
  for (uint64_t b = first; b <= last; ++b) data[b >> 6] |= uint64_t{1} << (b & 63);
}

}  // namespace gpumigrate::vfio::fake
