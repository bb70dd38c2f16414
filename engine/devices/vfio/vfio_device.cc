#include "engine/devices/vfio/vfio_device.h"

#include <fcntl.h>

#include <cerrno>

#include <fmt/format.h>

namespace gpumigrate::vfio {
namespace {

// What a device that cannot say its stop-copy size (no MIG_DATA_SIZE: kernels
// before 6.2) is assumed to hold: pessimistic, so a downtime limit is never broken.
constexpr uint64_t kUnknownStopCopyBytes = uint64_t{1} << 40;

}  // namespace

Result<std::unique_ptr<VfioDevice>> VfioDevice::Open(const VfioSpec& spec, DeviceRole role, Kernel& k) {
  Calls calls(k, "vfio:" + spec.path);
  int fd = k.Open(spec.path.c_str(), O_RDWR);
  if (fd < 0) return KernelError(fmt::format("{}: open", calls.name()), fd);
  auto iommufd = calls.Bind(fd);
  if (!iommufd.ok()) {
    (void)k.Close(fd);
    return iommufd.status();
  }
  std::unique_ptr<VfioDevice> d(new VfioDevice(calls, spec.path, role, fd, *iommufd));
  GM_ASSIGN_OR_RETURN(d->flags_, calls.MigrationFlags(fd));
  GM_ASSIGN_OR_RETURN(auto kstate, calls.GetState(fd));
  d->kstate_ = kstate;
  if (!(d->flags_ & VFIO_MIGRATION_STOP_COPY)) {
    return FailedPrecondition(fmt::format("{}: the device does not offer VFIO_MIGRATION_STOP_COPY (flags {:#x})",
                                          d->Describe(), d->flags_));
  }
  if (role == DeviceRole::kSource) {
    if (kstate != kStateRunning) {
      return FailedPrecondition(fmt::format("{}: the device is {}, a source must be RUNNING", d->Describe(),
                                            StateName(kstate)));
    }
    d->state_ = DeviceState::kRunning;
    return d;
  }
  GM_RETURN_IF_ERROR(kstate == kStateError ? d->Discard() : d->KSet(kStateStop));
  d->lost_.clear();  // nothing of this migration was there to lose
  d->state_ = DeviceState::kStop;
  return d;
}

VfioDevice::~VfioDevice() {
  CloseData();
  (void)calls_.kernel().Close(fd_);
  (void)calls_.kernel().Close(iommufd_);
}

void VfioDevice::CloseData() {
  if (data_fd_ >= 0) (void)calls_.kernel().Close(data_fd_);
  data_fd_ = -1;
}

Status VfioDevice::KSet(uint32_t to) {
  GM_ASSIGN_OR_RETURN(int nfd, calls_.SetState(fd_, kstate_, to));
  kstate_ = to;
  if (nfd >= 0) {
    CloseData();
    data_fd_ = nfd;
    stream_ended_ = false;
  }
  return Status::Ok();
}

Status VfioDevice::SetState(DeviceState next) {
  GM_RETURN_IF_ERROR(CheckTransition("vfio", role_, state_, next));
  Status st = Step(next);
  if (st.ok()) {
    state_ = next;
    return st;
  }
  return Recover(next, std::move(st));
}

Status VfioDevice::Step(DeviceState next) {
  switch (next) {
    case DeviceState::kPreCopy:
      // Without PRE_COPY the device has nothing to give before the stun: it runs on.
      return pre_copy() ? KSet(kStatePreCopy) : Status::Ok();
    case DeviceState::kStopCopy: return KSet(kStateStopCopy);
    case DeviceState::kResuming: return KSet(kStateResuming);
    case DeviceState::kStop:
      // The session ends with the saving group or RESUMING: the fd goes after the arc.
      GM_RETURN_IF_ERROR(KSet(kStateStop));
      CloseData();
      return Status::Ok();
    case DeviceState::kRunning: CloseData(); return KSet(kStateRunning);
    case DeviceState::kError: return Discard();
    default: return Internal(fmt::format("{}: no arc to {}", Describe(), DeviceStateName(next)));
  }
}

// VFIO_DEVICE_RESET: the kernel's way out of any state, ERROR included (->
// RUNNING), at the price of the device's own state, which LostState() then names.
Status VfioDevice::Reset(std::string_view what_is_lost) {
  CloseData();
  GM_RETURN_IF_ERROR(calls_.Reset(fd_));
  kstate_ = kStateRunning;
  if (lost_.empty()) lost_ = fmt::format("{} was reset (VFIO_DEVICE_RESET): {}", Describe(), what_is_lost);
  return Status::Ok();
}

// A destination drops what it received: reset, then STOP, ready for another attempt.
Status VfioDevice::Discard() {
  GM_RETURN_IF_ERROR(Reset("what it had received is discarded"));
  return KSet(kStateStop);
}

// After a failed arc. A source goes back to RUNNING (reset only when it fell into
// ERROR or will not go back). A destination discards what it received, except
// when STOP -> RUNNING failed after Commit: then it may hold the only verified
// copy, so it is left alone in STOP unless the driver itself put it in ERROR.
Status VfioDevice::Recover(DeviceState next, Status why) {
  if (role_ == DeviceRole::kSource) return RecoverSource(std::move(why));
  if (next == DeviceState::kRunning && state_ == DeviceState::kStop) {
    auto now = calls_.GetState(fd_);
    if (now.ok()) kstate_ = *now;
    if (now.ok() && *now == kStateStop) return why;  // still STOP, the state intact: in doubt, not lost
    if (lost_.empty()) {
      lost_ = fmt::format("{} fell into {} while starting: the state it had received and verified is lost",
                          Describe(), now.ok() ? StateName(*now) : "an unknown state");
    }
    state_ = DeviceState::kError;
    return why;
  }
  Status d = Discard();
  state_ = DeviceState::kError;
  return d.ok() ? why : why.WithContext(fmt::format("and discarding failed: {}", d.message()));
}

Status VfioDevice::RecoverSource(Status why) {
  CloseData();
  auto now = calls_.GetState(fd_);
  if (now.ok()) kstate_ = *now;
  Status back = (now.ok() && *now != kStateError) ? KSet(kStateRunning) : Internal("the device is in ERROR");
  if (!back.ok()) back = Reset("it runs again, but its device state from before the migration is lost");
  if (!back.ok()) {
    return Internal(fmt::format("{}; and the device could not be reset: {}", why.message(), back.message()));
  }
  state_ = DeviceState::kRunning;
  return why;
}

Status VfioDevice::Read(uint32_t region, uint64_t offset, std::span<std::byte> out) {
  return CheckRange(Describe(), "read", regions_, region, offset, out.size());
}
Status VfioDevice::Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) {
  return CheckRange(Describe(), "write", regions_, region, offset, in.size());
}
Status VfioDevice::WriteZeros(uint32_t region, uint64_t offset, uint64_t length) {
  return CheckRange(Describe(), "write", regions_, region, offset, length);
}

Result<std::vector<std::byte>> VfioDevice::SaveState() {
  return FailedPrecondition(Describe() + ": the device state is a stream (ReadStateChunk), not a blob");
}
Status VfioDevice::LoadState(std::span<const std::byte> blob) {
  if (blob.empty()) return Status::Ok();
  return FailedPrecondition(Describe() + ": the device state is a stream (WriteStateChunk), not a blob");
}

Status VfioDevice::NoPages::Sync(uint32_t region, DirtyBitmap&) {
  return InvalidArgument(fmt::format("vfio: the device has no region {} to track", region));
}

PendingBytes VfioDevice::PendingEstimate() const {
  PendingBytes p;
  auto size = calls_.DataSize(fd_);
  p.stop_copy_bytes = size.ok() ? *size : kUnknownStopCopyBytes;
  if (kstate_ == kStatePreCopy && data_fd_ >= 0) {
    auto info = calls_.Precopy(data_fd_);
    if (info.ok()) {  // saturating: a device may report anything
      p.precopy_bytes = info->dirty_bytes > UINT64_MAX - info->initial_bytes ? UINT64_MAX
                                                                               : info->initial_bytes + info->dirty_bytes;
    }
  }
  return p;
}

Result<size_t> VfioDevice::ReadStateChunk(std::span<std::byte> out) {
  if (data_fd_ < 0 || stream_ended_) return size_t{0};
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = calls_.kernel().Read(data_fd_, out.data() + got, out.size() - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {  // the end of the stream in STOP_COPY; in PRE_COPY nothing more for now
      stream_ended_ = state_ == DeviceState::kStopCopy;
      break;
    }
    if (r == -ENOMSG && state_ == DeviceState::kPreCopy) break;  // the temporary end
    return KernelError(fmt::format("{}: read of the migration data fd in {}", Describe(), DeviceStateName(state_)),
                       static_cast<int>(r));
  }
  return got;
}

Status VfioDevice::WriteStateChunk(std::span<const std::byte> in) {
  if (state_ != DeviceState::kResuming || data_fd_ < 0) {
    return FailedPrecondition(fmt::format("{}: state written in {}, not RESUMING", Describe(),
                                          DeviceStateName(state_)));
  }
  for (size_t done = 0; done < in.size();) {
    ssize_t r = calls_.kernel().Write(data_fd_, in.data() + done, in.size() - done);
    if (r <= 0) {
      return KernelError(fmt::format("{}: write of the migration data fd in RESUMING", Describe()),
                         r == 0 ? -EIO : static_cast<int>(r));
    }
    done += static_cast<size_t>(r);
  }
  return Status::Ok();
}

}  // namespace gpumigrate::vfio
