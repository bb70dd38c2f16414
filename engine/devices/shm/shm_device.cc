// The shm backend (gpumigrate/devices/shm.h): a shared memory file, read and written
// with pread/pwrite, dirty pages found by hashing.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "engine/devices/proc/trackers.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/shm.h"

namespace gpumigrate {
namespace {

constexpr uint64_t kZeroChunk = 1 << 20;

class ShmDeviceImpl : public ShmDevice {
 public:
  ShmDeviceImpl(ShmSpec spec, DeviceRole role, int fd, uint64_t size)
      : spec_(std::move(spec)), role_(role), fd_(fd),
        state_(role == DeviceRole::kSource ? DeviceState::kRunning : DeviceState::kStop) {
    RegionInfo r;
    r.id = 0;
    r.name = std::filesystem::path(spec_.path).filename().string();
    r.size_bytes = size;
    r.page_size = spec_.page_size;
    r.hint = RegionHint::kUnknown;
    regions_.push_back(r);
    if (role_ == DeviceRole::kSource) {
      tracker_ = proc::MakeHashTracker(
          [this](uint32_t region, uint64_t offset, std::span<std::byte> out) { return Read(region, offset, out); },
          {proc::TrackedRegion{0, 0, size, spec_.page_size}});
    }
  }
  ~ShmDeviceImpl() override { ::close(fd_); }

  std::string Describe() const override { return spec_.ToString(); }
  const std::string& path() const override { return spec_.path; }
  const std::vector<RegionInfo>& Regions() const override { return regions_; }
  DeviceState State() const override { return state_; }

  Status SetState(DeviceState next) override {
    GM_RETURN_IF_ERROR(CheckTransition("shm", role_, state_, next));
    if (role_ == DeviceRole::kDestination && next == DeviceState::kError) {
      // A discarded migration: leave no half-copied guest memory in the file.
      Status s = WriteZeros(0, 0, regions_[0].size_bytes);
      state_ = next;
      if (!s.ok()) return s.WithContext(fmt::format("shm {}: zeroing the discarded copy", spec_.path));
      return Status::Ok();
    }
    state_ = next;
    return Status::Ok();
  }

  bool ConcurrentReads() const override { return true; }  // pread at an offset: any thread

  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) override {
    GM_RETURN_IF_ERROR(CheckRange("shm", "read", regions_, region, offset, out.size()));
    size_t done = 0;
    while (done < out.size()) {
      ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Status::FromErrno(errno, fmt::format("shm {}: read at {}", spec_.path, offset + done));
      if (n == 0) {
        return Unavailable(fmt::format("shm {}: the file ends at {} (was {} bytes when opened): truncated under us",
                                       spec_.path, offset + done, regions_[0].size_bytes));
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) override {
    GM_RETURN_IF_ERROR(CheckWritable("write"));
    GM_RETURN_IF_ERROR(CheckRange("shm", "write", regions_, region, offset, in.size()));
    size_t done = 0;
    while (done < in.size()) {
      ssize_t n = ::pwrite(fd_, in.data() + done, in.size() - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::FromErrno(n < 0 ? errno : ENOSPC, fmt::format("shm {}: write at {}", spec_.path, offset + done));
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  // Reads first and writes only where the file is not already zero: a fresh
  // destination file is all holes, and writing zeros would allocate its pages.
  Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) override {
    GM_RETURN_IF_ERROR(CheckWritable("zero"));
    GM_RETURN_IF_ERROR(CheckRange("shm", "zero", regions_, region, offset, length));
    static const std::array<std::byte, kZeroChunk> kZeros{};
    std::vector<std::byte> buf(std::min(length, kZeroChunk));
    for (uint64_t at = offset; at < offset + length;) {
      const size_t n = static_cast<size_t>(std::min(kZeroChunk, offset + length - at));
      GM_RETURN_IF_ERROR(Read(region, at, std::span(buf.data(), n)));
      if (std::any_of(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n), [](std::byte b) { return b != std::byte{0}; })) {
        GM_RETURN_IF_ERROR(Write(region, at, std::span(kZeros.data(), n)));
      }
      at += n;
    }
    return Status::Ok();
  }

  // The source's file is opened read-only for the migration: zeroing it takes
  // a writable descriptor of the same file (checked by inode, so a file put in
  // its place meanwhile is never touched). Holes are punched where the file
  // system can (the pages are freed and read back as zeros), else zeros written.
  Status Scrub() override {
    int fd = fd_;
    if (role_ == DeviceRole::kSource) {
      fd = ::open(spec_.path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) return Status::FromErrno(errno, fmt::format("shm {}: scrub: opening it for writing", spec_.path));
      struct stat a {}, b {};
      if (::fstat(fd_, &a) != 0 || ::fstat(fd, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
        ::close(fd);
        return FailedPrecondition(fmt::format("shm {}: scrub: the path now names another file than the one "
                                              "migrated; nothing zeroed",
                                              spec_.path));
      }
    }
    Status st = ZeroFile(fd);
    if (fd != fd_) ::close(fd);
    return st;
  }

  Result<std::vector<std::byte>> SaveState() override {
    if (state_ != DeviceState::kStopCopy) {
      return FailedPrecondition(fmt::format("shm: SaveState in {} (only in STOP_COPY)", DeviceStateName(state_)));
    }
    return std::vector<std::byte>{};
  }

  Status LoadState(std::span<const std::byte> blob) override {
    if (state_ != DeviceState::kResuming) {
      return FailedPrecondition(fmt::format("shm: LoadState in {} (only in RESUMING)", DeviceStateName(state_)));
    }
    if (!blob.empty()) {
      return Corrupt(fmt::format("shm: the source sent {} bytes of device state; an shm device has none", blob.size()));
    }
    return Status::Ok();
  }

  PendingBytes PendingEstimate() const override { return {}; }
  DirtyTracker* Tracker() override { return tracker_.get(); }

 private:
  Status CheckWritable(std::string_view action) const {
    if (role_ != DeviceRole::kDestination) {
      return FailedPrecondition(fmt::format("shm {}: {} on a source (its file is opened read-only)", spec_.path, action));
    }
    return Status::Ok();
  }

  Status ZeroFile(int fd) const {
    const auto size = static_cast<off_t>(regions_[0].size_bytes);
    if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, size) == 0) return Status::Ok();
    static const std::array<std::byte, kZeroChunk> kZeros{};
    for (off_t at = 0; at < size;) {
      const size_t n = static_cast<size_t>(std::min<off_t>(static_cast<off_t>(kZeroChunk), size - at));
      ssize_t w = ::pwrite(fd, kZeros.data(), n, at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Status::FromErrno(w < 0 ? errno : ENOSPC, fmt::format("shm {}: zeroing at {}", spec_.path, at));
      at += w;
    }
    return Status::Ok();
  }

  ShmSpec spec_;
  DeviceRole role_;
  int fd_;
  DeviceState state_;
  std::vector<RegionInfo> regions_;
  std::unique_ptr<DirtyTracker> tracker_;
};

}  // namespace

Result<std::unique_ptr<ShmDevice>> ShmDevice::Open(const ShmSpec& spec, DeviceRole role) {
  const bool source = role == DeviceRole::kSource;
  int fd = ::open(spec.path.c_str(), (source ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd < 0) {
    return Status::FromErrno(errno, fmt::format("shm: opening {} ({})", spec.path,
                                                source ? "the source guest's device memory file"
                                                       : "the destination QEMU's device memory file: start that QEMU first"));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = Status::FromErrno(errno, fmt::format("shm: stat {}", spec.path));
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < spec.page_size) {
    ::close(fd);
    return InvalidArgument(fmt::format("shm: {} is {} ({} bytes): expected a regular file of at least one {}-byte page",
                                       spec.path, S_ISREG(st.st_mode) ? "a file" : "not a regular file",
                                       static_cast<uint64_t>(st.st_size), spec.page_size));
  }
  return std::unique_ptr<ShmDevice>(new ShmDeviceImpl(spec, role, fd, static_cast<uint64_t>(st.st_size)));
}

}  // namespace gpumigrate
