#include "gpumigrate/common/bitmap.h"

#include <algorithm>
#include <bit>
#include <cassert>

namespace gpumigrate {

void DirtyBitmap::SetRange(uint64_t first, uint64_t count) {
  uint64_t end = std::min(first + count, pages_);
  for (uint64_t p = first; p < end;) {
    if ((p & 63) == 0 && end - p >= 64) {
      words_[p >> 6] = ~uint64_t{0};
      p += 64;
    } else {
      Set(p);
      ++p;
    }
  }
}

void DirtyBitmap::ClearAll() { std::fill(words_.begin(), words_.end(), 0); }

uint64_t DirtyBitmap::Count() const {
  uint64_t n = 0;
  for (uint64_t w : words_) n += static_cast<uint64_t>(std::popcount(w));
  return n;
}

bool DirtyBitmap::Any() const {
  return std::any_of(words_.begin(), words_.end(), [](uint64_t w) { return w != 0; });
}

void DirtyBitmap::OrWith(const DirtyBitmap& other) {
  assert(other.pages_ == pages_);
  for (size_t i = 0; i < words_.size(); ++i) words_[i] |= other.words_[i];
}

uint64_t DirtyBitmap::NextSet(uint64_t from) const {
  if (from >= pages_) return pages_;
  uint64_t wi = from >> 6;
  uint64_t w = words_[wi] & (~uint64_t{0} << (from & 63));
  while (true) {
    if (w != 0) return std::min<uint64_t>(pages_, (wi << 6) + static_cast<uint64_t>(std::countr_zero(w)));
    if (++wi >= words_.size()) return pages_;
    w = words_[wi];
  }
}

uint64_t DirtyBitmap::NextClear(uint64_t from) const {
  if (from >= pages_) return pages_;
  uint64_t wi = from >> 6;
  uint64_t w = ~words_[wi] & (~uint64_t{0} << (from & 63));
  while (true) {
    if (w != 0) return std::min<uint64_t>(pages_, (wi << 6) + static_cast<uint64_t>(std::countr_zero(w)));
    if (++wi >= words_.size()) return pages_;
    w = ~words_[wi];
  }
}

AtomicDirtyBitmap::AtomicDirtyBitmap(uint64_t pages)
    : pages_(pages), words_(new std::atomic<uint64_t>[(pages + 63) / 64]), nwords_((pages + 63) / 64) {
  for (uint64_t i = 0; i < nwords_; ++i) words_[i].store(0, std::memory_order_relaxed);
}

void AtomicDirtyBitmap::MarkRange(uint64_t first, uint64_t count) {
  uint64_t end = std::min(first + count, pages_);
  for (uint64_t p = first; p < end; ++p) Mark(p);
}

uint64_t AtomicDirtyBitmap::ReadAndClearInto(DirtyBitmap& out) {
  assert(out.pages() == pages_);
  uint64_t moved = 0;
  auto& ow = out.words();
  for (uint64_t i = 0; i < nwords_; ++i) {
    // Cheap relaxed peek first so clean words cost no locked instruction.
    if (words_[i].load(std::memory_order_relaxed) == 0) continue;
    uint64_t w = words_[i].exchange(0, std::memory_order_acq_rel);
    moved += static_cast<uint64_t>(std::popcount(w));
    ow[i] |= w;
  }
  return moved;
}

void AtomicDirtyBitmap::ClearAll() {
  for (uint64_t i = 0; i < nwords_; ++i) words_[i].store(0, std::memory_order_release);
}

}  // namespace gpumigrate
