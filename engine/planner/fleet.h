// The fleet's GPU occupancy during planning: what every GPU of every host holds
// (MIG slices and instance count, vGPU size and count, passthrough ownership),
// which hosts are targets, and the slot a VM needs. Placement applies and undoes
// slots here while it searches.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/planner/gpu_models.h"
#include "gpumigrate/planner/planner.h"

namespace gpumigrate::planner {

struct GpuState {
  uint8_t mask = 0;  // MIG slices in use
  uint32_t instances = 0;
  uint64_t vgpu_size = 0;  // vGPU: the size every vGPU on it has (0 when none)
  uint32_t vgpus = 0;
  bool passthrough_used = false;
};

// What a VM (or its replacement) needs on a target.
struct SlotNeed {
  SlotKind kind = SlotKind::kMig;
  const GpuModel* model = nullptr;
  const MigProfile* mig = nullptr;  // kMig
  uint64_t vgpu_bytes = 0;          // kVgpu
  uint32_t gpus = 1;                // kVgpu, kPassthrough: GPUs on one host
  std::string group;                // for spreading replicas
  // Per host of the inventory: whether the VM may take a slot there (its stun at
  // that host's link, alone on it, is within its max stun). Empty: every target.
  std::vector<uint8_t> target_ok;
  bool TargetOk(uint32_t host) const { return target_ok.empty() || target_ok[host]; }
  // Per host: whether its content store holds the VM's weights (Host::models):
  // preferred where capacity allows. Empty: none does.
  std::vector<uint8_t> holds;
  bool Holds(uint32_t host) const { return !holds.empty() && holds[host]; }
  std::string Describe() const;     // "H100-80GB GPU with a free 3g.40gb start slice" (no article)
};

SlotNeed NeedOf(const Inventory& inv, const Vm& vm);

// Where a slot lies: a host and GPU positions in Host::gpus (not GPU indices).
struct Slot {
  uint32_t host = 0;
  std::vector<uint32_t> gpu_pos;
  std::optional<uint32_t> start;  // kMig
};

class Fleet {
 public:
  // Occupancy from every VM of the inventory; targets are the hosts that are
  // neither `evacuate` nor in maintenance.
  Fleet(const Inventory& inv, std::string_view evacuate);

  const Inventory& inventory() const { return *inv_; }
  const std::vector<uint32_t>& targets() const { return targets_; }
  const GpuState& gpu(uint32_t host, uint32_t pos) const { return gpus_[host][pos]; }
  const Gpu& gpu_info(uint32_t host, uint32_t pos) const { return inv_->hosts[host].gpus[pos]; }

  // Whether a GPU is of the need's model and mode (cheap: no occupancy).
  bool SameKind(const SlotNeed& need, uint32_t host, uint32_t pos) const {
    return models_[host][pos] == need.model && modes_[host][pos] == need.kind;
  }
  // Whether one GPU can take one unit of `need` (one instance at `start` for MIG).
  bool Fits(const SlotNeed& need, uint32_t host, uint32_t pos, std::optional<uint32_t> start) const;
  void Apply(const SlotNeed& need, const Slot& slot);
  void Undo(const SlotNeed& need, const Slot& slot);

  // Replicas of `group` on `host` (in the inventory and placed so far).
  uint32_t GroupCount(uint32_t host, const std::string& group) const;
  // VMs placed on `host` by this plan.
  uint32_t Placed(uint32_t host) const { return placed_[host]; }

 private:
  void Change(const SlotNeed& need, const Slot& slot, int sign);

  const Inventory* inv_;
  std::vector<std::vector<GpuState>> gpus_;
  std::vector<std::vector<const GpuModel*>> models_;
  std::vector<std::vector<SlotKind>> modes_;  // the kind of slot each GPU's mode holds
  std::vector<uint32_t> targets_;
  std::vector<uint32_t> placed_;
  std::vector<std::vector<std::pair<std::string, uint32_t>>> groups_;  // per host
};

// How many instances of each MIG profile (largest first) could still be placed on
// a GPU in this state: its capacity for future VMs; free slices no valid start
// can use count for nothing (fragmentation).
const std::vector<uint32_t>& MigCapacity(const GpuModel& model, uint8_t mask, uint32_t instances);

}  // namespace gpumigrate::planner
