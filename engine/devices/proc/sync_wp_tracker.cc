// Synchronous userfaultfd write-protect, for kernels without WP_ASYNC: the first
// write to a protected page stops the writer and queues a fault message; our
// fault thread marks the page dirty and lifts the protection (which wakes the
// writer). Sync hands over the marks and protects those pages again.
//
// Fault handling and Sync hold one mutex, so a page is never unprotected with its
// mark already taken by a Sync: every unprotected page is marked, and every mark
// is an unprotected page.
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "engine/devices/proc/trackers.h"
#include "engine/devices/proc/uffd_compat.h"

namespace gpumigrate::proc {
namespace {

// Measured by perf/tracker_cost on the 2-core VM: UFFDIO_WRITEPROTECT costs ~7 µs
// a call, and ~40 ms over a whole GiB of written pages; beyond this many runs,
// protect the whole region at once.
constexpr uint64_t kMaxRunIoctls = 6000;

class SyncWpTracker : public DirtyTracker {
 public:
  SyncWpTracker(int uffd, std::vector<TrackedRegion> regions) : uffd_(uffd), regions_(std::move(regions)) {
    for (const auto& r : regions_) marks_.emplace_back(r.pages());
  }
  ~SyncWpTracker() override { (void)Stop(); }

  std::string Name() const override { return "sync-wp"; }

  Status Start() override {
    if (thread_.joinable()) return FailedPrecondition("sync-wp: already started");
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (stop_fd_ < 0) return Internal(fmt::format("sync-wp: eventfd: {}", std::strerror(errno)));
    {
      std::lock_guard lk(mu_);
      for (auto& m : marks_) m.ClearAll();
      error_.clear();
    }
    thread_ = std::thread([this] { FaultLoop(); });
    for (const auto& r : regions_) {
      if (Status st = Protect(r.addr, r.size, true); !st.ok()) {
        (void)Stop();
        return st;
      }
    }
    return Status::Ok();
  }

  Status Sync(uint32_t region, DirtyBitmap& out) override {
    size_t i = Index(region);
    if (i == regions_.size()) return InvalidArgument(fmt::format("sync-wp: region {} is not tracked", region));
    const TrackedRegion& r = regions_[i];
    if (out.pages() != r.pages()) return InvalidArgument("sync-wp: bitmap size does not match the region");
    std::lock_guard lk(mu_);
    if (!error_.empty()) return Unavailable(error_);
    DirtyBitmap& m = marks_[i];
    // Re-protect the marked runs; past a few thousand runs, one ioctl over the
    // whole region is cheaper (protecting a protected page changes nothing, and
    // every unprotected page is marked).
    uint64_t runs = 0;
    for (uint64_t p = m.NextSet(0); p < m.pages() && runs <= kMaxRunIoctls; p = m.NextSet(m.NextClear(p))) ++runs;
    if (runs > kMaxRunIoctls) {
      if (Status st = Protect(r.addr, r.size, true); !st.ok()) return st;
    } else {
      for (uint64_t p = m.NextSet(0); p < m.pages();) {
        uint64_t end = m.NextClear(p);
        uint64_t len = std::min((end - p) * r.page_size, r.size - p * r.page_size);
        if (Status st = Protect(r.addr + p * r.page_size, len, true); !st.ok()) return st;
        p = m.NextSet(end);
      }
    }
    out.OrWith(m);
    m.ClearAll();
    return Status::Ok();
  }

  Status Stop() override {
    if (!thread_.joinable()) return Status::Ok();
    // Lift every protection first: it wakes any writer still waiting on a fault.
    for (const auto& r : regions_) (void)Protect(r.addr, r.size, false);
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
    thread_.join();
    close(stop_fd_);
    stop_fd_ = -1;
    return Status::Ok();
  }

 private:
  size_t Index(uint32_t id) const {
    for (size_t i = 0; i < regions_.size(); ++i) {
      if (regions_[i].id == id) return i;
    }
    return regions_.size();
  }

  Status Protect(uint64_t addr, uint64_t len, bool on) {
    uffdio_writeprotect wp{};
    wp.range.start = addr;
    wp.range.len = len;
    wp.mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
    while (ioctl(uffd_, UFFDIO_WRITEPROTECT, &wp) != 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return Unavailable(fmt::format("sync-wp: UFFDIO_WRITEPROTECT failed: {} (did the workload exit?)",
                                     std::strerror(errno)));
    }
    return Status::Ok();
  }

  void FaultLoop() {
    uffd_msg msgs[64];
    while (true) {
      pollfd pfd[2] = {{uffd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      int r = poll(pfd, 2, -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 || (pfd[1].revents & POLLIN)) return;
      if (pfd[0].revents & (POLLERR | POLLHUP)) {
        std::lock_guard lk(mu_);
        error_ = "sync-wp: the workload's userfaultfd closed (did the workload exit?)";
        return;
      }
      ssize_t n = read(uffd_, msgs, sizeof(msgs));
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        std::lock_guard lk(mu_);
        error_ = fmt::format("sync-wp: reading fault messages failed: {}", std::strerror(errno));
        return;
      }
      for (ssize_t k = 0; k < n / static_cast<ssize_t>(sizeof(uffd_msg)); ++k) {
        if (msgs[k].event != UFFD_EVENT_PAGEFAULT) continue;
        Resolve(msgs[k].arg.pagefault.address);
      }
    }
  }

  void Resolve(uint64_t address) {
    std::lock_guard lk(mu_);
    for (size_t i = 0; i < regions_.size(); ++i) {
      const TrackedRegion& r = regions_[i];
      if (address < r.addr || address >= r.addr + r.size) continue;
      uint64_t page = (address - r.addr) / r.page_size;
      marks_[i].Set(page);
      uint64_t len = std::min<uint64_t>(r.page_size, r.size - page * r.page_size);
      (void)Protect(r.addr + page * r.page_size, len, false);  // wakes the writer
      return;
    }
    // Not ours (cannot happen: only our regions are registered): just wake it.
    uffdio_range wake{address & ~uint64_t{4095}, 4096};
    (void)ioctl(uffd_, UFFDIO_WAKE, &wake);
  }

  int uffd_;
  int stop_fd_ = -1;
  std::vector<TrackedRegion> regions_;
  std::mutex mu_;
  std::vector<DirtyBitmap> marks_;
  std::string error_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<DirtyTracker> MakeSyncWpTracker(int uffd, std::vector<TrackedRegion> regions) {
  return std::make_unique<SyncWpTracker>(uffd, std::move(regions));
}

}  // namespace gpumigrate::proc
