// libgpumigrate_shim: the workload side of the proc backend (see gpumigrate/shim.h).
// One server thread accepts one gpumigrate session at a time on a Unix socket and
// answers its requests; the workload's own threads only touch the pause gate.
// Device memory (gm_shim_register_cuda) is served by shim/cuda_regions.cc; the
// calls the application makes before gm_shim_start live in shim/registration.cc.
#include "gpumigrate/shim.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/wire/shim_protocol.h"
#include "engine/devices/proc/uffd_compat.h"
#include "engine/devices/proc/uffd_probe.h"
#include "engine/devices/cuda/page_hash.h"
#include "shim/cuda_regions.h"
#include "shim/dma_regions.h"
#include "shim/shim_state.h"

namespace gpumigrate::shimcore {

Shim& S() {
  static Shim* s = new Shim;  // never destroyed: the server thread may outlive static destructors
  return *s;
}

thread_local std::string t_error;
const std::string& LastError() { return t_error; }

int Fail(int err, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  t_error = buf;
  return -err;
}

void Log(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "gpumigrate-shim[%d]: %s\n", static_cast<int>(getpid()), buf);
}

size_t PageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

int AddRegion(Region r) {
  Shim& sh = S();
  std::lock_guard lk(sh.mu);
  if (sh.serving) return Fail(EBUSY, "regions must be added before gm_shim_start");
  for (const Region& o : sh.regions) {
    if (o.name == r.name) return Fail(EEXIST, "a region named '%s' exists", r.name.c_str());
  }
  sh.regions.push_back(std::move(r));
  return 0;
}

}  // namespace gpumigrate::shimcore

namespace {

namespace w = gpumigrate::shimwire;
using namespace gpumigrate::shimcore;

constexpr auto kPauseTimeout = std::chrono::seconds(5);

// One engine session: what it asked of the shim, undone when it ends.
struct Session {
  int sock = -1;
  w::Role role = w::Role::kSource;
  bool hello = false;
  int uffd = -1;
};

int Reply(Session& s, w::Msg type, std::span<const std::byte> payload = {}, std::span<const int> fds = {}) {
  return w::SendMsg(s.sock, type, 0, payload, fds);
}

int ReplyError(Session& s, w::Msg type, int err, const std::string& text) {
  return w::SendMsg(s.sock, type, static_cast<uint32_t>(err),
                    std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

// Creates the session's userfaultfd and registers every region that page tables
// can track. Returns the fd or -errno with t_error set.
int SetUpUffd(w::WpMode mode, uint64_t* granted) {
  Shim& sh = S();
  const gpumigrate::proc::UffdProbe probe = gpumigrate::proc::ProbeUffdFeatures();
  if (!probe.ok()) return Fail(ENOSYS, "%s: %s", probe.failed_call, std::strerror(probe.error));
  const uint64_t have = probe.features;
  bool any_memfd = false;
  for (const Region& r : sh.regions) any_memfd |= r.memfd >= 0 && !(r.flags & GM_SHIM_DMA_WRITTEN);
  uint64_t want = 0;
  if (mode == w::WpMode::kAsync) {
    if (!(have & UFFD_FEATURE_WP_ASYNC)) return Fail(ENOTSUP, "the kernel lacks UFFD_FEATURE_WP_ASYNC");
    want |= UFFD_FEATURE_WP_ASYNC;
  }
  if (have & UFFD_FEATURE_WP_UNPOPULATED) want |= UFFD_FEATURE_WP_UNPOPULATED;
  if (any_memfd) {
    if (!(have & UFFD_FEATURE_WP_HUGETLBFS_SHMEM)) {
      return Fail(ENOTSUP, "the kernel lacks UFFD_FEATURE_WP_HUGETLBFS_SHMEM (write-protect of memfd memory)");
    }
    want |= UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
  }
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0) return Fail(errno, "userfaultfd: %s", std::strerror(errno));
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = want;
  if (ioctl(fd, UFFDIO_API, &api) != 0) {
    int e = errno;
    close(fd);
    return Fail(e, "UFFDIO_API with features 0x%llx: %s", static_cast<unsigned long long>(want), std::strerror(e));
  }
  *granted = api.features;
  for (Region& r : sh.regions) {
    if ((r.flags & GM_SHIM_DMA_WRITTEN) || r.dptr != 0) continue;
    if (!(want & UFFD_FEATURE_WP_UNPOPULATED)) {
      // Without WP_UNPOPULATED a first write to an unpopulated page does not fault.
      (void)madvise(r.addr, r.size, 23 /* MADV_POPULATE_WRITE */);
    }
    uffdio_register reg{};
    reg.range.start = reinterpret_cast<uint64_t>(r.addr);
    reg.range.len = r.size;
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    if (ioctl(fd, UFFDIO_REGISTER, &reg) != 0) {
      int e = errno;
      for (Region& u : sh.regions) {
        if (!u.registered) continue;
        uffdio_range rg{reinterpret_cast<uint64_t>(u.addr), u.size};
        (void)ioctl(fd, UFFDIO_UNREGISTER, &rg);
        u.registered = false;
      }
      close(fd);
      return Fail(e, "UFFDIO_REGISTER (write-protect) of region '%s': %s", r.name.c_str(), std::strerror(e));
    }
    r.registered = true;
  }
  return fd;
}

void TearDownUffd(Session& s) {
  if (s.uffd < 0) return;
  Shim& sh = S();
  for (Region& r : sh.regions) {
    if (!r.registered) continue;
    // Drop the protection (waking any writer blocked on a synchronous fault), then the registration.
    uffdio_writeprotect wp{};
    wp.range.start = reinterpret_cast<uint64_t>(r.addr);
    wp.range.len = r.size;
    wp.mode = 0;
    (void)ioctl(s.uffd, UFFDIO_WRITEPROTECT, &wp);
    uffdio_range rg{reinterpret_cast<uint64_t>(r.addr), r.size};
    (void)ioctl(s.uffd, UFFDIO_UNREGISTER, &rg);
    r.registered = false;
  }
  close(s.uffd);
  s.uffd = -1;
}

std::vector<gpumigrate::shimcuda::RegionRef> CudaRefs() {
  std::vector<gpumigrate::shimcuda::RegionRef> refs;
  for (const Region& r : S().regions) refs.push_back({r.dptr, r.dptr != 0 ? r.size : 0});
  return refs;
}

// "cuda" when the workload registered device memory, else "proc": the device spec to name.
const char* Kind() { return gpumigrate::shimcuda::Active() ? "cuda" : "proc"; }

void ZeroRegions() {
  gpumigrate::shimcuda::ZeroAll(CudaRefs());
  for (Region& r : S().regions) {
    if (r.dptr != 0) continue;
    if (r.memfd >= 0) {
      if (fallocate(r.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(r.size)) == 0) continue;
    }
    if (madvise(r.addr, r.size, MADV_DONTNEED) != 0) std::memset(r.addr, 0, r.size);
  }
}

int HandleHello(Session& s, const std::vector<std::byte>& payload) {
  Shim& sh = S();
  w::HelloReq req;
  if (payload.size() != sizeof(req)) return ReplyError(s, w::Msg::kHello, EPROTO, "malformed hello");
  std::memcpy(&req, payload.data(), sizeof(req));
  if (req.abi != w::kShimAbi) {
    return ReplyError(s, w::Msg::kHello, EPROTO,
                      "shim ABI " + std::to_string(w::kShimAbi) + ", engine ABI " + std::to_string(req.abi));
  }
  if (s.hello) return ReplyError(s, w::Msg::kHello, EALREADY, "hello already done in this session");
  auto role = static_cast<w::Role>(req.role);
  std::unique_lock lk(sh.mu);
  if (role == w::Role::kDestination && !sh.adopt) {
    return ReplyError(s, w::Msg::kHello, EINVAL,
                      "the process is a running workload (gm_shim_start), not a destination waiting to adopt "
                      "(gm_shim_start_adopt)");
  }
  if (role == w::Role::kSource && sh.adopt) {
    return ReplyError(s, w::Msg::kHello, EINVAL,
                      "the process is a destination waiting to adopt, not a running workload");
  }
  if (role == w::Role::kSource && sh.released) {
    return ReplyError(s, w::Msg::kHello, ESHUTDOWN, "the workload was already migrated away (released)");
  }
  if (role == w::Role::kDestination && sh.adopted) {
    return ReplyError(s, w::Msg::kHello, EALREADY, "the destination already adopted a migrated workload");
  }
  w::LayoutHead head;
  head.pid = static_cast<uint32_t>(getpid());
  head.regions = static_cast<uint32_t>(sh.regions.size());
  head.state_size_hint = sh.state_hint;
  head.paused = sh.paused ? 1 : 0;
  head.held = sh.held ? 1 : 0;
  std::vector<int> fds;
  auto mode = static_cast<w::WpMode>(req.wp_mode);
  if (role == w::Role::kSource && mode != w::WpMode::kNone) {
    uint64_t granted = 0;
    int fd = SetUpUffd(mode, &granted);
    if (fd < 0) return ReplyError(s, w::Msg::kHello, -fd, t_error);
    s.uffd = fd;
    head.uffd_features = granted;
  }
  std::vector<std::byte> out(sizeof(head) + sh.regions.size() * sizeof(w::RegionDesc));
  for (size_t i = 0; i < sh.regions.size(); ++i) {
    const Region& r = sh.regions[i];
    w::RegionDesc d;
    std::snprintf(d.name, sizeof(d.name), "%s", r.name.c_str());
    d.addr = r.dptr != 0 ? r.dptr : reinterpret_cast<uint64_t>(r.addr);
    d.size = r.size;
    d.page_size = static_cast<uint32_t>(r.dptr != 0 ? gpumigrate::cuda::kHashMinPage : PageSize());
    d.hint = r.hint;
    d.flags = r.flags | (r.dptr != 0 ? w::kRegionCuda : 0u);
    d.registered = r.registered ? 1 : 0;
    if (role == w::Role::kSource) gpumigrate::shimdma::Describe(r.name, d, fds);
    if (r.memfd >= 0) {
      d.flags |= w::kRegionMemfd;
      d.fd_index = static_cast<int32_t>(fds.size());
      fds.push_back(r.memfd);
    }
    std::memcpy(out.data() + sizeof(head) + i * sizeof(d), &d, sizeof(d));
  }
  if (s.uffd >= 0) {
    head.uffd_index = static_cast<int32_t>(fds.size());
    fds.push_back(s.uffd);
  }
  std::memcpy(out.data(), &head, sizeof(head));
  s.role = role;
  s.hello = true;
  lk.unlock();
  return Reply(s, w::Msg::kHello, out, fds);
}

// Source: waits for the workload to leave its write section (5 s at most), then
// for the GPU work it queued, so the final sync sees everything. `lk` holds sh.mu.
int Pause(Session& s, std::unique_lock<std::mutex>& lk) {
  Shim& sh = S();
  sh.paused = true;
  if (!sh.cv.wait_for(lk, kPauseTimeout, [&] { return sh.active == 0; })) {
    sh.paused = false;
    sh.cv.notify_all();
    lk.unlock();
    return ReplyError(s, w::Msg::kPause, ETIMEDOUT,
                      "the workload did not leave its write section (gm_shim_enter/leave) within 5 s");
  }
  lk.unlock();
  if (std::string e = gpumigrate::shimcuda::Synchronize(); !e.empty()) {
    lk.lock();
    sh.paused = false;
    sh.cv.notify_all();
    lk.unlock();
    return ReplyError(s, w::Msg::kPause, EIO, "the workload paused, but " + e);
  }
  return Reply(s, w::Msg::kPause);
}

// CUDA requests (cuda_regions.cc). Regions do not change while serving: no lock
// across the device work.
int HandleCuda(Session& s, w::Msg type, std::span<const std::byte> payload) {
  Shim& sh = S();
  bool writable = false;
  {
    std::lock_guard lk(sh.mu);
    writable = s.role == w::Role::kDestination && !sh.adopted;
  }
  return gpumigrate::shimcuda::Handle(s.sock, type, writable, payload, CudaRefs());
}

// Source: lets a paused (or held) workload run on, unless it was released.
// `lk` holds sh.mu.
int Resume(Session& s, std::unique_lock<std::mutex>& lk) {
  Shim& sh = S();
  if (sh.released) {
    lk.unlock();
    return ReplyError(s, w::Msg::kResume, ESHUTDOWN,
                      "the workload was released (migrated away); it cannot resume here");
  }
  sh.paused = false;
  sh.held = false;
  sh.cv.notify_all();
  lk.unlock();
  return Reply(s, w::Msg::kResume);
}

// Source: keeps a paused workload paused should the engine go away (past STOP).
// `lk` holds sh.mu.
int Hold(Session& s, std::unique_lock<std::mutex>& lk) {
  Shim& sh = S();
  if (!sh.paused) {
    lk.unlock();
    return ReplyError(s, w::Msg::kHold, EINVAL, "hold needs a paused workload");
  }
  sh.held = true;
  lk.unlock();
  return Reply(s, w::Msg::kHold);
}

// Source: the application's state blob from its save callback, only while
// paused. `lk` holds sh.mu.
int SaveState(Session& s, std::unique_lock<std::mutex>& lk) {
  Shim& sh = S();
  if (!sh.paused) {
    lk.unlock();
    return ReplyError(s, w::Msg::kSaveState, EINVAL, "state can only be saved while the workload is paused");
  }
  std::vector<std::byte> blob;
  if (sh.save != nullptr) {
    void* p = nullptr;
    long n = sh.save(sh.save_ctx, &p);
    if (n < 0) {
      lk.unlock();
      return ReplyError(s, w::Msg::kSaveState, static_cast<int>(-n), "the application's save callback failed");
    }
    if (p != nullptr) {
      blob.assign(static_cast<std::byte*>(p), static_cast<std::byte*>(p) + n);
      std::free(p);
    }
  }
  lk.unlock();
  return Reply(s, w::Msg::kSaveState, blob);
}

// Source, after a completed migration, before release: the next tenant of this
// memory must not read the workload's data. Only while it cannot write. `lk`
// holds sh.mu.
int Scrub(Session& s, std::unique_lock<std::mutex>& lk) {
  Shim& sh = S();
  if (!sh.paused || sh.released) {
    lk.unlock();
    return ReplyError(s, w::Msg::kScrub, EBUSY,
                      "the workload is not paused: its memory is zeroed only once it is stopped");
  }
  ZeroRegions();
  lk.unlock();
  Log("scrubbed: every region zeroed");
  return Reply(s, w::Msg::kScrub);
}

// Destination: the migrated workload may start here once the GPU work landed.
// `lk` holds sh.mu.
int StartAdopted(Session& s, std::unique_lock<std::mutex>& lk) {
  Shim& sh = S();
  if (std::string e = gpumigrate::shimcuda::Synchronize(); !e.empty()) {
    lk.unlock();
    return ReplyError(s, w::Msg::kStart, EIO, "before adopting: " + e);
  }
  sh.adopted = true;
  sh.cv.notify_all();
  lk.unlock();
  return Reply(s, w::Msg::kStart);
}

// Destination: forgets what arrived (zeroed memory, no state), unless adopted.
// `lk` holds sh.mu.
int Discard(Session& s, std::unique_lock<std::mutex>& lk) {
  Shim& sh = S();
  if (sh.adopted) {
    lk.unlock();
    return ReplyError(s, w::Msg::kDiscard, EINVAL, "already adopted: nothing to discard");
  }
  ZeroRegions();
  sh.loaded.clear();
  lk.unlock();
  return Reply(s, w::Msg::kDiscard);
}

int Handle(Session& s, const w::Header& h, std::vector<std::byte>& payload) {
  Shim& sh = S();
  auto type = static_cast<w::Msg>(h.type);
  if (type == w::Msg::kHello) return HandleHello(s, payload);
  if (!s.hello) return ReplyError(s, type, EPROTO, "hello first");
  const bool src = s.role == w::Role::kSource;
  if (type >= w::Msg::kCudaInfo && type <= w::Msg::kCudaHash) return HandleCuda(s, type, payload);
  std::unique_lock lk(sh.mu);
  switch (type) {
    case w::Msg::kPause:
      if (!src) break;
      return Pause(s, lk);
    case w::Msg::kResume:
      if (!src) break;
      return Resume(s, lk);
    case w::Msg::kHold:
      if (!src) break;
      return Hold(s, lk);
    case w::Msg::kSaveState:
      if (!src) break;
      return SaveState(s, lk);
    case w::Msg::kRelease:
      if (!src) break;
      sh.released = true;
      sh.held = false;
      sh.cv.notify_all();
      lk.unlock();
      Log("released: the workload now runs on the destination");
      return Reply(s, type);
    case w::Msg::kScrub:
      if (!src) break;
      return Scrub(s, lk);
    case w::Msg::kLoadState:
      if (src) break;
      sh.loaded = std::move(payload);
      lk.unlock();
      return Reply(s, type);
    case w::Msg::kStart:
      if (src) break;
      return StartAdopted(s, lk);
    case w::Msg::kDiscard:
      if (src) break;
      return Discard(s, lk);
    default:
      lk.unlock();
      return ReplyError(s, type, EPROTO, "unknown request " + std::to_string(h.type));
  }
  lk.unlock();
  return ReplyError(s, type, EINVAL,
                    std::string("request not valid for a ") + (src ? "source" : "destination") + " session");
}

// The engine went away (or said bye): undo what the session set up. Before STOP
// (not held) a paused source resumes; after it, it stays paused in doubt.
void EndSession(Session& s) {
  Shim& sh = S();
  TearDownUffd(s);
  std::unique_lock lk(sh.mu);
  if (s.role == w::Role::kSource && s.hello) {
    if (sh.paused && !sh.held && !sh.released) {
      sh.paused = false;
      sh.cv.notify_all();
      Log("gpumigrate went away before the switchover passed STOP: the workload resumes");
    } else if (sh.held && !sh.released) {
      Log("gpumigrate went away after the switchover passed STOP: the workload stays paused (in doubt) until "
          "`gpumigrate resume --device %s:%d` or `gpumigrate release --device %s:%d`",
          Kind(), static_cast<int>(getpid()), Kind(), static_cast<int>(getpid()));
    }
  }
  if (s.role == w::Role::kDestination && s.hello && !sh.adopted) {
    ZeroRegions();
    sh.loaded.clear();
  }
}

void Serve(int sock) {
  Session s;
  s.sock = sock;
  Shim& sh = S();
  std::vector<std::byte> payload;
  std::vector<int> fds;
  while (!sh.stop.load()) {
    w::Header h;
    int r = w::RecvMsg(sock, h, payload, fds, 200);
    if (r == -ETIMEDOUT) continue;
    for (int fd : fds) close(fd);  // the engine sends none
    if (r != 0) break;
    if (static_cast<w::Msg>(h.type) == w::Msg::kBye) {
      (void)Reply(s, w::Msg::kBye);
      break;
    }
    if (Handle(s, h, payload) != 0) break;
  }
  EndSession(s);
  close(sock);
}

bool PeerAllowed(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  return cred.uid == 0 || cred.uid == getuid();
}

void ServerLoop() {
  Shim& sh = S();
  while (!sh.stop.load()) {
    pollfd pfd{sh.listen_fd, POLLIN, 0};
    int r = poll(&pfd, 1, 200);
    if (r <= 0) continue;
    int c = accept4(sh.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    if (!PeerAllowed(c)) {
      close(c);
      continue;
    }
    Serve(c);
  }
  gpumigrate::shimcuda::Release();
}

int Start(bool adopt) {
  Shim& sh = S();
  std::lock_guard lk(sh.mu);
  if (sh.serving) return Fail(EBUSY, "the shim is already serving");
  if (sh.regions.empty()) return Fail(EINVAL, "no regions: gm_shim_alloc or gm_shim_register first");
  std::string path = w::ShimSocketPath(getpid());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return Fail(ENAMETOOLONG, "socket path too long: %s", path.c_str());
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Fail(errno, "socket: %s", std::strerror(errno));
  (void)unlink(path.c_str());  // a stale socket of an earlier process with this pid
  mode_t old = umask(0177);
  int b = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (b != 0 || listen(fd, 4) != 0) {
    int e = errno;
    close(fd);
    return Fail(e, "cannot listen on %s: %s", path.c_str(), std::strerror(e));
  }
  sh.listen_fd = fd;
  sh.path = path;
  sh.adopt = adopt;
  sh.serving = true;
  sh.stop = false;
  sh.server = std::thread(ServerLoop);
  return 0;
}

}  // namespace

GM_EXPORT int gm_shim_start(void) { return Start(false); }
GM_EXPORT int gm_shim_start_adopt(void) { return Start(true); }

GM_EXPORT int gm_shim_wait_adopt(void** state, size_t* len, int timeout_ms) {
  Shim& sh = S();
  std::unique_lock lk(sh.mu);
  if (!sh.adopt) return Fail(EINVAL, "gm_shim_wait_adopt needs gm_shim_start_adopt");
  auto ready = [&] { return sh.adopted; };
  if (timeout_ms < 0) {
    sh.cv.wait(lk, ready);
  } else if (!sh.cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), ready)) {
    return Fail(ETIMEDOUT, "no migration arrived within %d ms", timeout_ms);
  }
  if (state != nullptr) {
    *state = nullptr;
    if (!sh.loaded.empty()) {
      *state = std::malloc(sh.loaded.size());
      if (*state == nullptr) return Fail(ENOMEM, "out of memory for the state blob");
      std::memcpy(*state, sh.loaded.data(), sh.loaded.size());
    }
  }
  if (len != nullptr) *len = sh.loaded.size();
  return 0;
}

GM_EXPORT int gm_shim_enter(void) {
  Shim& sh = S();
  std::unique_lock lk(sh.mu);
  sh.cv.wait(lk, [&] { return !sh.paused || sh.released; });
  if (sh.released) return -ESHUTDOWN;
  ++sh.active;
  return 0;
}

GM_EXPORT void gm_shim_leave(void) {
  Shim& sh = S();
  std::lock_guard lk(sh.mu);
  if (--sh.active == 0 && sh.paused) sh.cv.notify_all();
}

GM_EXPORT int gm_shim_released(void) {
  Shim& sh = S();
  std::lock_guard lk(sh.mu);
  return sh.released ? 1 : 0;
}

GM_EXPORT int gm_shim_wait_released(int timeout_ms) {
  Shim& sh = S();
  std::unique_lock lk(sh.mu);
  if (!sh.cv.wait_for(lk, std::chrono::milliseconds(timeout_ms < 0 ? INT32_MAX : timeout_ms),
                      [&] { return sh.released; })) {
    return Fail(ETIMEDOUT, "not released within %d ms", timeout_ms);
  }
  return 0;
}

GM_EXPORT int gm_shim_socket_path(int pid, char* buf, size_t len) {
  std::string p = w::ShimSocketPath(pid);
  if (buf == nullptr || p.size() + 1 > len) return Fail(ENAMETOOLONG, "buffer too small for %s", p.c_str());
  std::memcpy(buf, p.c_str(), p.size() + 1);
  return static_cast<int>(p.size());
}

GM_EXPORT const char* gm_shim_last_error(void) { return t_error.c_str(); }

GM_EXPORT void gm_shim_shutdown(void) {
  Shim& sh = S();
  sh.stop = true;
  if (sh.server.joinable()) sh.server.join();
  std::lock_guard lk(sh.mu);
  if (sh.listen_fd >= 0) {
    close(sh.listen_fd);
    (void)unlink(sh.path.c_str());
  }
  sh.listen_fd = -1;
  for (Region& r : sh.regions) {
    if (r.memfd >= 0) {
      munmap(r.addr, r.size);
      close(r.memfd);
    }
  }
  sh.regions.clear();
  sh.serving = sh.adopt = sh.paused = sh.held = sh.released = sh.adopted = false;
  sh.active = 0;
  sh.loaded.clear();
  sh.save = nullptr;
  sh.cv.notify_all();
  gpumigrate::shimcuda::Reset();
  gpumigrate::shimdma::Reset();
}
