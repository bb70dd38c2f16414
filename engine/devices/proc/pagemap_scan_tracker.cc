// Asynchronous userfaultfd write-protect + PAGEMAP_SCAN: one ioctl per region (and
// per full output vector) returns the pages written since the last scan and
// write-protects them again, atomically per page under the page-table lock.
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "engine/devices/proc/trackers.h"
#include "engine/devices/proc/uffd_compat.h"

namespace gpumigrate::proc {
namespace {

class PagemapScanTracker : public DirtyTracker {
 public:
  PagemapScanTracker(int pagemap_fd, int uffd, std::vector<TrackedRegion> regions)
      : pagemap_fd_(pagemap_fd), uffd_(uffd), regions_(std::move(regions)), vec_(4096) {}
  ~PagemapScanTracker() override {
    if (pagemap_fd_ >= 0) close(pagemap_fd_);
  }

  std::string Name() const override { return "pagemap-scan"; }

  Status Start() override {
    for (const auto& r : regions_) {
      // Protect everything (with WP_UNPOPULATED this also covers pages never
      // touched), so the first scan reports only writes from now on.
      uffdio_writeprotect wp{};
      wp.range.start = r.addr;
      wp.range.len = r.size;
      wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
      if (ioctl(uffd_, UFFDIO_WRITEPROTECT, &wp) != 0) {
        return Unavailable(fmt::format("pagemap-scan: write-protecting region {} failed: {}", r.id,
                                       std::strerror(errno)));
      }
    }
    return Status::Ok();
  }

  Status Sync(uint32_t region, DirtyBitmap& out) override {
    const TrackedRegion* r = Find(region);
    if (r == nullptr) return InvalidArgument(fmt::format("pagemap-scan: region {} is not tracked", region));
    if (out.pages() != r->pages()) return InvalidArgument("pagemap-scan: bitmap size does not match the region");
    pm_scan_arg a{};
    a.size = sizeof(a);
    a.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC;
    a.start = r->addr;
    a.end = r->addr + r->size;
    a.vec = reinterpret_cast<uint64_t>(vec_.data());
    a.vec_len = vec_.size();
    a.category_mask = PAGE_IS_WRITTEN;
    a.return_mask = PAGE_IS_WRITTEN;
    while (true) {
      long n = ioctl(pagemap_fd_, PAGEMAP_SCAN, &a);
      if (n < 0) {
        int e = errno;
        if (e == EINTR) continue;
        if (e == EPERM) {
          return Unavailable(fmt::format(
              "pagemap-scan: region {} is no longer registered for asynchronous write-protect (the workload's "
              "userfaultfd is gone: did it exit?)",
              region));
        }
        if (e == ESRCH || e == ENOENT) return Unavailable("pagemap-scan: the workload process exited");
        return Internal(fmt::format("pagemap-scan: PAGEMAP_SCAN on region {}: {}", region, std::strerror(e)));
      }
      for (long i = 0; i < n; ++i) {
        uint64_t first = (vec_[i].start - r->addr) / r->page_size;
        uint64_t last = (vec_[i].end - r->addr + r->page_size - 1) / r->page_size;
        out.SetRange(first, last - first);
      }
      // The walk may stop early, with room left in the vector: go on from walk_end.
      if (a.walk_end >= a.end) break;
      a.start = a.walk_end;
    }
    return Status::Ok();
  }

  Status Stop() override {
    for (const auto& r : regions_) {
      uffdio_writeprotect wp{};
      wp.range.start = r.addr;
      wp.range.len = r.size;
      wp.mode = 0;
      (void)ioctl(uffd_, UFFDIO_WRITEPROTECT, &wp);
    }
    return Status::Ok();
  }

 private:
  const TrackedRegion* Find(uint32_t id) const {
    for (const auto& r : regions_) {
      if (r.id == id) return &r;
    }
    return nullptr;
  }

  int pagemap_fd_;
  int uffd_;
  std::vector<TrackedRegion> regions_;
  std::vector<page_region> vec_;
};

}  // namespace

std::unique_ptr<DirtyTracker> MakePagemapScanTracker(int pagemap_fd, int uffd, std::vector<TrackedRegion> regions) {
  return std::make_unique<PagemapScanTracker>(pagemap_fd, uffd, std::move(regions));
}

}  // namespace gpumigrate::proc
