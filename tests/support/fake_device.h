// A scripted fake Device for session tests: small in-memory regions, a tracker
// that reports exactly the pages a test marks, a log of lifecycle transitions,
// and switches to make chosen calls fail.
#pragma once

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/device.h"

namespace gpumigrate::testing {

class FakeDevice final : public Device, public DirtyTracker {
 public:
  FakeDevice(std::vector<RegionInfo> regions, DeviceState initial) : regions_(std::move(regions)), state_(initial) {
    for (const auto& r : regions_) {
      mem_[r.id].assign(r.size_bytes, std::byte{0});
      dirty_.emplace(r.id, DirtyBitmap(r.pages()));
    }
  }

  // --- scripting ---
  // Writes `value` over page `page` of region `id` and marks it dirty, as a workload would.
  void Touch(uint32_t id, uint64_t page, uint8_t value) {
    std::lock_guard lk(mu_);
    const RegionInfo* r = FindRegion(regions_, id);
    std::memset(mem_[id].data() + page * r->page_size, value, r->page_size);
    dirty_.at(id).Set(page);
  }
  std::optional<DeviceState> fail_transition_to;  // SetState(x) fails and stays put
  bool fail_load_state = false;
  std::atomic<bool> fail_writes{false};  // may be set while a migration runs
  std::chrono::milliseconds write_delay{0};  // each Write takes this long: a slow device that gets work done
  std::vector<std::byte> state_blob{std::byte{1}, std::byte{2}, std::byte{3}};
  std::vector<std::byte> loaded_state;
  // Called on each Sync of region 0 (the start of a round's dirty collection).
  std::function<void(int sync_index)> on_sync;
  std::vector<DeviceState> transitions;
  int syncs = 0;
  int scrubs = 0;                    // Scrub() calls
  std::optional<Status> scrub_fails;  // Scrub() returns this, zeroing nothing
  const std::vector<std::byte>& memory(uint32_t id) { return mem_[id]; }

  // --- Device ---
  std::string Describe() const override { return "fake"; }
  const std::vector<RegionInfo>& Regions() const override { return regions_; }
  DeviceState State() const override { return state_; }
  Status SetState(DeviceState next) override {
    if (fail_transition_to && *fail_transition_to == next) {
      return Internal(fmt::format("fake: transition to {} failed", DeviceStateName(next)));
    }
    transitions.push_back(next);
    state_ = next;
    return Status::Ok();
  }
  bool ConcurrentReads() const override { return true; }  // under mu_
  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) override {
    std::lock_guard lk(mu_);
    auto& m = mem_.at(region);
    if (offset + out.size() > m.size()) return InvalidArgument("fake: read out of range");
    std::memcpy(out.data(), m.data() + offset, out.size());
    return Status::Ok();
  }
  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) override {
    if (fail_writes) return Status(StatusCode::kResourceExhausted, "fake: write failed: out of device memory");
    if (write_delay.count() > 0) std::this_thread::sleep_for(write_delay);
    std::lock_guard lk(mu_);
    auto& m = mem_.at(region);
    if (offset + in.size() > m.size()) return InvalidArgument("fake: write out of range");
    std::memcpy(m.data() + offset, in.data(), in.size());
    return Status::Ok();
  }
  Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) override {
    std::lock_guard lk(mu_);
    std::memset(mem_.at(region).data() + offset, 0, length);
    return Status::Ok();
  }
  Result<std::vector<std::byte>> SaveState() override { return state_blob; }
  Status LoadState(std::span<const std::byte> blob) override {
    if (fail_load_state) return Corrupt("fake: load state failed: blob rejected");
    loaded_state.assign(blob.begin(), blob.end());
    return Status::Ok();
  }
  Status Scrub() override {
    ++scrubs;
    if (scrub_fails) return *scrub_fails;
    std::lock_guard lk(mu_);
    for (auto& [id, m] : mem_) std::fill(m.begin(), m.end(), std::byte{0});
    return Status::Ok();
  }
  PendingBytes PendingEstimate() const override { return PendingBytes{state_blob.size()}; }
  DirtyTracker* Tracker() override { return this; }

  // --- DirtyTracker ---
  std::string Name() const override { return "fake"; }
  Status Start() override {
    for (auto& [id, b] : dirty_) b.ClearAll();
    return Status::Ok();
  }
  Status Sync(uint32_t region, DirtyBitmap& out) override {
    if (region == regions_.front().id && on_sync) on_sync(syncs++);
    std::lock_guard lk(mu_);
    out.OrWith(dirty_.at(region));
    dirty_.at(region).ClearAll();
    return Status::Ok();
  }
  Status Stop() override { return Status::Ok(); }

 private:
  std::mutex mu_;
  std::vector<RegionInfo> regions_;
  std::map<uint32_t, std::vector<std::byte>> mem_;
  std::map<uint32_t, DirtyBitmap> dirty_;
  DeviceState state_;
};

}  // namespace gpumigrate::testing
