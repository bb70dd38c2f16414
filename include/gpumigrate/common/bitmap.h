// Dirty bitmaps: one bit per page, the shape IOMMU dirty tracking hands back.
//
// DirtyBitmap is a plain value (not thread-safe) that the engine owns per region.
// AtomicDirtyBitmap is the writer-side log: any number of threads Mark() pages
// while one thread calls ReadAndClearInto(), which moves the set bits into a
// DirtyBitmap and clears them in one atomic exchange per 64 pages. A writer must
// change the page *before* it marks it (release); the reader clears *before* it
// reads the page (acquire), so a write that races with a sync either lands in this
// sync's read or leaves its bit set for the next one. No write is ever lost.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace gpumigrate {

class DirtyBitmap {
 public:
  DirtyBitmap() = default;
  explicit DirtyBitmap(uint64_t pages) : pages_(pages), words_((pages + 63) / 64, 0) {}

  uint64_t pages() const { return pages_; }
  void Set(uint64_t page) { words_[page >> 6] |= (uint64_t{1} << (page & 63)); }
  void Clear(uint64_t page) { words_[page >> 6] &= ~(uint64_t{1} << (page & 63)); }
  bool Test(uint64_t page) const { return (words_[page >> 6] >> (page & 63)) & 1; }
  // Sets pages [first, first + count).
  void SetRange(uint64_t first, uint64_t count);
  void SetAll() { SetRange(0, pages_); }
  void ClearAll();
  uint64_t Count() const;
  bool Any() const;
  void OrWith(const DirtyBitmap& other);  // same page count required

  // First set page at or after `from`, or pages() when none.
  uint64_t NextSet(uint64_t from) const;
  // First clear page at or after `from`, or pages() when none.
  uint64_t NextClear(uint64_t from) const;

  std::vector<uint64_t>& words() { return words_; }
  const std::vector<uint64_t>& words() const { return words_; }

 private:
  uint64_t pages_ = 0;
  std::vector<uint64_t> words_;
};

class AtomicDirtyBitmap {
 public:
  explicit AtomicDirtyBitmap(uint64_t pages);

  uint64_t pages() const { return pages_; }
  void Mark(uint64_t page) {
    words_[page >> 6].fetch_or(uint64_t{1} << (page & 63), std::memory_order_release);
  }
  void MarkRange(uint64_t first, uint64_t count);
  // ORs the set bits into `out` (which must have pages() pages) and clears them.
  // Returns the number of pages moved.
  uint64_t ReadAndClearInto(DirtyBitmap& out);
  void ClearAll();

 private:
  uint64_t pages_;
  std::unique_ptr<std::atomic<uint64_t>[]> words_;
  uint64_t nwords_;
};

}  // namespace gpumigrate
