// Dirty bits as an IOMMU's page tables or a device's DMA log keep them: one bit
// per `grain` bytes of an IOVA range. DMA writers Mark() from any thread; one
// reader Report()s a range into a user bitmap, clearing what it reports unless
// told not to. A word is cleared with one atomic read-modify-write that returns
// what it cleared, so a write racing a report lands in this report or stays set
// for the next one, never in neither.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace gpumigrate::vfio::fake {

class DirtyLog {
 public:
  DirtyLog(uint64_t iova, uint64_t length, uint64_t grain);

  uint64_t iova() const { return iova_; }
  uint64_t end() const { return iova_ + length_; }
  uint64_t grain() const { return grain_; }

  // Marks every grain that [iova, iova + len) touches, clipped to the log's range.
  void Mark(uint64_t iova, uint64_t len);
  void ClearAll();
  // For every dirty grain that meets [from, to) (inside the log's range), sets
  // the bits of `data` that cover its part of [from, to): bit (addr - base) /
  // page_size. Only ever sets bits in `data`, as iova_bitmap_set() does.
  void Report(uint64_t from, uint64_t to, uint64_t base, uint64_t page_size, bool clear, uint64_t* data);

 private:
  uint64_t iova_, length_, grain_, nbits_;
  std::unique_ptr<std::atomic<uint64_t>[]> words_;
};

// Sets bits [first, last] of a u64 bitmap.
void SetBitRun(uint64_t* data, uint64_t first, uint64_t last);

}  // namespace gpumigrate::vfio::fake
