// DirtyTracker: which pages were written since the last sync, with the semantics
// of IOMMU dirty bits (read-and-clear a bitmap per region).
//
// Start() begins logging with every page clean; Sync() ORs the pages written
// since Start() or the previous Sync() of that region into `out` and clears them
// in the tracker, atomically with respect to concurrent writers: a write that
// races with Sync() shows up in this sync or the next, never in neither. Stop()
// ends logging. One engine thread calls these; writers may be any threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "gpumigrate/common/bitmap.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

class DirtyTracker {
 public:
  virtual ~DirtyTracker() = default;
  virtual std::string Name() const = 0;
  virtual Status Start() = 0;
  // `out.pages()` must equal the region's page count.
  virtual Status Sync(uint32_t region, DirtyBitmap& out) = 0;
  virtual Status Stop() = 0;
  // The session tells the tracker what it sent: the XXH3-64 of each page of
  // `region` from `first_page` on, as read for sending. A tracker that compares
  // contents (page hashing) keeps these as the pages' last known contents, so a
  // page written back to what an earlier sync saw (an ABA write after the send)
  // is still found dirty. Trackers that see writes themselves ignore it.
  virtual void NoteSent(uint32_t region, uint64_t first_page, std::span<const uint64_t> xxh3) {
    (void)region;
    (void)first_page;
    (void)xxh3;
  }
};

}  // namespace gpumigrate
