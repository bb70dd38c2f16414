// VfioDevice: the vfio: backend (include/gpumigrate/devices/vfio.h) over vfio::Kernel.
// Its logical state is the session's (device.h); the kernel state follows it,
// except that a device without PRE_COPY stays RUNNING in the kernel while the
// session is in PRE_COPY (it has nothing to hand over before the stun).
//
// Several VFIO devices of one VM (vfio:PATH1,PATH2,...) are one VfioDevice:
// they move together, and because they may DMA to one another (P2P), every one
// is quiesced (RUNNING_P2P / PRE_COPY_P2P) before any is stopped, and every one
// answers P2P again (RUNNING_P2P) before any runs: vfio.h, "enum
// vfio_device_mig_state"; QEMU refuses several devices unless all offer P2P,
// and so does this. Their streams travel as records (state_mux.h).
//
// Thread safety: one engine thread calls SetState, ReadStateChunk and
// WriteStateChunk; PendingEstimate may be asked from the same thread only.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/devices/vfio/state_mux.h"
#include "engine/devices/vfio/vfio_calls.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/vfio.h"

namespace gpumigrate::vfio {

class VfioDevice final : public Device {
 public:
  static Result<std::unique_ptr<VfioDevice>> Open(const VfioSpec& spec, DeviceRole role, Kernel& k);
  ~VfioDevice() override;

  std::string Describe() const override;
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
  // Not through VFIO migration: the device's memory is reached only through its
  // own migration stream, and clearing it is the driver's (on the VMM's
  // VFIO_DEVICE_RESET or when the device is unbound).
  Status Scrub() override {
    return Unimplemented(Describe() + ": a VFIO device's memory is not reachable through the migration uAPI; the "
                                      "driver clears it when the VMM resets or releases the device");
  }
  // The destination tells the source how many devices it has; the source
  // refuses a destination whose count differs before anything moves.
  std::string SetupNote() const override;
  Status SetPeerSetupNote(std::string_view note) override;

  // The first (or only) device's flags.
  uint64_t migration_flags() const { return members_.front().flags; }
  bool pre_copy() const { return (migration_flags() & VFIO_MIGRATION_PRE_COPY) != 0; }
  size_t members() const { return members_.size(); }

 private:
  // No regions: the whole state is the stream, so there is nothing to track.
  class NoPages final : public DirtyTracker {
   public:
    std::string Name() const override { return "none (the device state is its migration stream)"; }
    Status Start() override { return Status::Ok(); }
    Status Sync(uint32_t region, DirtyBitmap&) override;
    Status Stop() override { return Status::Ok(); }
  };

  // One VFIO device (cdev) of the set.
  struct Member {
    Calls calls;
    std::string path;
    int fd = -1;
    uint64_t flags = 0;
    uint32_t kstate = kStateRunning;  // the kernel's state as last set or read
    int data_fd = -1;
    bool stream_ended = false;
    bool pre_copy() const { return (flags & VFIO_MIGRATION_PRE_COPY) != 0; }
  };

  VfioDevice(Kernel& k, DeviceRole role) : k_(k), role_(role) {}
  bool multi() const { return members_.size() > 1; }
  // Kernel SET of one member to `to`; a data fd it opens replaces its current one.
  Status KSet(Member& m, uint32_t to);
  Status AllTo(uint32_t to);
  // Several devices: each stops initiating P2P before any stops / answers P2P
  // before any runs. No-ops for one device (the kernel's own path covers it).
  Status Quiesce();
  Status Wake();
  Status Step(DeviceState next);
  Status Recover(DeviceState next, Status why);
  Status RecoverSource(Status why);
  Status RecoverStart(Status why);
  Status Discard();
  Status Reset(Member& m, std::string_view what_is_lost);
  void CloseData(Member& m);
  void CloseAllData();
  Result<size_t> ReadMember(Member& m, std::span<std::byte> out);
  Status WriteMember(Member& m, std::span<const std::byte> in);

  Kernel& k_;
  DeviceRole role_;
  int iommufd_ = -1;  // every cdev is bound to it: open as long as the device
  std::vector<Member> members_;
  DeviceState state_ = DeviceState::kRunning;
  size_t cursor_ = 0;  // the member the source reads next (several devices)
  std::unique_ptr<MuxReader> mux_;  // the destination's record reader (several devices)
  std::string lost_;  // LostState(): set when a reset threw a device's state away
  std::vector<RegionInfo> regions_;
  NoPages tracker_;
};

}  // namespace gpumigrate::vfio
