// One DirtyTracker over regions tracked in different ways (say, hashing for a
// region written by DMA and pagemap-scan for the rest).
#include <algorithm>

#include <fmt/format.h>

#include "engine/devices/proc/trackers.h"

namespace gpumigrate::proc {
namespace {

class RoutingTracker : public DirtyTracker {
 public:
  explicit RoutingTracker(std::vector<std::pair<std::vector<uint32_t>, std::unique_ptr<DirtyTracker>>> parts)
      : parts_(std::move(parts)) {}

  std::string Name() const override {
    std::string n;
    for (const auto& [ids, t] : parts_) {
      if (!n.empty()) n.push_back('+');
      n.append(t->Name());
    }
    return n;
  }
  Status Start() override {
    for (auto& p : parts_) {
      if (Status st = p.second->Start(); !st.ok()) {
        (void)Stop();
        return st;
      }
    }
    return Status::Ok();
  }
  Status Sync(uint32_t region, DirtyBitmap& out) override {
    for (auto& [ids, t] : parts_) {
      if (std::find(ids.begin(), ids.end(), region) != ids.end()) return t->Sync(region, out);
    }
    return InvalidArgument(fmt::format("region {} is not tracked", region));
  }
  void NoteSent(uint32_t region, uint64_t first_page, std::span<const uint64_t> xxh3) override {
    for (auto& [ids, t] : parts_) {
      if (std::find(ids.begin(), ids.end(), region) != ids.end()) return t->NoteSent(region, first_page, xxh3);
    }
  }

  Status Stop() override {
    Status first;
    for (auto& p : parts_) {
      Status st = p.second->Stop();
      if (first.ok() && !st.ok()) first = st;
    }
    return first;
  }

 private:
  std::vector<std::pair<std::vector<uint32_t>, std::unique_ptr<DirtyTracker>>> parts_;
};

}  // namespace

std::unique_ptr<DirtyTracker> MakeRoutingTracker(
    std::vector<std::pair<std::vector<uint32_t>, std::unique_ptr<DirtyTracker>>> parts) {
  return std::make_unique<RoutingTracker>(std::move(parts));
}

}  // namespace gpumigrate::proc
