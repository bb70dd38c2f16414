// The proc device: a live process's regions, reached through its shim. CUDA
// regions (gpumigrate/devices/cuda.h) are read and written through the shim's staging
// (cuda_staging.h) and tracked by page digests (cuda/digest_tracker.h).
#include <fcntl.h>
#include <linux/falloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "engine/devices/cuda/digest_tracker.h"
#include "engine/devices/cuda/page_hash.h"
#include "engine/devices/proc/cuda_staging.h"
#include "engine/devices/proc/dma_tracking.h"
#include "engine/devices/proc/process_state.h"
#include "transport/wire/shim_protocol.h"
#include "engine/devices/proc/trackers.h"
#include "engine/devices/vfio/kernel.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {
namespace {


namespace w = shimwire;

constexpr int kReplyTimeoutMs = 10000;
constexpr int kPauseTimeoutMs = 8000;  // the shim gives the workload 5 s
constexpr int kScrubTimeoutMs = 120000;  // zeroing every region (tens of GiB of CUDA memory at memset speed)
constexpr int kHashTimeoutMs = 60000;  // one digest request: at most kHashRequestBytes hashed
constexpr uint64_t kHashRequestBytes = 256u << 20;

struct Region {
  RegionInfo info;
  w::RegionDesc desc;
  int memfd = -1;
  std::byte* map = nullptr;
  bool cuda = false;  // device memory: through staging_
  int dma_fd = -1;    // the iommufd or VFIO device fd its DMA is tracked through (dma_kernel_'s), or -1
};

class ProcDeviceImpl : public ProcDevice {
 public:
  ProcDeviceImpl(const ProcSpec& spec, ProcRole role, int sock, vfio::Kernel& dma_kernel)
      : spec_(spec), role_(role), sock_(sock), dma_kernel_(dma_kernel) {
    state_ = role == ProcRole::kSource ? DeviceState::kRunning : DeviceState::kStop;
  }

  ~ProcDeviceImpl() override {
    tracker_.reset();  // a sync-wp tracker lifts its protection and stops its thread first
    if (sock_ >= 0) {
      (void)w::SendMsg(sock_, w::Msg::kBye, 0, {});
      close(sock_);
    }
    for (Region& r : regions_) {
      if (r.map != nullptr) munmap(r.map, r.info.size_bytes);
      if (r.memfd >= 0) close(r.memfd);
    }
    if (uffd_ >= 0) close(uffd_);
    for (int fd : dma_fds_) (void)dma_kernel_.Close(fd);  // after the tracker that borrowed them
  }

  Status Init(std::chrono::milliseconds timeout) {
    if (role_ == ProcRole::kDestination) {
      GM_RETURN_IF_ERROR(Hello(w::WpMode::kNone, timeout));
      return OpenCuda();
    }
    proc::KernelTracking k = proc::ProbeKernelTracking();
    std::vector<w::WpMode> modes;
    switch (spec_.tracker) {
      case ProcTracking::kAuto:
        if (k.wp_async && k.pagemap_scan) {
          modes = {w::WpMode::kAsync, w::WpMode::kSync, w::WpMode::kNone};
          reason_ = "the kernel has userfaultfd WP_ASYNC and PAGEMAP_SCAN";
        } else if (k.userfaultfd) {
          modes = {w::WpMode::kSync, w::WpMode::kNone};
          reason_ = k.detail + ": synchronous write-protect instead";
        } else {
          modes = {w::WpMode::kNone};
          reason_ = k.detail + ": page hashing instead";
        }
        break;
      case ProcTracking::kPagemapScan:
        if (!k.wp_async || !k.pagemap_scan) {
          return FailedPrecondition(fmt::format("tracker=pagemap-scan is not available here: {}", k.detail));
        }
        modes = {w::WpMode::kAsync};
        reason_ = "forced (tracker=pagemap-scan)";
        break;
      case ProcTracking::kSyncWp:
        if (!k.userfaultfd) return FailedPrecondition(fmt::format("tracker=sync-wp is not available here: {}", k.detail));
        modes = {w::WpMode::kSync};
        reason_ = "forced (tracker=sync-wp)";
        break;
      case ProcTracking::kHash:
        modes = {w::WpMode::kNone};
        reason_ = "forced (tracker=hash)";
        break;
    }
    Status st;
    for (w::WpMode m : modes) {
      st = Hello(m, timeout);
      if (st.ok() || (st.code() != StatusCode::kUnimplemented)) break;
      // The shim could not set this mode up (say, memfd write-protect missing): next.
      reason_ += fmt::format("; {}: falling back", st.message());
    }
    GM_RETURN_IF_ERROR(st);
    GM_RETURN_IF_ERROR(OpenCuda());
    return MakeTracker();
  }

  // --- ProcDevice ---
  int pid() const override { return spec_.pid; }
  std::string TrackerName() const override { return tracker_ ? tracker_->Name() : ""; }
  std::string TrackerReason() const override { return reason_; }
  Status Release() override {
    if (role_ != ProcRole::kSource) return FailedPrecondition("release: only a source is released");
    if (state_ != DeviceState::kStop) {
      return FailedPrecondition(fmt::format("release: the source is {}, not STOP", DeviceStateName(state_)));
    }
    return Request(w::Msg::kRelease, {}, kReplyTimeoutMs).status();
  }

  // --- Device ---
  // The shim zeroes every region (memfds: holes punched; private memory:
  // MADV_DONTNEED; CUDA regions: memset on the device) while the workload is
  // paused after the switchover.
  Status Scrub() override {
    if (role_ != ProcRole::kSource || state_ != DeviceState::kStop) {
      return FailedPrecondition(fmt::format("scrub: only a stopped source is scrubbed (this one is {})",
                                            DeviceStateName(state_)));
    }
    return Request(w::Msg::kScrub, {}, kScrubTimeoutMs).status().WithContext(fmt::format("scrub process {}", spec_.pid));
  }

  std::string Describe() const override {
    uint64_t total = 0;
    for (const Region& r : regions_) total += r.info.size_bytes;
    std::string s = fmt::format("{}:{} ({} region{}, {})", spec_.cuda ? "cuda" : "proc", spec_.pid, regions_.size(),
                                regions_.size() == 1 ? "" : "s", FormatBytes(static_cast<double>(total)));
    if (tracker_) s += fmt::format(", tracker {}", tracker_->Name());
    return s;
  }
  const std::vector<RegionInfo>& Regions() const override { return infos_; }
  DeviceState State() const override { return state_; }

  Status SetState(DeviceState next) override {
    const DeviceState cur = state_;
    if (cur == next) return Status::Ok();
    GM_RETURN_IF_ERROR(CheckTransition("proc device", role_, cur, next));
    if (role_ == ProcRole::kSource) {
      switch (next) {
        case DeviceState::kStopCopy:
          GM_RETURN_IF_ERROR(Request(w::Msg::kPause, {}, kPauseTimeoutMs).status().WithContext("pause the workload"));
          break;
        case DeviceState::kStop:
          if (cur == DeviceState::kRunning) {
            GM_RETURN_IF_ERROR(Request(w::Msg::kPause, {}, kPauseTimeoutMs).status().WithContext("pause the workload"));
          }
          GM_RETURN_IF_ERROR(Request(w::Msg::kHold, {}, kReplyTimeoutMs).status().WithContext("hold the workload"));
          break;
        case DeviceState::kRunning:
          if (cur == DeviceState::kPreCopy) break;  // it never stopped
          GM_RETURN_IF_ERROR(Request(w::Msg::kResume, {}, kReplyTimeoutMs).status().WithContext("resume the workload"));
          break;
        default:
          break;
      }
    } else {
      switch (next) {
        case DeviceState::kStop:
          if (cur == DeviceState::kRunning) {
            return FailedPrecondition("proc device: an adopted workload runs on its own; it cannot be stopped here");
          }
          break;
        case DeviceState::kRunning:
          GM_RETURN_IF_ERROR(Request(w::Msg::kStart, {}, kReplyTimeoutMs).status().WithContext("start the workload"));
          break;
        case DeviceState::kError:
          state_ = DeviceState::kError;  // whatever happens next, what was received is not to be used
          return Request(w::Msg::kDiscard, {}, kReplyTimeoutMs).status().WithContext("discard");
        default:
          break;
      }
    }
    state_ = next;
    return Status::Ok();
  }

  // Shared memory or process_vm_readv: any thread; CUDA memory goes through the
  // one staging buffer, one read at a time.
  bool ConcurrentReads() const override {
    return std::none_of(regions_.begin(), regions_.end(), [](const Region& r) { return r.cuda; });
  }

  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) override {
    GM_ASSIGN_OR_RETURN(Region * r, Check(region, offset, out.size(), "read"));
    if (r->cuda) return staging_->Read(region, offset, out);
    if (r->map != nullptr) {
      std::memcpy(out.data(), r->map + offset, out.size());
      return Status::Ok();
    }
    iovec local{out.data(), out.size()};
    iovec remote{reinterpret_cast<void*>(r->desc.addr + offset), out.size()};
    ssize_t n = process_vm_readv(spec_.pid, &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(out.size())) return RemoteError("process_vm_readv", n);
    return Status::Ok();
  }

  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) override {
    if (role_ != ProcRole::kDestination || state_ != DeviceState::kResuming) {
      return FailedPrecondition("proc device: writes need a destination in RESUMING");
    }
    GM_ASSIGN_OR_RETURN(Region * r, Check(region, offset, in.size(), "write"));
    if (r->cuda) return staging_->Write(region, offset, in);
    if (r->map != nullptr) {
      std::memcpy(r->map + offset, in.data(), in.size());
      return Status::Ok();
    }
    iovec local{const_cast<std::byte*>(in.data()), in.size()};
    iovec remote{reinterpret_cast<void*>(r->desc.addr + offset), in.size()};
    ssize_t n = process_vm_writev(spec_.pid, &local, 1, &remote, 1, 0);
    if (n != static_cast<ssize_t>(in.size())) return RemoteError("process_vm_writev", n);
    return Status::Ok();
  }

  Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) override {
    if (role_ != ProcRole::kDestination || state_ != DeviceState::kResuming) {
      return FailedPrecondition("proc device: writes need a destination in RESUMING");
    }
    GM_ASSIGN_OR_RETURN(Region * r, Check(region, offset, length, "write"));
    if (r->cuda) return staging_->Zero(region, offset, length);
    if (r->memfd >= 0 &&
        fallocate(r->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(length)) == 0) {
      return Status::Ok();  // partial pages at the edges read back as zeros too
    }
    static const std::vector<std::byte> zeros(1 << 20);
    for (uint64_t done = 0; done < length;) {
      uint64_t n = std::min<uint64_t>(zeros.size(), length - done);
      GM_RETURN_IF_ERROR(Write(region, offset + done, std::span(zeros.data(), n)));
      done += n;
    }
    return Status::Ok();
  }

  Result<std::vector<std::byte>> SaveState() override {
    if (role_ != ProcRole::kSource || state_ != DeviceState::kStopCopy) {
      return FailedPrecondition("proc device: state is saved only by a source in STOP_COPY");
    }
    return Request(w::Msg::kSaveState, {}, kReplyTimeoutMs);
  }

  Status LoadState(std::span<const std::byte> blob) override {
    if (role_ != ProcRole::kDestination || state_ != DeviceState::kResuming) {
      return FailedPrecondition("proc device: state is loaded only by a destination in RESUMING");
    }
    return Request(w::Msg::kLoadState, blob, kReplyTimeoutMs).status().WithContext("load state");
  }

  PendingBytes PendingEstimate() const override {
    PendingBytes p;
    p.stop_copy_bytes = state_hint_;
    return p;
  }

  DirtyTracker* Tracker() override { return tracker_.get(); }

  // After a completed migration the destination runs the workload: tell this
  // process it moved (gm_shim_released), so this copy never runs on. After a
  // rollback it already runs; in doubt it stays held for an operator.
  Status SaveCleanup(Outcome outcome) override {
    if (outcome != Outcome::kCompleted) return Status::Ok();
    return Release().WithContext(fmt::format("release source process {} (it stays paused)", spec_.pid));
  }

 private:
  Status Hello(w::WpMode mode, std::chrono::milliseconds timeout) {
    w::HelloReq req;
    req.role = static_cast<uint32_t>(role_ == ProcRole::kSource ? w::Role::kSource : w::Role::kDestination);
    req.wp_mode = static_cast<uint32_t>(mode);
    std::vector<int> fds;
    GM_ASSIGN_OR_RETURN(auto payload,
                        Request(w::Msg::kHello, std::as_bytes(std::span(&req, 1)), static_cast<int>(timeout.count()),
                                &fds));
    auto close_fds = [&] {
      for (int fd : fds) close(fd);
    };
    w::LayoutHead head;
    if (payload.size() < sizeof(head)) {
      close_fds();
      return Corrupt("proc device: short layout from the shim");
    }
    std::memcpy(&head, payload.data(), sizeof(head));
    if (payload.size() != sizeof(head) + head.regions * sizeof(w::RegionDesc) ||
        static_cast<int>(head.pid) != spec_.pid) {
      close_fds();
      return Corrupt("proc device: malformed layout from the shim");
    }
    const uint32_t sys_page = static_cast<uint32_t>(sysconf(_SC_PAGESIZE));
    for (uint32_t i = 0; i < head.regions; ++i) {
      Region r;
      std::memcpy(&r.desc, payload.data() + sizeof(head) + i * sizeof(w::RegionDesc), sizeof(r.desc));
      r.desc.name[sizeof(r.desc.name) - 1] = '\0';
      r.info.id = i;
      r.info.name = r.desc.name;
      r.info.size_bytes = r.desc.size;
      r.info.page_size = spec_.page_size != 0 ? spec_.page_size : std::max(r.desc.page_size, sys_page);
      r.info.hint = r.desc.hint == 1 ? RegionHint::kStatic : r.desc.hint == 2 ? RegionHint::kDynamic : RegionHint::kUnknown;
      r.cuda = (r.desc.flags & w::kRegionCuda) != 0;
      if (r.cuda) r.info.page_size = spec_.cuda_page_size;
      if (r.cuda && (r.info.page_size % cuda::kHashMinPage != 0 || r.desc.size % cuda::kHashMinPage != 0)) {
        close_fds();
        return InvalidArgument(fmt::format("CUDA region '{}': page {} and size {} must be multiples of {}", r.info.name,
                                           r.info.page_size, r.desc.size, cuda::kHashMinPage));
      }
      if (!r.cuda && r.info.page_size % sys_page != 0) {
        close_fds();
        return InvalidArgument(fmt::format("page={} is not a multiple of the system page ({})", r.info.page_size, sys_page));
      }
      if (r.desc.fd_index >= 0) {
        if (static_cast<size_t>(r.desc.fd_index) >= fds.size()) {
          close_fds();
          return Corrupt("proc device: the shim's layout names a memfd it did not send");
        }
        r.memfd = fcntl(fds[r.desc.fd_index], F_DUPFD_CLOEXEC, 0);
        int prot = PROT_READ | (role_ == ProcRole::kDestination ? PROT_WRITE : 0);
        // MAP_POPULATE: fault the page tables in now, in one batch, not page by page in round 0.
        void* m = mmap(nullptr, r.desc.size, prot, MAP_SHARED | MAP_POPULATE, r.memfd, 0);
        if (m == MAP_FAILED) {
          int e = errno;
          close_fds();
          close(r.memfd);
          return Internal(fmt::format("mapping region '{}' ({} bytes) from its memfd: {}", r.info.name, r.desc.size,
                                      std::strerror(e)));
        }
        r.map = static_cast<std::byte*>(m);
      }
      infos_.push_back(r.info);
      regions_.push_back(r);
    }
    if (Status st = AdoptDmaFds(fds); !st.ok()) {
      close_fds();
      return st;
    }
    if (head.uffd_index >= 0 && static_cast<size_t>(head.uffd_index) < fds.size()) {
      uffd_ = fcntl(fds[head.uffd_index], F_DUPFD_CLOEXEC, 0);
    }
    close_fds();
    mode_ = mode;
    state_hint_ = head.state_size_hint;
    if (role_ == ProcRole::kSource && head.paused) {
      // An earlier session stopped it: STOP when held past the switchover, else STOP_COPY.
      state_ = head.held ? DeviceState::kStop : DeviceState::kStopCopy;
    }
    return Status::Ok();
  }

  // Sets up the staging of CUDA regions, if the process has any.
  Status OpenCuda() {
    const bool any = std::any_of(regions_.begin(), regions_.end(), [](const Region& r) { return r.cuda; });
    if (!any) {
      if (!spec_.cuda) return Status::Ok();
      return FailedPrecondition(fmt::format(
          "process {} registered no CUDA regions (gm_shim_register_cuda): it is a host workload, use proc:{}",
          spec_.pid, spec_.pid));
    }
    const auto mode = spec_.cuda_hash == CudaHash::kGpu    ? w::CudaHashMode::kGpu
                      : spec_.cuda_hash == CudaHash::kHost ? w::CudaHashMode::kHost
                                                           : w::CudaHashMode::kAuto;
    auto call = [this](w::Msg t, std::span<const std::byte> p, std::vector<int>* fds) {
      return Request(t, p, t == w::Msg::kCudaHash ? kHashTimeoutMs : kReplyTimeoutMs, fds);
    };
    GM_ASSIGN_OR_RETURN(staging_, proc::CudaStaging::Open(call, mode));
    return Status::Ok();
  }

  std::unique_ptr<DirtyTracker> MakeCudaTracker() {
    std::vector<cuda::DigestRegion> regions;
    uint64_t max_pages = w::kMaxHashPages;
    for (const Region& r : regions_) {
      if (!r.cuda) continue;
      regions.push_back({r.info.id, r.desc.size, r.info.page_size});
      max_pages = std::min<uint64_t>(max_pages, std::max<uint64_t>(1, kHashRequestBytes / r.info.page_size));
    }
    auto source = [this](uint32_t region, uint32_t page_bytes, uint64_t first, std::span<uint64_t> out) {
      return staging_->Digests(region, page_bytes, first, out);
    };
    return cuda::MakeDigestTracker(staging_->gpu_hash() ? "gpu-hash" : "host-hash", source, std::move(regions),
                                   max_pages);
  }

  // The source's DMA descriptors (one per distinct iommufd or VFIO device the
  // shim sent), adopted into dma_kernel_ once each; the regions point at them.
  Status AdoptDmaFds(const std::vector<int>& fds) {
    if (role_ != ProcRole::kSource || spec_.tracker == ProcTracking::kHash) return Status::Ok();
    std::vector<std::pair<int32_t, int>> adopted;  // fd index -> dma_kernel_ fd
    for (Region& r : regions_) {
      const int32_t i = r.desc.dma_fd_index;
      if (r.desc.dma_kind == 0 || !(r.desc.flags & w::kRegionDmaWritten) || r.cuda) continue;
      if (i < 0 || static_cast<size_t>(i) >= fds.size()) {
        return Corrupt(fmt::format("proc device: region '{}' names a DMA descriptor the shim did not send", r.info.name));
      }
      auto at = std::find_if(adopted.begin(), adopted.end(), [&](const auto& a) { return a.first == i; });
      if (at == adopted.end()) {
        int dup = fcntl(fds[static_cast<size_t>(i)], F_DUPFD_CLOEXEC, 0);
        int kfd = dup < 0 ? -errno : dma_kernel_.Adopt(dup);
        if (kfd < 0) {
          return Status::FromErrno(kfd, fmt::format("proc device: taking the DMA descriptor of region '{}'",
                                                    r.info.name));
        }
        dma_fds_.push_back(kfd);
        at = adopted.insert(adopted.end(), {i, kfd});
      }
      r.dma_fd = at->second;
    }
    return Status::Ok();
  }

  Status MakeTracker() {
    std::vector<proc::TrackedRegion> by_uffd, by_hash;
    std::vector<proc::DmaRegion> by_dma;
    std::vector<uint32_t> by_digest;
    std::string hashed;
    for (const Region& r : regions_) {
      if (r.cuda) {
        by_digest.push_back(r.info.id);
        continue;
      }
      proc::TrackedRegion t{r.info.id, r.desc.addr, r.desc.size, r.info.page_size};
      if ((r.desc.flags & w::kRegionDmaWritten) && spec_.tracker != ProcTracking::kHash) {
        const bool declared = r.dma_fd >= 0;
        by_dma.push_back({r.info.id, r.info.name, r.desc.size, r.info.page_size,
                          declared ? static_cast<w::DmaKind>(r.desc.dma_kind) : w::DmaKind::kNone, r.dma_fd,
                          r.desc.dma_dev_id, r.desc.dma_hwpt_id, r.desc.dma_iova});
      } else if (r.desc.registered != 0 && uffd_ >= 0) {
        by_uffd.push_back(t);
      } else {
        by_hash.push_back(t);
        if (mode_ != w::WpMode::kNone) hashed += fmt::format("{}'{}'", hashed.empty() ? "" : ", ", r.info.name);
      }
    }
    std::vector<std::pair<std::vector<uint32_t>, std::unique_ptr<DirtyTracker>>> parts;
    auto ids = [](const std::vector<proc::TrackedRegion>& v) {
      std::vector<uint32_t> out;
      for (const auto& t : v) out.push_back(t.id);
      return out;
    };
    if (!by_uffd.empty()) {
      std::unique_ptr<DirtyTracker> t;
      if (mode_ == w::WpMode::kAsync) {
        std::string path = fmt::format("/proc/{}/pagemap", spec_.pid);
        int pm = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (pm < 0) return Unavailable(fmt::format("open {}: {}", path, std::strerror(errno)));
        t = proc::MakePagemapScanTracker(pm, uffd_, by_uffd);
      } else {
        t = proc::MakeSyncWpTracker(uffd_, by_uffd);
      }
      parts.emplace_back(ids(by_uffd), std::move(t));
    }
    if (!hashed.empty()) reason_ += fmt::format("; hashing {} (written where page tables do not see it)", hashed);
    if (!by_dma.empty()) {
      // DMA-written: the hardware's own record where the workload said how to reach it.
      proc::DmaTracking dma = proc::MakeDmaTracking(dma_kernel_, by_dma);
      for (auto& p : dma.parts) parts.push_back(std::move(p));
      for (uint32_t id : dma.hashed) {
        const Region& r = regions_[id];
        by_hash.push_back({r.info.id, r.desc.addr, r.desc.size, r.info.page_size});
      }
      reason_ += "; " + dma.reason;
    }
    if (!by_hash.empty()) {
      parts.emplace_back(ids(by_hash), proc::MakeHashTracker(
                                           [this](uint32_t region, uint64_t off, std::span<std::byte> out) {
                                             return Read(region, off, out);
                                           },
                                           by_hash));
    }
    if (!by_digest.empty()) {
      const std::string note = fmt::format("CUDA regions: {}", staging_->note());
      reason_ = parts.empty() ? note : reason_ + "; " + note;
      parts.emplace_back(by_digest, MakeCudaTracker());
    }
    if (parts.size() == 1) {
      tracker_ = std::move(parts[0].second);
    } else {
      tracker_ = proc::MakeRoutingTracker(std::move(parts));
    }
    return Status::Ok();
  }

  Result<Region*> Check(uint32_t region, uint64_t offset, uint64_t len, const char* what) {
    GM_RETURN_IF_ERROR(CheckRange("proc device", what, infos_, region, offset, len));
    return &regions_[region];  // region ids are indices here
  }

  Status RemoteError(const char* call, ssize_t n) const {
    int e = errno;
    if (n < 0 && e == ESRCH) return Unavailable(fmt::format("{}: process {} exited", call, spec_.pid));
    if (n < 0) return Unavailable(fmt::format("{} of process {}: {}", call, spec_.pid, std::strerror(e)));
    return Unavailable(fmt::format("{} of process {}: partial transfer ({} bytes)", call, spec_.pid, n));
  }

  Result<std::vector<std::byte>> Request(w::Msg type, std::span<const std::byte> payload, int timeout_ms,
                                         std::vector<int>* fds_out = nullptr) {
    std::lock_guard lk(mu_);
    if (sock_ < 0) return Unavailable(fmt::format("the shim of process {} is disconnected", spec_.pid));
    auto lost = [&](int e) {
      close(sock_);
      sock_ = -1;
      // A dying process closes its files before it becomes a zombie: give it a
      // moment, so that a killed process is reported as exited, not as hung.
      bool exited = ProcessExited(spec_.pid);
      for (int i = 0; i < 25 && !exited; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        exited = ProcessExited(spec_.pid);
      }
      const bool alive = !exited;
      return Unavailable(fmt::format("the shim of process {} {} ({})", spec_.pid,
                                     alive ? "closed its socket or stopped answering" : "is gone: the process exited",
                                     std::strerror(-e)));
    };
    if (int e = w::SendMsg(sock_, type, 0, payload); e != 0) return lost(e);
    w::Header h;
    std::vector<std::byte> reply;
    std::vector<int> fds;
    if (int e = w::RecvMsg(sock_, h, reply, fds, timeout_ms); e != 0) return lost(e);
    if (fds_out != nullptr) {
      *fds_out = std::move(fds);
    } else {
      for (int fd : fds) close(fd);
    }
    if (h.type != static_cast<uint16_t>(type)) return Corrupt("proc device: the shim answered another request");
    if (h.error != 0) {
      std::string text(reinterpret_cast<const char*>(reply.data()), reply.size());
      if (fds_out != nullptr) {
        for (int fd : *fds_out) close(fd);
        fds_out->clear();
      }
      StatusCode code = (h.error == ENOTSUP || h.error == ENOSYS) ? StatusCode::kUnimplemented
                                                                   : StatusCode::kFailedPrecondition;
      return Status(code, fmt::format("process {}: {}", spec_.pid, text));
    }
    return reply;
  }

  ProcSpec spec_;
  ProcRole role_;
  std::mutex mu_;
  int sock_;
  int uffd_ = -1;
  w::WpMode mode_ = w::WpMode::kNone;
  DeviceState state_;
  uint64_t state_hint_ = 0;
  std::vector<Region> regions_;
  std::vector<RegionInfo> infos_;
  std::unique_ptr<DirtyTracker> tracker_;
  std::unique_ptr<proc::CudaStaging> staging_;
  vfio::Kernel& dma_kernel_;
  std::vector<int> dma_fds_;  // dma_kernel_'s descriptors, borrowed by the DMA trackers
  std::string reason_;
};

}  // namespace

std::string ProcShimSocket(int pid) { return w::ShimSocketPath(pid); }

namespace {

Result<int> ConnectShim(int pid) {
  std::string path = w::ShimSocketPath(pid);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return InvalidArgument(fmt::format("socket path too long: {}", path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal(fmt::format("socket: {}", std::strerror(errno)));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    close(fd);
    bool alive = kill(pid, 0) == 0 || errno == EPERM;
    if (!alive) return Unavailable(fmt::format("process {} does not exist", pid));
    return Unavailable(fmt::format(
        "process {} serves no gpumigrate shim at {} ({}): it must link libgpumigrate_shim and call gm_shim_start "
        "(or gm_shim_start_adopt on a destination); $GPUMIGRATE_SHIM_DIR must be the same for both",
        pid, path, std::strerror(e)));
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid != pid) {
    close(fd);
    return FailedPrecondition(fmt::format("the socket {} belongs to process {}, not {}", path, cred.pid, pid));
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<ProcDevice>> ProcDevice::Connect(const ProcSpec& spec, ProcRole role,
                                                        std::chrono::milliseconds timeout, vfio::Kernel* dma_kernel) {
  GM_ASSIGN_OR_RETURN(int fd, ConnectShim(spec.pid));
  auto dev = std::make_unique<ProcDeviceImpl>(spec, role, fd, dma_kernel ? *dma_kernel : vfio::RealKernel());
  GM_RETURN_IF_ERROR(dev->Init(timeout));
  return std::unique_ptr<ProcDevice>(std::move(dev));
}

}  // namespace gpumigrate
