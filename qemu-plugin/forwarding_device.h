// A Device (or a subclass of Device, `Base`) that forwards every call to another
// device it owns: the base of the QEMU hook's decorators, which add QEMU's side
// of a migration around the device's own transitions and override only those.
#pragma once

#include <memory>
#include <utility>

#include "gpumigrate/devices/device.h"

namespace gpumigrate::qemu {

template <class Base = Device>
class Forwarding : public Base {
 public:
  explicit Forwarding(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}

  std::string Describe() const override { return inner_->Describe(); }
  const std::vector<RegionInfo>& Regions() const override { return inner_->Regions(); }
  DeviceState State() const override { return inner_->State(); }
  Status SetState(DeviceState next) override { return inner_->SetState(next); }
  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) override {
    return inner_->Read(region, offset, out);
  }
  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) override {
    return inner_->Write(region, offset, in);
  }
  Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) override {
    return inner_->WriteZeros(region, offset, length);
  }
  Result<std::vector<std::byte>> SaveState() override { return inner_->SaveState(); }
  Status LoadState(std::span<const std::byte> blob) override { return inner_->LoadState(blob); }
  PendingBytes PendingEstimate() const override { return inner_->PendingEstimate(); }
  Result<PendingBytes> PendingExact() override { return inner_->PendingExact(); }
  Status SaveSetup() override { return inner_->SaveSetup(); }
  Status SaveCleanup(Outcome outcome) override { return inner_->SaveCleanup(outcome); }
  Status LoadSetup() override { return inner_->LoadSetup(); }
  Status LoadCleanup(Outcome outcome) override { return inner_->LoadCleanup(outcome); }
  std::string SetupNote() const override { return inner_->SetupNote(); }
  Status SetPeerSetupNote(std::string_view note) override { return inner_->SetPeerSetupNote(note); }
  bool StreamsState() const override { return inner_->StreamsState(); }
  Result<size_t> ReadStateChunk(std::span<std::byte> out) override { return inner_->ReadStateChunk(out); }
  Status WriteStateChunk(std::span<const std::byte> in) override { return inner_->WriteStateChunk(in); }
  std::string LostState() const override { return inner_->LostState(); }
  Status Scrub() override { return inner_->Scrub(); }
  DirtyTracker* Tracker() override { return inner_->Tracker(); }

 protected:
  Device& inner() { return *inner_; }
  const Device& inner() const { return *inner_; }

 private:
  std::unique_ptr<Device> inner_;
};

}  // namespace gpumigrate::qemu
