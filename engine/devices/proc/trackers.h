// Dirty trackers for the memory of a live process (the proc backend), and the
// probe that says which of them the running kernel supports.
//
//   pagemap-scan  userfaultfd asynchronous write-protect + PAGEMAP_SCAN on
//                 /proc/PID/pagemap: the kernel resolves write faults itself and
//                 one ioctl reads the written pages and re-protects them.
//   sync-wp       synchronous userfaultfd write-protect: each first write to a
//                 protected page stops the writer until our fault thread marks
//                 the page and lifts the protection (for kernels without WP_ASYNC).
//   hash          XXH3 of every page, compared at each sync: sees writes that page
//                 tables do not (DMA, another mapping of the memory, pwrite).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::proc {

// A region as the trackers see it: where it lies in the tracked process.
struct TrackedRegion {
  uint32_t id = 0;
  uint64_t addr = 0;       // start in the tracked process (page aligned)
  uint64_t size = 0;
  uint32_t page_size = 0;  // the engine's page: a multiple of the system page
  uint64_t pages() const { return (size + page_size - 1) / page_size; }
};

struct KernelTracking {
  bool userfaultfd = false;
  uint64_t uffd_features = 0;  // what UFFDIO_API offers
  bool wp_async = false;
  bool wp_unpopulated = false;
  bool wp_shmem = false;
  bool pagemap_scan = false;
  std::string detail;  // why something is missing, in words
};
// Probes this kernel once per call (a throwaway userfaultfd and a PAGEMAP_SCAN on
// our own pagemap); costs well under a millisecond.
KernelTracking ProbeKernelTracking();

// `pagemap_fd`: /proc/PID/pagemap, owned. `uffd`: the workload's userfaultfd
// (asynchronous write-protect, regions registered), borrowed.
std::unique_ptr<DirtyTracker> MakePagemapScanTracker(int pagemap_fd, int uffd, std::vector<TrackedRegion> regions);

// `uffd`: a userfaultfd registered in write-protect mode without WP_ASYNC,
// borrowed; a thread of the tracker resolves its faults between Start and Stop.
std::unique_ptr<DirtyTracker> MakeSyncWpTracker(int uffd, std::vector<TrackedRegion> regions);

// Copies region bytes into `out` (as Device::Read does).
using PageReader = std::function<Status(uint32_t region, uint64_t offset, std::span<std::byte> out)>;
std::unique_ptr<DirtyTracker> MakeHashTracker(PageReader read, std::vector<TrackedRegion> regions);

// Routes each region's calls to the tracker that covers it.
std::unique_ptr<DirtyTracker> MakeRoutingTracker(
    std::vector<std::pair<std::vector<uint32_t>, std::unique_ptr<DirtyTracker>>> parts);

}  // namespace gpumigrate::proc
