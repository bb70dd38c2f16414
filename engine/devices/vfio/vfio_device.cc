#include "engine/devices/vfio/vfio_device.h"

#include <fcntl.h>

#include <cerrno>
#include <charconv>

#include <fmt/format.h>

namespace gpumigrate::vfio {
namespace {

// What a device that cannot say its stop-copy size (no MIG_DATA_SIZE: kernels
// before 6.2) is assumed to hold: pessimistic, so a downtime limit is never broken.
constexpr uint64_t kUnknownStopCopyBytes = uint64_t{1} << 40;

uint64_t SatAdd(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

bool Stopped(uint32_t s) { return s == kStateStop || s == kStateStopCopy || s == kStateResuming; }

constexpr std::string_view kNotePrefix = "vfio devices=";

}  // namespace

Result<std::unique_ptr<VfioDevice>> VfioDevice::Open(const VfioSpec& spec, DeviceRole role, Kernel& k) {
  if (spec.paths.empty()) return InvalidArgument("vfio: no device path");
  std::unique_ptr<VfioDevice> d(new VfioDevice(k, role));  // its destructor closes what is open on failure
  for (const std::string& path : spec.paths) {
    Member m{Calls(k, "vfio:" + path), path};
    m.fd = k.Open(path.c_str(), O_RDWR);
    if (m.fd < 0) return KernelError(fmt::format("{}: open", m.calls.name()), m.fd);
    d->members_.push_back(std::move(m));
    Member& mm = d->members_.back();
    if (d->iommufd_ < 0) {  // one for all the devices
      GM_ASSIGN_OR_RETURN(d->iommufd_, mm.calls.OpenIommufd());
    }
    GM_RETURN_IF_ERROR(mm.calls.Bind(mm.fd, d->iommufd_));
    GM_ASSIGN_OR_RETURN(mm.flags, mm.calls.MigrationFlags(mm.fd));
    GM_ASSIGN_OR_RETURN(mm.kstate, mm.calls.GetState(mm.fd));
    if (!(mm.flags & VFIO_MIGRATION_STOP_COPY)) {
      return FailedPrecondition(fmt::format("{}: the device does not offer VFIO_MIGRATION_STOP_COPY (flags {:#x})",
                                            mm.calls.name(), mm.flags));
    }
    if (role == DeviceRole::kSource && mm.kstate != kStateRunning) {
      return FailedPrecondition(fmt::format("{}: the device is {}, a source must be RUNNING", mm.calls.name(),
                                            StateName(mm.kstate)));
    }
  }
  if (d->multi()) {
    for (const Member& m : d->members_) {
      if (!(m.flags & VFIO_MIGRATION_P2P)) {
        return FailedPrecondition(fmt::format(
            "{}: the device does not offer VFIO_MIGRATION_P2P, so it cannot be quiesced while the other devices of "
            "the VM stop (several devices migrate together only when every one offers P2P, as in QEMU)",
            m.calls.name()));
      }
    }
  }
  if (role == DeviceRole::kSource) {
    d->state_ = DeviceState::kRunning;
    return d;
  }
  for (Member& m : d->members_) {
    if (m.kstate == kStateError) GM_RETURN_IF_ERROR(d->Reset(m, "nothing of this migration"));
  }
  GM_RETURN_IF_ERROR(d->Quiesce());
  GM_RETURN_IF_ERROR(d->AllTo(kStateStop));
  d->lost_.clear();  // nothing of this migration was there to lose
  if (d->multi()) {
    d->mux_ = std::make_unique<MuxReader>(
        d->members_.size(),
        [dev = d.get()](size_t i, std::span<const std::byte> b) { return dev->WriteMember(dev->members_[i], b); },
        [dev = d.get()](size_t i) { return dev->members_[i].calls.name(); });
  }
  d->state_ = DeviceState::kStop;
  return d;
}

VfioDevice::~VfioDevice() {
  for (Member& m : members_) {
    CloseData(m);
    if (m.fd >= 0) (void)k_.Close(m.fd);
  }
  if (iommufd_ >= 0) (void)k_.Close(iommufd_);
}

std::string VfioDevice::Describe() const {
  std::string s = "vfio:";
  for (size_t i = 0; i < members_.size(); ++i) s += (i ? "," : "") + members_[i].path;
  return s;
}

void VfioDevice::CloseData(Member& m) {
  if (m.data_fd >= 0) (void)k_.Close(m.data_fd);
  m.data_fd = -1;
}

void VfioDevice::CloseAllData() {
  for (Member& m : members_) CloseData(m);
}

Status VfioDevice::KSet(Member& m, uint32_t to) {
  GM_ASSIGN_OR_RETURN(int nfd, m.calls.SetState(m.fd, m.kstate, to));
  m.kstate = to;
  if (nfd >= 0) {
    CloseData(m);
    m.data_fd = nfd;
    m.stream_ended = false;
  }
  return Status::Ok();
}

Status VfioDevice::AllTo(uint32_t to) {
  for (Member& m : members_) GM_RETURN_IF_ERROR(KSet(m, to));
  return Status::Ok();
}

Status VfioDevice::Quiesce() {
  if (!multi()) return Status::Ok();
  for (Member& m : members_) {
    if (m.kstate == kStateRunning) GM_RETURN_IF_ERROR(KSet(m, kStateRunningP2P));
    if (m.kstate == kStatePreCopy) GM_RETURN_IF_ERROR(KSet(m, kStatePreCopyP2P));
  }
  return Status::Ok();
}

Status VfioDevice::Wake() {
  if (!multi()) return Status::Ok();
  for (Member& m : members_) {
    if (Stopped(m.kstate)) GM_RETURN_IF_ERROR(KSet(m, kStateRunningP2P));
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
      // Without PRE_COPY a device has nothing to give before the stun: it runs on.
      for (Member& m : members_) {
        if (m.pre_copy()) GM_RETURN_IF_ERROR(KSet(m, kStatePreCopy));
      }
      return Status::Ok();
    case DeviceState::kStopCopy: GM_RETURN_IF_ERROR(Quiesce()); return AllTo(kStateStopCopy);
    case DeviceState::kResuming:
      if (mux_) mux_->Reset();
      return AllTo(kStateResuming);
    case DeviceState::kStop:
      // A stream that ended inside a record is refused before any device loads it.
      if (mux_ && state_ == DeviceState::kResuming) GM_RETURN_IF_ERROR(mux_->Finish());
      GM_RETURN_IF_ERROR(Quiesce());
      // The session ends with the saving group or RESUMING: the fds go after the arc.
      GM_RETURN_IF_ERROR(AllTo(kStateStop));
      CloseAllData();
      return Status::Ok();
    case DeviceState::kRunning:
      CloseAllData();
      GM_RETURN_IF_ERROR(Wake());
      return AllTo(kStateRunning);
    case DeviceState::kError: return Discard();
    default: return Internal(fmt::format("{}: no arc to {}", Describe(), DeviceStateName(next)));
  }
}

// VFIO_DEVICE_RESET: the kernel's way out of any state, ERROR included (->
// RUNNING), at the price of the device's own state, which LostState() then names.
//
// Several devices: the reset lands in RUNNING, so the device is taken straight
// on to RUNNING_P2P, where it no longer initiates P2P DMA towards peers that may
// still be stopped (the kernel gives no way to reset into a quiesced state; the
// window is the one arc).
Status VfioDevice::Reset(Member& m, std::string_view what_is_lost) {
  CloseData(m);
  GM_RETURN_IF_ERROR(m.calls.Reset(m.fd));
  m.kstate = kStateRunning;
  if (lost_.empty()) lost_ = fmt::format("{} was reset (VFIO_DEVICE_RESET): {}", m.calls.name(), what_is_lost);
  if (multi()) GM_RETURN_IF_ERROR(KSet(m, kStateRunningP2P));
  return Status::Ok();
}

// A destination drops what it received: reset, then STOP (through RUNNING_P2P
// for several devices), ready for another attempt.
Status VfioDevice::Discard() {
  for (Member& m : members_) GM_RETURN_IF_ERROR(Reset(m, "what it had received is discarded"));
  if (mux_) mux_->Reset();
  GM_RETURN_IF_ERROR(Quiesce());
  return AllTo(kStateStop);
}

// After a failed arc. A source goes back to RUNNING (reset only when it fell into
// ERROR or will not go back). A destination discards what it received, except
// when STOP -> RUNNING failed after Commit: then it may hold the only verified
// copy, so it is left alone unless the driver itself put a device in ERROR.
Status VfioDevice::Recover(DeviceState next, Status why) {
  if (role_ == DeviceRole::kSource) return RecoverSource(std::move(why));
  if (next == DeviceState::kRunning && state_ == DeviceState::kStop) return RecoverStart(std::move(why));
  Status d = Discard();
  state_ = DeviceState::kError;
  return d.ok() ? why : why.WithContext(fmt::format("and discarding failed: {}", d.message()));
}

// STOP -> RUNNING failed after Commit, perhaps with some devices already
// RUNNING: every device that can is brought back to STOP (RUNNING ones through
// RUNNING_P2P, so none initiates P2P DMA while a peer is stopped), and the
// device stays in doubt, its verified state intact, unless one fell into ERROR.
Status VfioDevice::RecoverStart(Status why) {
  std::string fell;
  for (Member& m : members_) {
    auto now = m.calls.GetState(m.fd);
    if (now.ok()) m.kstate = *now;
    if ((!now.ok() || *now == kStateError) && fell.empty()) {
      fell = fmt::format("{} fell into {}", m.calls.name(), now.ok() ? StateName(*now) : "an unknown state");
    }
  }
  std::string stuck;
  for (uint32_t to : {kStateRunningP2P, kStateStop}) {  // all quiesced before any stops
    for (Member& m : members_) {
      if (m.kstate == kStateError || m.kstate == kStateStop) continue;
      if (to == kStateRunningP2P && m.kstate != kStateRunning) continue;
      if (Status st = KSet(m, to); !st.ok() && stuck.empty()) stuck = st.message();
    }
  }
  if (!stuck.empty()) why = why.WithContext(fmt::format("and stopping the devices again failed: {}", stuck));
  if (fell.empty() && stuck.empty()) return why;  // stopped, the state intact: in doubt, not lost
  if (lost_.empty()) {
    lost_ = (fell.empty() ? fmt::format("{} could not be stopped again", Describe()) : fell) +
            " while starting: the state it had received and verified is lost";
  }
  state_ = DeviceState::kError;
  return why;
}

// Every device back to RUNNING: the stopped ones to RUNNING_P2P first (several
// devices), then the ones in ERROR reset, then all RUNNING.
Status VfioDevice::RecoverSource(Status why) {
  CloseAllData();
  std::vector<bool> broken(members_.size());
  for (size_t i = 0; i < members_.size(); ++i) {
    Member& m = members_[i];
    auto now = m.calls.GetState(m.fd);
    if (now.ok()) m.kstate = *now;
    broken[i] = !now.ok() || *now == kStateError;
    if (!broken[i] && multi() && Stopped(m.kstate)) broken[i] = !KSet(m, kStateRunningP2P).ok();
  }
  const std::string_view lost = "it runs again, but its device state from before the migration is lost";
  // The broken ones reset first (several devices: on to RUNNING_P2P), so none
  // runs while a peer is still in ERROR; then every one RUNNING.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < members_.size(); ++i) {
      Member& m = members_[i];
      if (pass == 0 && !broken[i]) continue;
      if (pass == 1 && m.kstate == kStateRunning) continue;
      Status back = pass == 0 ? Reset(m, lost) : KSet(m, kStateRunning);
      if (!back.ok() && pass == 1) back = Reset(m, lost);
      if (back.ok() && pass == 1 && m.kstate != kStateRunning) back = KSet(m, kStateRunning);
      if (!back.ok()) {
        return Internal(
            fmt::format("{}; and {} could not be reset: {}", why.message(), m.calls.name(), back.message()));
      }
    }
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

std::string VfioDevice::SetupNote() const { return fmt::format("{}{}", kNotePrefix, members_.size()); }

Status VfioDevice::SetPeerSetupNote(std::string_view note) {
  if (note.empty() && !multi()) return Status::Ok();  // a destination from before several devices
  size_t theirs = 0;
  bool said = note.size() > kNotePrefix.size() && note.substr(0, kNotePrefix.size()) == kNotePrefix;
  if (said) {
    const char* end = note.data() + note.size();
    auto r = std::from_chars(note.data() + kNotePrefix.size(), end, theirs);
    said = r.ec == std::errc() && r.ptr == end;
  }
  if (!said) {
    return FailedPrecondition(fmt::format("{}: the destination did not say how many VFIO devices it resumes (a "
                                          "checkpoint file, an older gpumigrate, or not a vfio: device); several "
                                          "devices migrate only to a `gpumigrate receive` of {} vfio: devices",
                                          Describe(), members_.size()));
  }
  if (theirs != members_.size()) {
    return FailedPrecondition(fmt::format("{}: the destination resumes {} VFIO device(s), this source migrates {}: "
                                          "both ends must name the VM's devices, in the same order",
                                          Describe(), theirs, members_.size()));
  }
  return Status::Ok();
}

PendingBytes VfioDevice::PendingEstimate() const {
  PendingBytes p;
  for (const Member& m : members_) {
    auto size = m.calls.DataSize(m.fd);
    p.stop_copy_bytes = SatAdd(p.stop_copy_bytes, size.ok() ? *size : kUnknownStopCopyBytes);
    if (m.kstate != kStatePreCopy || m.data_fd < 0) continue;
    auto info = m.calls.Precopy(m.data_fd);
    if (!info.ok()) continue;
    // Saturating: a device may report anything.
    p.precopy_bytes = SatAdd(p.precopy_bytes, SatAdd(info->initial_bytes, info->dirty_bytes));
    p.precopy_initial_bytes = SatAdd(p.precopy_initial_bytes, info->initial_bytes);
  }
  return p;
}

Result<size_t> VfioDevice::ReadMember(Member& m, std::span<std::byte> out) {
  if (m.data_fd < 0 || m.stream_ended) return size_t{0};
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = k_.Read(m.data_fd, out.data() + got, out.size() - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {  // the end of the stream in STOP_COPY; in PRE_COPY nothing more for now
      m.stream_ended = state_ == DeviceState::kStopCopy;
      break;
    }
    if (r == -ENOMSG && state_ == DeviceState::kPreCopy) break;  // the temporary end
    return KernelError(fmt::format("{}: read of the migration data fd in {}", m.calls.name(),
                                   DeviceStateName(state_)),
                       static_cast<int>(r));
  }
  return got;
}

// Several devices: one record of the next device that has bytes, reading them
// in turn; 0 once none has (in STOP_COPY: every stream has ended).
Result<size_t> VfioDevice::ReadStateChunk(std::span<std::byte> out) {
  if (!multi()) return ReadMember(members_.front(), out);
  if (out.size() <= kMuxHeaderBytes) return InvalidArgument(Describe() + ": a state chunk needs more than 16 bytes");
  for (size_t tried = 0; tried < members_.size(); ++tried) {
    const size_t member = cursor_;
    cursor_ = (cursor_ + 1) % members_.size();  // in turn, so a busy device cannot starve the others
    GM_ASSIGN_OR_RETURN(size_t got, ReadMember(members_[member], out.subspan(kMuxHeaderBytes)));
    if (got > 0) {
      PutMuxHeader(out, static_cast<uint32_t>(member), got);
      return kMuxHeaderBytes + got;
    }
  }
  return size_t{0};
}

Status VfioDevice::WriteMember(Member& m, std::span<const std::byte> in) {
  if (m.data_fd < 0) return FailedPrecondition(m.calls.name() + ": no migration data fd to write the state into");
  for (size_t done = 0; done < in.size();) {
    ssize_t r = k_.Write(m.data_fd, in.data() + done, in.size() - done);
    if (r <= 0) {
      return KernelError(fmt::format("{}: write of the migration data fd in RESUMING", m.calls.name()),
                         r == 0 ? -EIO : static_cast<int>(r));
    }
    done += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Status VfioDevice::WriteStateChunk(std::span<const std::byte> in) {
  if (state_ != DeviceState::kResuming) {
    return FailedPrecondition(fmt::format("{}: state written in {}, not RESUMING", Describe(),
                                          DeviceStateName(state_)));
  }
  return mux_ ? mux_->Feed(in) : WriteMember(members_.front(), in);
}

}  // namespace gpumigrate::vfio
