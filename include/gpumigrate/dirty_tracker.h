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
#include <string>

#include "gpumigrate/bitmap.h"
#include "gpumigrate/status.h"

namespace gpumigrate {

class DirtyTracker {
 public:
  virtual ~DirtyTracker() = default;
  virtual std::string Name() const = 0;
  virtual Status Start() = 0;
  // `out.pages()` must equal the region's page count.
  virtual Status Sync(uint32_t region, DirtyBitmap& out) = 0;
  virtual Status Stop() = 0;
};

}  // namespace gpumigrate
