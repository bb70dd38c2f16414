#include "engine/planner/fleet.h"

#include <algorithm>
#include <bit>

#include <fmt/format.h>

#include "gpumigrate/common/units.h"

namespace gpumigrate::planner {

std::string SlotNeed::Describe() const {
  switch (kind) {
    case SlotKind::kMig: return fmt::format("{} GPU with a free {} start slice", model->name, mig->name);
    case SlotKind::kVgpu:
      return gpus == 1 ? fmt::format("{} vGPU GPU with room for a {} vGPU", model->name,
                                     DecimalGB(vgpu_bytes))
                       : fmt::format("host with {} {} vGPU GPUs each with room for a {} vGPU", gpus, model->name,
                                     DecimalGB(vgpu_bytes));
    case SlotKind::kPassthrough:
      return fmt::format("host with {} free {} passthrough GPU{}", gpus, model->name, gpus == 1 ? "" : "s");
  }
  return "a slot";
}

SlotNeed NeedOf(const Inventory& inv, const Vm& vm) {
  SlotNeed n;
  n.kind = vm.kind;
  const Host* h = inv.FindHost(vm.host);
  for (const auto& g : h->gpus) {
    if (g.index == vm.gpus.front()) n.model = FindGpuModel(g.model);
  }
  if (vm.kind == SlotKind::kMig) n.mig = n.model->FindMigProfile(vm.profile);
  n.vgpu_bytes = vm.bytes_per_gpu;
  n.gpus = static_cast<uint32_t>(vm.gpus.size());
  n.group = vm.group;
  if (!vm.model.empty()) {
    for (const Host& t : inv.hosts) n.holds.push_back(t.Holds(vm.model) ? 1 : 0);
  }
  return n;
}

Fleet::Fleet(const Inventory& inv, std::string_view evacuate) : inv_(&inv) {
  gpus_.resize(inv.hosts.size());
  placed_.assign(inv.hosts.size(), 0);
  groups_.resize(inv.hosts.size());
  for (uint32_t h = 0; h < inv.hosts.size(); ++h) {
    gpus_[h].resize(inv.hosts[h].gpus.size());
    for (const Gpu& g : inv.hosts[h].gpus) {
      models_.resize(inv.hosts.size());
      modes_.resize(inv.hosts.size());
      models_[h].push_back(FindGpuModel(g.model));
      modes_[h].push_back(g.mode == GpuMode::kMig    ? SlotKind::kMig
                          : g.mode == GpuMode::kVgpu ? SlotKind::kVgpu
                                                     : SlotKind::kPassthrough);
    }
    if (inv.hosts[h].name != evacuate && !inv.hosts[h].maintenance) targets_.push_back(h);
  }
  for (const Vm& vm : inv.vms) {
    uint32_t h = static_cast<uint32_t>(inv.FindHost(vm.host) - inv.hosts.data());
    Slot slot{h, {}, vm.placement};
    for (uint32_t idx : vm.gpus) {
      const auto& gl = inv.hosts[h].gpus;
      slot.gpu_pos.push_back(static_cast<uint32_t>(
          std::find_if(gl.begin(), gl.end(), [&](const Gpu& g) { return g.index == idx; }) - gl.begin()));
    }
    Change(NeedOf(inv, vm), slot, +1);
  }
  std::fill(placed_.begin(), placed_.end(), 0);
}

bool Fleet::Fits(const SlotNeed& need, uint32_t host, uint32_t pos, std::optional<uint32_t> start) const {
  if (!SameKind(need, host, pos)) return false;
  const GpuState& g = gpus_[host][pos];
  switch (need.kind) {
    case SlotKind::kMig:
      return start && need.mig->ValidStart(*start) && (g.mask & need.mig->Mask(*start)) == 0 &&
             g.instances < need.model->mig_max_instances;
    case SlotKind::kVgpu:
      return (g.vgpus == 0 || g.vgpu_size == need.vgpu_bytes) &&
             (g.vgpus + 1) * need.vgpu_bytes <= need.model->memory_bytes;
    case SlotKind::kPassthrough: return !g.passthrough_used;
  }
  return false;
}

void Fleet::Change(const SlotNeed& need, const Slot& slot, int sign) {
  for (uint32_t pos : slot.gpu_pos) {
    GpuState& g = gpus_[slot.host][pos];
    switch (need.kind) {
      case SlotKind::kMig:
        g.mask = static_cast<uint8_t>(sign > 0 ? g.mask | need.mig->Mask(*slot.start)
                                               : g.mask & ~need.mig->Mask(*slot.start));
        g.instances += sign;
        break;
      case SlotKind::kVgpu:
        g.vgpus += sign;
        g.vgpu_size = g.vgpus ? need.vgpu_bytes : 0;
        break;
      case SlotKind::kPassthrough: g.passthrough_used = sign > 0; break;
    }
  }
  placed_[slot.host] += sign;
  if (!need.group.empty()) {
    auto& gl = groups_[slot.host];
    auto it = std::find_if(gl.begin(), gl.end(), [&](const auto& p) { return p.first == need.group; });
    if (it == gl.end()) it = gl.insert(gl.end(), {need.group, 0});
    it->second += sign;
  }
}

void Fleet::Apply(const SlotNeed& need, const Slot& slot) { Change(need, slot, +1); }
void Fleet::Undo(const SlotNeed& need, const Slot& slot) { Change(need, slot, -1); }

std::vector<GpuOccupancy> HostOccupancy(const Inventory& inv, std::string_view host) {
  std::vector<GpuOccupancy> out;
  const Host* h = inv.FindHost(host);
  if (h == nullptr) return out;
  const uint32_t hi = static_cast<uint32_t>(h - inv.hosts.data());
  Fleet fleet(inv, "");
  for (uint32_t pos = 0; pos < h->gpus.size(); ++pos) {
    const Gpu& g = h->gpus[pos];
    const GpuState& st = fleet.gpu(hi, pos);
    const GpuModel* model = FindGpuModel(g.model);
    GpuOccupancy o;
    o.index = g.index;
    o.mode = g.mode;
    o.memory_bytes = model ? model->memory_bytes : 0;
    o.mig_slices = g.mode == GpuMode::kMig && model ? model->mig_slices : 0;
    o.mig_slices_used = static_cast<uint32_t>(std::popcount(static_cast<unsigned>(st.mask)));
    o.vgpu_bytes_used = st.vgpu_size * st.vgpus;
    o.passthrough_used = st.passthrough_used;
    for (const Vm& vm : inv.vms) {
      if (vm.host == h->name && std::find(vm.gpus.begin(), vm.gpus.end(), g.index) != vm.gpus.end()) ++o.vms;
    }
    out.push_back(o);
  }
  return out;
}

uint32_t Fleet::GroupCount(uint32_t host, const std::string& group) const {
  for (const auto& [name, n] : groups_[host]) {
    if (name == group) return n;
  }
  return 0;
}

namespace {

std::vector<uint32_t> ComputeMigCapacity(const GpuModel& model, uint8_t mask, uint32_t instances) {
  std::vector<uint32_t> caps;
  uint32_t room = instances < model.mig_max_instances ? model.mig_max_instances - instances : 0;
  for (const MigProfile& p : model.mig_profiles) {
    uint8_t m = mask;
    uint32_t n = 0;
    for (uint32_t s = 0; s < model.mig_slices && n < room; ++s) {
      if (p.ValidStart(s) && (m & p.Mask(s)) == 0) {
        m = static_cast<uint8_t>(m | p.Mask(s));
        ++n;
      }
    }
    caps.push_back(n);
  }
  return caps;
}

}  // namespace

const std::vector<uint32_t>& MigCapacity(const GpuModel& model, uint8_t mask, uint32_t instances) {
  // Every (mask, instance count) of every known model, computed once: placement
  // asks for it for every candidate slice of every GPU.
  struct Table {
    std::vector<const GpuModel*> models;
    std::vector<std::vector<uint32_t>> caps;  // [model][mask][instances 0..8]
  };
  static const Table table = [] {
    Table t;
    for (std::string_view name : {"A100-80GB", "H100-80GB"}) {
      const GpuModel* m = FindGpuModel(name);
      t.models.push_back(m);
      for (uint32_t bits = 0; bits < 256; ++bits) {
        for (uint32_t n = 0; n <= 8; ++n) t.caps.push_back(ComputeMigCapacity(*m, static_cast<uint8_t>(bits), n));
      }
    }
    return t;
  }();
  for (size_t i = 0; i < table.models.size(); ++i) {
    if (table.models[i] == &model) return table.caps[(i * 256 + mask) * 9 + std::min<uint32_t>(instances, 8)];
  }
  thread_local std::vector<uint32_t> other;
  other = ComputeMigCapacity(model, mask, instances);
  return other;
}

}  // namespace gpumigrate::planner
