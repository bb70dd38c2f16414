// VfioDevice: the vfio: backend (include/gpumigrate/vfio.h) over vfio::Kernel.
// Its logical state is the session's (device.h); the kernel state follows it,
// except that a device without PRE_COPY stays RUNNING in the kernel while the
// session is in PRE_COPY (it has nothing to hand over before the stun).
//
// Thread safety: one engine thread calls SetState, ReadStateChunk and
// WriteStateChunk; PendingEstimate may be asked from the same thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/devices/vfio/vfio_calls.h"
#include "gpumigrate/dirty_tracker.h"
#include "gpumigrate/vfio.h"

namespace gpumigrate::vfio {

class VfioDevice final : public Device {
 public:
  static Result<std::unique_ptr<VfioDevice>> Open(const VfioSpec& spec, DeviceRole role, Kernel& k);
  ~VfioDevice() override;

  std::string Describe() const override { return "vfio:" + path_; }
  const std::vector<RegionInfo>& Regions() const override { return regions_; }
  DeviceState State() const override { return state_; }
  Status SetState(DeviceState next) override;
  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) override;
  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) override;
  Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) override;
  Result<std::vector<std::byte>> SaveState() override;
  Status LoadState(std::span<const std::byte> blob) override;
  PendingBytes PendingEstimate() const override;
  DirtyTracker* Tracker() override { return &tracker_; }
  bool StreamsState() const override { return true; }
  Result<size_t> ReadStateChunk(std::span<std::byte> out) override;
  Status WriteStateChunk(std::span<const std::byte> in) override;
  std::string LostState() const override { return lost_; }

  uint64_t migration_flags() const { return flags_; }
  bool pre_copy() const { return (flags_ & VFIO_MIGRATION_PRE_COPY) != 0; }

 private:
  // No regions: the whole state is the stream, so there is nothing to track.
  class NoPages final : public DirtyTracker {
   public:
    std::string Name() const override { return "none (the device state is its migration stream)"; }
    Status Start() override { return Status::Ok(); }
    Status Sync(uint32_t region, DirtyBitmap&) override;
    Status Stop() override { return Status::Ok(); }
  };

  VfioDevice(Calls calls, std::string path, DeviceRole role, int fd, int iommufd)
      : calls_(std::move(calls)), path_(std::move(path)), role_(role), fd_(fd), iommufd_(iommufd) {}
  // Kernel SET to `to`; a data fd it opens replaces the current one.
  Status KSet(uint32_t to);
  Status Step(DeviceState next);
  Status Recover(DeviceState next, Status why);
  Status RecoverSource(Status why);
  Status Discard();
  Status Reset(std::string_view what_is_lost);
  void CloseData();

  Calls calls_;
  std::string path_;
  DeviceRole role_;
  int fd_;
  int iommufd_;  // the cdev is bound to it: open as long as the device
  uint64_t flags_ = 0;
  uint32_t kstate_ = kStateRunning;  // the kernel's state as last set or read
  DeviceState state_ = DeviceState::kRunning;
  int data_fd_ = -1;
  bool stream_ended_ = false;
  std::string lost_;  // LostState(): set when a reset threw the device's state away
  std::vector<RegionInfo> regions_;
  NoPages tracker_;
};

}  // namespace gpumigrate::vfio
