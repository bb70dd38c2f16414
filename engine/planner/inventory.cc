// ParseInventory: docs/planner.md's inventory, checked key by key and then for
// consistency (VMs on known hosts and GPUs, profiles their GPU's mode holds, MIG
// instances at valid starts that do not overlap, at most 7 per GPU, one vGPU
// size per GPU within its memory, a passthrough GPU owned by one VM).
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "engine/planner/estimate_json.h"
#include "engine/planner/gpu_models.h"
#include "engine/planner/json_reader.h"
#include "gpumigrate/planner/planner.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::planner {

const Host* Inventory::FindHost(std::string_view name) const {
  for (const auto& h : hosts) {
    if (h.name == name) return &h;
  }
  return nullptr;
}

const Group* Inventory::FindGroup(std::string_view name) const {
  for (const auto& g : groups) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

uint64_t FrameBufferBytes(const Vm& vm) { return vm.bytes_per_gpu * vm.gpus.size(); }

namespace {

Result<Json> AsObject(const Json& v, const std::string& path) {
  if (!v.is_object()) return KeyError(path, fmt::format("expected an object, got {}", Describe(v)));
  return v;
}

const Json& ArrayAt(const Json& root, const std::string& key, bool* ok) {
  const Json& v = Get(root, key);
  *ok = v.is_array() || v.is_null();
  return v;
}

Result<Policy> ParsePolicy(const Json& root) {
  Policy p;
  const Json& v = Get(root, "policy");
  if (v.is_null()) return p;
  GM_RETURN_IF_ERROR(AsObject(v, "policy").status());
  GM_ASSIGN_OR_RETURN(auto stun, ReadDuration(v, "max_stun", "policy"));
  if (stun) p.max_stun = *stun;
  GM_ASSIGN_OR_RETURN(auto power, ReadBool(v, "allow_power_off", "policy"));
  if (power) p.allow_power_off = *power;
  GM_ASSIGN_OR_RETURN(auto drain, ReadDuration(v, "drain", "policy"));
  if (drain) p.drain = *drain;
  GM_ASSIGN_OR_RETURN(auto factor, ReadNumber(v, "budget_factor", "policy", 1.0));
  if (factor) p.budget_factor = *factor;
  GM_ASSIGN_OR_RETURN(auto budget_min, ReadDuration(v, "budget_min", "policy"));
  if (budget_min) p.budget_min = *budget_min;
  GM_ASSIGN_OR_RETURN(auto overhead, ReadDuration(v, "migration_overhead", "policy"));
  if (overhead) p.migration_overhead = *overhead;
  GM_ASSIGN_OR_RETURN(auto interval, ReadDuration(v, "start_interval", "policy"));
  if (interval) p.start_interval = *interval;
  GM_ASSIGN_OR_RETURN(auto efficiency, ReadNumber(v, "link_efficiency", "policy", 0.01));
  if (efficiency) {
    if (*efficiency > 1) return KeyError("policy.link_efficiency", fmt::format("{} is more than 1", *efficiency));
    p.link_efficiency = *efficiency;
  }
  return p;
}

Result<GpuMode> ParseMode(const std::string& s, const std::string& path) {
  if (s == "mig") return GpuMode::kMig;
  if (s == "vgpu") return GpuMode::kVgpu;
  if (s == "passthrough") return GpuMode::kPassthrough;
  return KeyError(path, fmt::format("unknown mode '{}' (mig, vgpu, passthrough)", s));
}

Result<Host> ParseHost(const Json& h, const std::string& path) {
  GM_RETURN_IF_ERROR(AsObject(h, path).status());
  Host host;
  GM_ASSIGN_OR_RETURN(host.name, Required(ReadString(h, "name", path), Child(path, "name")));
  if (host.name.empty()) return KeyError(Child(path, "name"), "is empty");
  GM_ASSIGN_OR_RETURN(host.link_text, Required(ReadString(h, "link", path), Child(path, "link")));
  GM_ASSIGN_OR_RETURN(host.link_bytes_per_s, Required(ReadRate(h, "link", path), Child(path, "link")));
  GM_ASSIGN_OR_RETURN(auto maxm, ReadInt(h, "max_migrations", path, 1, 1000));
  if (maxm) host.max_migrations = static_cast<uint32_t>(*maxm);
  GM_ASSIGN_OR_RETURN(auto maint, ReadBool(h, "maintenance", path));
  host.maintenance = maint.value_or(false);
  GM_ASSIGN_OR_RETURN(auto agent, ReadString(h, "agent", path));
  host.agent = agent.value_or("");
  const Json& models = Get(h, "models");
  if (!models.is_null() && !models.is_array()) return KeyError(Child(path, "models"), "expected an array of model names");
  for (size_t i = 0; models.is_array() && i < models.size(); ++i) {
    if (!models[i].is_string() || models[i].get<std::string>().empty()) {
      return KeyError(fmt::format("{}[{}]", Child(path, "models"), i), "expected a model name (a non-empty string)");
    }
    host.models.insert(models[i].get<std::string>());
  }
  const std::string gpath = Child(path, "gpus");
  const Json& gpus = Get(h, "gpus");
  if (!gpus.is_array() && !gpus.is_null()) return KeyError(gpath, "expected an array of GPUs");
  std::set<uint32_t> seen;
  for (size_t i = 0; !gpus.is_null() && i < gpus.size(); ++i) {
    const std::string gp = Index(gpath, i);
    GM_RETURN_IF_ERROR(AsObject(gpus[i], gp).status());
    Gpu g;
    GM_ASSIGN_OR_RETURN(int64_t index, Required(ReadInt(gpus[i], "index", gp, 0, 1023), Child(gp, "index")));
    g.index = static_cast<uint32_t>(index);
    if (!seen.insert(g.index).second) {
      return KeyError(Child(gp, "index"), fmt::format("host {} already has a GPU {}", host.name, g.index));
    }
    GM_ASSIGN_OR_RETURN(g.model, Required(ReadString(gpus[i], "model", gp), Child(gp, "model")));
    if (!FindGpuModel(g.model)) {
      return KeyError(Child(gp, "model"), fmt::format("unknown GPU model '{}' (known: {})", g.model,
                                                      KnownGpuModelNames()));
    }
    GM_ASSIGN_OR_RETURN(std::string mode, Required(ReadString(gpus[i], "mode", gp), Child(gp, "mode")));
    GM_ASSIGN_OR_RETURN(g.mode, ParseMode(mode, Child(gp, "mode")));
    host.gpus.push_back(std::move(g));
  }
  return host;
}

Result<Group> ParseGroup(const Json& g, const std::string& path, const Policy& policy) {
  GM_RETURN_IF_ERROR(AsObject(g, path).status());
  Group group;
  GM_ASSIGN_OR_RETURN(group.name, Required(ReadString(g, "name", path), Child(path, "name")));
  if (group.name.empty()) return KeyError(Child(path, "name"), "is empty");
  GM_ASSIGN_OR_RETURN(int64_t min, Required(ReadInt(g, "min_serving", path, 0, 1'000'000), Child(path, "min_serving")));
  group.min_serving = static_cast<uint32_t>(min);
  GM_ASSIGN_OR_RETURN(group.replica_start,
                      Required(ReadDuration(g, "replica_start", path), Child(path, "replica_start")));
  GM_ASSIGN_OR_RETURN(auto drain, ReadDuration(g, "drain", path));
  group.drain = drain.value_or(policy.drain);
  return group;
}

Result<VmClass> ParseClass(const std::string& s, const std::string& path) {
  if (s == "inference") return VmClass::kInference;
  if (s == "stateless-inference") return VmClass::kStatelessInference;
  if (s == "training") return VmClass::kTraining;
  if (s == "graphics") return VmClass::kGraphics;
  return KeyError(path, fmt::format("unknown class '{}' (inference, stateless-inference, training, graphics)", s));
}

// Per GPU of the inventory, what its VMs hold so far (for the consistency checks).
struct Held {
  uint8_t mask = 0;
  uint32_t instances = 0;
  uint64_t vgpu_size = 0;
  uint32_t vgpus = 0;
  std::vector<std::pair<std::string, uint8_t>> owners;  // MIG: VM and its slices
  std::string passthrough_owner;
};

std::string Slices(uint8_t mask) {
  int lo = -1, hi = -1;
  for (int s = 0; s < 8; ++s) {
    if ((mask >> s) & 1) {
      if (lo < 0) lo = s;
      hi = s;
    }
  }
  return fmt::format("[{}, {})", lo, hi + 1);
}

using HeldMap = std::map<std::pair<std::string, uint32_t>, Held>;

// What placing one VM needs to know while its profile is checked.
struct VmPlace {
  Vm& vm;
  const Host& host;
  const GpuModel& model;
  const std::vector<const Gpu*>& gpu_of;  // the VM's GPUs, in vm.gpus order
  HeldMap& held;
  std::string gpath, ppath, plpath;       // the keys errors name
};

// "gpus": known GPUs of the VM's host, each once, all of one model.
Result<std::vector<const Gpu*>> ParseVmGpus(const Json& v, const std::string& gpath, const Host& host, Vm& vm) {
  const Json& gpus = Get(v, "gpus");
  if (!gpus.is_array() || gpus.empty()) return KeyError(gpath, "expected a non-empty array of GPU indices");
  std::vector<const Gpu*> gpu_of;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const std::string gp = Index(gpath, i);
    if (!gpus[i].is_number_integer() || gpus[i].get<int64_t>() < 0 || gpus[i].get<int64_t>() > 1023) {
      return KeyError(gp, fmt::format("expected a GPU index, got {}", Describe(gpus[i])));
    }
    uint32_t idx = gpus[i].get<uint32_t>();
    auto it = std::find_if(host.gpus.begin(), host.gpus.end(), [&](const Gpu& g) { return g.index == idx; });
    if (it == host.gpus.end()) return KeyError(gp, fmt::format("host {} has no GPU {}", host.name, idx));
    if (std::find(vm.gpus.begin(), vm.gpus.end(), idx) != vm.gpus.end()) {
      return KeyError(gp, fmt::format("GPU {} is listed twice", idx));
    }
    vm.gpus.push_back(idx);
    gpu_of.push_back(&*it);
  }
  for (size_t i = 1; i < gpu_of.size(); ++i) {
    if (gpu_of[i]->model != gpu_of[0]->model) {
      return KeyError(Index(gpath, i), fmt::format("GPU {} is a {}, GPU {} a {}: a VM's GPUs are one model",
                                                   vm.gpus[i], gpu_of[i]->model, vm.gpus[0], gpu_of[0]->model));
    }
  }
  return gpu_of;
}

std::string_view ModeName(GpuMode m) {
  return m == GpuMode::kMig ? "mig" : m == GpuMode::kVgpu ? "vgpu" : "passthrough";
}

// Every GPU of the VM is in `mode`, the one its profile needs.
Status RequireMode(const VmPlace& p, GpuMode mode) {
  for (size_t i = 0; i < p.gpu_of.size(); ++i) {
    if (p.gpu_of[i]->mode != mode) {
      return KeyError(p.ppath, fmt::format("'{}' needs a {} GPU, but {} GPU {} is in {} mode", p.vm.profile,
                                           ModeName(mode), p.host.name, p.vm.gpus[i], ModeName(p.gpu_of[i]->mode)));
    }
  }
  return Status::Ok();
}

Status PlacePassthrough(VmPlace& p, std::optional<int64_t> placement) {
  p.vm.kind = SlotKind::kPassthrough;
  GM_RETURN_IF_ERROR(RequireMode(p, GpuMode::kPassthrough));
  if (placement) return KeyError(p.plpath, "only a MIG instance has a start slice; use null");
  p.vm.bytes_per_gpu = p.model.memory_bytes;
  for (uint32_t idx : p.vm.gpus) {
    Held& h = p.held[{p.vm.host, idx}];
    if (!h.passthrough_owner.empty()) {
      return KeyError(p.gpath, fmt::format("{} GPU {} is already passed through to {}", p.vm.host, idx,
                                           h.passthrough_owner));
    }
    h.passthrough_owner = p.vm.name;
  }
  return Status::Ok();
}

Status PlaceVgpu(VmPlace& p, std::optional<int64_t> placement) {
  Vm& vm = p.vm;
  vm.kind = SlotKind::kVgpu;
  GM_RETURN_IF_ERROR(RequireMode(p, GpuMode::kVgpu));
  if (placement) return KeyError(p.plpath, "only a MIG instance has a start slice; use null");
  auto size = ParseSize(std::string_view(vm.profile).substr(5));
  if (!size.ok() || *size == 0) {
    return KeyError(p.ppath, fmt::format("'{}': the vGPU frame buffer must be a positive size, e.g. vgpu:20GB",
                                         vm.profile));
  }
  if (*size > p.model.memory_bytes) {
    return KeyError(p.ppath, fmt::format("'{}' is larger than a {} ({})", vm.profile, p.model.name,
                                         DecimalGB(p.model.memory_bytes)));
  }
  vm.bytes_per_gpu = *size;
  for (uint32_t idx : vm.gpus) {
    Held& h = p.held[{vm.host, idx}];
    if (h.vgpus > 0 && h.vgpu_size != *size) {
      return KeyError(p.ppath, fmt::format("{} GPU {} already holds vGPUs of {}: every vGPU on a time-sliced "
                                           "GPU has the same size",
                                           vm.host, idx, DecimalGB(h.vgpu_size)));
    }
    if ((h.vgpus + 1) * *size > p.model.memory_bytes) {
      return KeyError(p.ppath, fmt::format("{} GPU {} would hold {} vGPUs of {}: more than its {}", vm.host, idx,
                                           h.vgpus + 1, DecimalGB(*size), DecimalGB(p.model.memory_bytes)));
    }
    h.vgpu_size = *size;
    ++h.vgpus;
  }
  return Status::Ok();
}

// A MIG instance: a valid start slice on one GPU, overlapping no other instance.
Status PlaceMig(VmPlace& p, std::optional<int64_t> placement) {
  Vm& vm = p.vm;
  vm.kind = SlotKind::kMig;
  const MigProfile* prof = p.model.FindMigProfile(vm.profile);
  if (!prof) {
    return KeyError(p.ppath, fmt::format("unknown profile '{}' for {} (MIG: {}; or vgpu:SIZE, passthrough)",
                                         vm.profile, p.model.name, p.model.MigProfileNames()));
  }
  GM_RETURN_IF_ERROR(RequireMode(p, GpuMode::kMig));
  if (vm.gpus.size() != 1) return KeyError(p.gpath, "a MIG instance lives on exactly one GPU");
  if (!placement) return KeyError(p.plpath, fmt::format("missing: the start slice of the {} instance", vm.profile));
  if (*placement < 0 || !prof->ValidStart(static_cast<uint32_t>(*placement))) {
    std::string starts;
    for (uint32_t s = 0; s < 8; ++s) {
      if (prof->ValidStart(s)) starts += fmt::format("{}{}", starts.empty() ? "" : " ", s);
    }
    return KeyError(p.plpath, fmt::format("slot {} is not a valid start for {} (valid: {})", *placement, vm.profile,
                                          starts));
  }
  vm.placement = static_cast<uint32_t>(*placement);
  vm.bytes_per_gpu = prof->bytes;
  Held& h = p.held[{vm.host, vm.gpus[0]}];
  uint8_t mask = prof->Mask(*vm.placement);
  for (const auto& [other, omask] : h.owners) {
    if (omask & mask) {
      return KeyError(p.plpath, fmt::format("slices {} of {} GPU {} overlap {}'s slices {}", Slices(mask), vm.host,
                                            vm.gpus[0], other, Slices(omask)));
    }
  }
  if (h.instances + 1 > p.model.mig_max_instances) {
    return KeyError(p.plpath, fmt::format("{} GPU {} would hold {} MIG instances: at most {}", vm.host, vm.gpus[0],
                                          h.instances + 1, p.model.mig_max_instances));
  }
  h.mask = static_cast<uint8_t>(h.mask | mask);
  ++h.instances;
  h.owners.emplace_back(vm.name, mask);
  return Status::Ok();
}

// class, group, uvm, max_stun and estimate: what follows the VM's placement.
Status ParseVmRest(const Json& v, const std::string& path, const Inventory& inv, Vm& vm) {
  GM_ASSIGN_OR_RETURN(std::string cls, Required(ReadString(v, "class", path), Child(path, "class")));
  GM_ASSIGN_OR_RETURN(vm.vm_class, ParseClass(cls, Child(path, "class")));
  GM_ASSIGN_OR_RETURN(auto group, ReadString(v, "group", path));
  if (group) {
    if (!inv.FindGroup(*group)) return KeyError(Child(path, "group"), fmt::format("unknown group '{}'", *group));
    vm.group = *group;
  }
  GM_ASSIGN_OR_RETURN(auto model, ReadString(v, "model", path));
  vm.model = model.value_or("");
  GM_ASSIGN_OR_RETURN(auto uvm, ReadBool(v, "uvm", path));
  vm.uvm = uvm.value_or(false);
  if (vm.kind == SlotKind::kVgpu && vm.gpus.size() > 1 && !vm.uvm) {
    vm.uvm = true;  // docs/planner.md: multi-GPU vGPU VMs always use UVM
    vm.uvm_implied = true;
  }
  GM_ASSIGN_OR_RETURN(vm.max_stun, ReadDuration(v, "max_stun", path));
  const Json& est = Get(v, "estimate");
  if (!est.is_null()) {
    GM_ASSIGN_OR_RETURN(vm.estimate, ParseVmEstimate(est, Child(path, "estimate")));
  }
  return Status::Ok();
}

Result<Vm> ParseVm(const Json& v, const std::string& path, const Inventory& inv, HeldMap& held) {
  GM_RETURN_IF_ERROR(AsObject(v, path).status());
  Vm vm;
  GM_ASSIGN_OR_RETURN(vm.name, Required(ReadString(v, "name", path), Child(path, "name")));
  if (vm.name.empty()) return KeyError(Child(path, "name"), "is empty");
  GM_ASSIGN_OR_RETURN(vm.host, Required(ReadString(v, "host", path), Child(path, "host")));
  const Host* host = inv.FindHost(vm.host);
  if (!host) return KeyError(Child(path, "host"), fmt::format("unknown host '{}'", vm.host));
  const std::string gpath = Child(path, "gpus");
  GM_ASSIGN_OR_RETURN(std::vector<const Gpu*> gpu_of, ParseVmGpus(v, gpath, *host, vm));

  VmPlace place{vm, *host, *FindGpuModel(gpu_of[0]->model), gpu_of, held, gpath, Child(path, "profile"),
                Child(path, "placement")};
  GM_ASSIGN_OR_RETURN(vm.profile, Required(ReadString(v, "profile", path), place.ppath));
  GM_ASSIGN_OR_RETURN(auto placement, ReadInt(v, "placement", path, INT64_MIN, INT64_MAX));
  if (vm.profile == "passthrough") {
    GM_RETURN_IF_ERROR(PlacePassthrough(place, placement));
  } else if (vm.profile.rfind("vgpu:", 0) == 0) {
    GM_RETURN_IF_ERROR(PlaceVgpu(place, placement));
  } else {
    GM_RETURN_IF_ERROR(PlaceMig(place, placement));
  }
  GM_RETURN_IF_ERROR(ParseVmRest(v, path, inv, vm));
  return vm;
}

}  // namespace

Result<Inventory> ParseInventory(std::string_view text) {
  Json root = Json::parse(text.begin(), text.end(), nullptr, false);
  if (root.is_discarded()) {
    // Parse again with exceptions off but a position: nlohmann only reports it by throwing.
    try {
      Json again = Json::parse(text.begin(), text.end());
      (void)again;
    } catch (const Json::parse_error& e) {
      return InvalidArgument(fmt::format("not JSON: {}", e.what()));
    }
    return InvalidArgument("not JSON");
  }
  if (!root.is_object()) return InvalidArgument(fmt::format("expected a JSON object, got {}", Describe(root)));
  GM_ASSIGN_OR_RETURN(auto version, ReadInt(root, "version", "", INT64_MIN, INT64_MAX));
  if (version && *version != 1) {
    return KeyError("version", fmt::format("format version {} is not supported (this planner reads version 1)",
                                           *version));
  }
  Inventory inv;
  GM_ASSIGN_OR_RETURN(inv.policy, ParsePolicy(root));

  bool ok = true;
  const Json& hosts = ArrayAt(root, "hosts", &ok);
  if (!ok || hosts.is_null()) return KeyError("hosts", "expected an array of hosts");
  for (size_t i = 0; i < hosts.size(); ++i) {
    GM_ASSIGN_OR_RETURN(Host h, ParseHost(hosts[i], Index("hosts", i)));
    if (inv.FindHost(h.name)) return KeyError(Index("hosts", i) + ".name", fmt::format("host '{}' twice", h.name));
    inv.hosts.push_back(std::move(h));
  }
  const Json& groups = ArrayAt(root, "groups", &ok);
  if (!ok) return KeyError("groups", "expected an array of groups");
  for (size_t i = 0; !groups.is_null() && i < groups.size(); ++i) {
    GM_ASSIGN_OR_RETURN(Group g, ParseGroup(groups[i], Index("groups", i), inv.policy));
    if (inv.FindGroup(g.name)) {
      return KeyError(Index("groups", i) + ".name", fmt::format("group '{}' twice", g.name));
    }
    inv.groups.push_back(std::move(g));
  }
  const Json& vms = ArrayAt(root, "vms", &ok);
  if (!ok) return KeyError("vms", "expected an array of VMs");
  HeldMap held;
  std::set<std::string> names;
  for (size_t i = 0; !vms.is_null() && i < vms.size(); ++i) {
    GM_ASSIGN_OR_RETURN(Vm vm, ParseVm(vms[i], Index("vms", i), inv, held));
    if (!names.insert(vm.name).second) {
      return KeyError(Index("vms", i) + ".name", fmt::format("VM '{}' twice", vm.name));
    }
    inv.vms.push_back(std::move(vm));
  }
  return inv;
}

}  // namespace gpumigrate::planner
