// NullDevice: a destination that stores nothing. Writes are bounds-checked and
// dropped; the destination session still hashes every page it applies, checks
// the digests at Prepare and takes the device state, so a checkpoint replayed
// into it is verified end to end without memory the size of the device.
#pragma once

#include <vector>

#include "gpumigrate/devices/device.h"

namespace gpumigrate::ckpt {

class NullDevice final : public Device {
 public:
  NullDevice(std::string describe, std::vector<RegionInfo> regions)
      : describe_(std::move(describe)), regions_(std::move(regions)) {}

  std::string Describe() const override { return describe_; }
  const std::vector<RegionInfo>& Regions() const override { return regions_; }
  DeviceState State() const override { return state_; }
  Status SetState(DeviceState next) override {
    GM_RETURN_IF_ERROR(CheckTransition("verify", DeviceRole::kDestination, state_, next));
    state_ = next;
    return Status::Ok();
  }
  Status Read(uint32_t, uint64_t, std::span<std::byte>) override {
    return Unimplemented("verify: a null device holds nothing to read");
  }
  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) override {
    return CheckRange("verify", "write", regions_, region, offset, in.size());
  }
  Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) override {
    return CheckRange("verify", "write zeros", regions_, region, offset, length);
  }
  Result<std::vector<std::byte>> SaveState() override { return Unimplemented("verify: no state to save"); }
  Status LoadState(std::span<const std::byte> blob) override {
    state_bytes_ = blob.size();
    return Status::Ok();
  }
  PendingBytes PendingEstimate() const override { return {}; }
  DirtyTracker* Tracker() override { return nullptr; }

  uint64_t state_bytes() const { return state_bytes_; }

 private:
  std::string describe_;
  std::vector<RegionInfo> regions_;
  DeviceState state_ = DeviceState::kStop;
  uint64_t state_bytes_ = 0;
};

}  // namespace gpumigrate::ckpt
