#include "engine/evacuation/fleet.h"

#include <fmt/format.h>

#include "engine/planner/gpu_models.h"

namespace gpumigrate::evacuation {

using agent::Json;

std::string ReplicaName(const std::string& vm) { return vm + "-replica"; }

Result<Fleet> Fleet::Open(const std::string& text, agent::Client& agents, std::chrono::milliseconds timeout) {
  Fleet f;
  f.file_ = Json::parse(text, nullptr, false);
  if (f.file_.is_discarded() || !f.file_.is_object()) return InvalidArgument("not a JSON object");
  auto inv = planner::ParseInventory(text);  // the planner's own checks, keys named
  if (!inv.ok()) return inv.status();
  f.inv_ = std::move(*inv);
  f.live_ = f.file_;
  f.agents_ = &agents;
  f.timeout_ = timeout;
  for (const auto& h : f.inv_.hosts) {
    if (h.agent.empty()) return InvalidArgument(fmt::format("host {} has no \"agent\" (ADDR:PORT)", h.name));
  }
  return f;
}

bool Fleet::HasHost(const std::string& host) const { return inv_.FindHost(host) != nullptr; }

double Fleet::LinkRate(const std::string& host) const {
  const planner::Host* h = inv_.FindHost(host);
  return h ? h->link_bytes_per_s : 0;
}

std::string Fleet::Agent(const std::string& host) const {
  const planner::Host* h = inv_.FindHost(host);
  return h ? h->agent : "";
}

int Fleet::MaxMigrations(const std::string& host) const {
  const planner::Host* h = inv_.FindHost(host);
  return h ? static_cast<int>(h->max_migrations) : 1;
}

bool Fleet::Reachable(const std::string& host) {
  auto r = agents_->Call(Agent(host), agent::Request(agent::Op::kInventory), timeout_);
  return r.ok();
}

std::optional<planner::Target> TargetOfUnits(const std::string& host, const std::vector<std::string>& units) {
  planner::Target t;
  t.host = host;
  const std::string prefix = host + "/gpu";
  for (const auto& u : units) {
    if (u.rfind(prefix, 0) != 0) return std::nullopt;
    const std::string rest = u.substr(prefix.size());  // "G", "G/sliceS" or "G/vgpuN"
    const size_t slash = rest.find('/');
    uint32_t g = 0, s = 0;
    const std::string gpu = rest.substr(0, slash);
    if (gpu.empty() || gpu.find_first_not_of("0123456789") != std::string::npos || gpu.size() > 6) return std::nullopt;
    g = static_cast<uint32_t>(std::stoul(gpu));
    if (slash != std::string::npos) {
      const std::string what = rest.substr(slash + 1);
      if (what.rfind("slice", 0) == 0 && what.size() > 5 && what.size() <= 11 &&
          what.find_first_not_of("0123456789", 5) == std::string::npos) {
        s = static_cast<uint32_t>(std::stoul(what.substr(5)));
        if (!t.placement || s < *t.placement) t.placement = s;  // a MIG profile's first slice
      } else if (what.rfind("vgpu", 0) != 0) {
        return std::nullopt;
      }
    }
    if (std::find(t.gpus.begin(), t.gpus.end(), g) == t.gpus.end()) t.gpus.push_back(g);
  }
  if (t.gpus.empty()) return std::nullopt;
  return t;
}

namespace {

// An agent's VM entry as the planner's inventory takes it: without what only
// the agents use.
Json PlannerEntry(Json e) {
  e.erase("device");
  e.erase("receive_device");
  e.erase("held");
  return e;
}

// `record` counted as occupying `to` under `name` (a VM on its way, a slot held).
Json Occupant(const Json& record, const std::string& name, const planner::Target& to) {
  Json e = PlannerEntry(record);
  e["name"] = name;
  e["host"] = to.host;
  e["gpus"] = to.gpus;
  if (to.placement) {
    e["placement"] = *to.placement;
  } else {
    e.erase("placement");
  }
  return e;
}

}  // namespace

Status Fleet::Refresh(const std::vector<InFlight>& in_flight, const std::string& evacuating,
                      const std::vector<Reservation>& elsewhere) {
  Json vms = Json::array();
  entries_.clear();
  GM_RETURN_IF_ERROR(AskAgents(evacuating, vms));
  for (const auto& m : in_flight) CountInFlight(m, vms);
  for (const auto& r : elsewhere) CountReserved(r, vms);
  for (auto& e : vms) {
    const std::string name = e.value("name", "");
    if (!stun_too_long_.count(name)) continue;
    const planner::Host* h = inv_.FindHost(e.value("host", ""));
    const int64_t too_long = 2 * MaxStunMs(name) + 1;
    e["estimate"] = {{"link", h ? h->link_text : "1Gbit"}, {"predicted_stun_ms", too_long},
                     {"predicted_total_ms", too_long}};
  }
  live_["vms"] = vms;
  auto inv = planner::ParseInventory(live_.dump(-1, ' ', false, Json::error_handler_t::replace));
  if (!inv.ok()) return Internal(fmt::format("the fleet as the agents report it: {}", inv.status().message()));
  inv_ = std::move(*inv);
  return Status::Ok();
}

Status Fleet::AskAgents(const std::string& evacuating, Json& vms) {
  std::map<std::string, Json> from_file;
  for (const auto& v : file_["vms"]) from_file[v.value("name", "")] = v;
  for (auto& h : live_["hosts"]) {
    const std::string name = h["name"];
    auto r = unreachable_.count(name) ? Result<Json>(Unavailable("unreachable before"))
                                      : agents_->Call(h["agent"].get<std::string>(), agent::Request(agent::Op::kInventory), timeout_);
    if (!r.ok() || !(*r).value("ok", false)) {
      if (name == evacuating) {
        return Unavailable(fmt::format("the agent of {} ({}) does not answer: {}", name, h["agent"].get<std::string>(),
                                       r.ok() ? r->value("error", "") : std::string(r.status().message())));
      }
      unreachable_.insert(name);
      h["maintenance"] = true;  // no target: nothing can be sent there
      for (const auto& v : file_["vms"]) {
        if (v.value("host", "") == name) vms.push_back(v);
      }
      continue;
    }
    h["maintenance"] = (*r)["host"].value("maintenance", false);
    if (auto l = learned_link_.find(name); l != learned_link_.end()) {
      h["link"] = fmt::format("{:.6g}Mbit", l->second * 8 / 1e6);
    }
    for (const auto& v : (*r)["vms"]) {
      entries_[v["name"]] = v;
      last_seen_[v["name"]] = v;
      Json e = PlannerEntry(v);
      const auto f = from_file.find(e["name"]);
      if (f != from_file.end()) {  // what the file knows and the agent does not: its estimate, max stun
        for (const char* k : {"estimate", "max_stun"}) {
          if (!e.contains(k) && f->second.contains(k)) e[k] = f->second[k];
        }
      }
      vms.push_back(e);
    }
  }
  return Status::Ok();
}

void Fleet::CountInFlight(const InFlight& m, Json& vms) const {
  // A VM on its way occupies its target slot already, and is not planned again from its source.
  const std::string at_target = m.replica ? ReplicaName(m.vm) : m.vm;
  Json kept = Json::array();
  for (auto& e : vms) {
    if (!(e.value("name", "") == m.vm && e.value("host", "") == m.source)) kept.push_back(std::move(e));
  }
  vms = std::move(kept);
  if (m.to.gpus.empty()) return;
  // Between its source's release and its target's listing no agent lists
  // it: its last record still occupies the target slot.
  const Json* record = nullptr;
  if (auto it = entries_.find(m.vm); it != entries_.end()) {
    record = &it->second;
  } else if (auto seen = last_seen_.find(m.vm); seen != last_seen_.end()) {
    record = &seen->second;
  }
  if (record == nullptr) return;
  if (auto t = entries_.find(at_target); t != entries_.end() && t->second.value("host", "") == m.to.host) {
    return;  // the target lists it already
  }
  vms.push_back(Occupant(*record, at_target + "@in-flight", m.to));
}

void Fleet::CountReserved(const Reservation& r, Json& vms) const {
  // A slot another evacuation holds: taken until its VM is listed there.
  const std::optional<planner::Target> to = TargetOfUnits(r.host, r.units);
  auto it = entries_.find(r.vm);
  if (!to || it == entries_.end()) return;  // a VM no agent of this fleet lists: its units cannot be counted
  for (const std::string& name : {r.vm, ReplicaName(r.vm)}) {
    auto t = entries_.find(name);
    if (t != entries_.end() && t->second.value("host", "") == r.host) return;  // arrived
  }
  vms.push_back(Occupant(it->second, r.vm + "@reserved", *to));
}

Result<planner::Plan> Fleet::PlanFor(const std::string& host, bool allow_power_off) const {
  planner::PlanOptions o;
  o.evacuate = host;
  o.allow_power_off = allow_power_off;
  return planner::MakePlan(inv_, o);
}

Json Fleet::Record(const std::string& vm) const {
  auto it = entries_.find(vm);
  if (it == entries_.end()) return Json::object();
  Json e = it->second;
  Json r = {{"name", vm}, {"device", e.value("device", "")}};
  if (e.contains("receive_device")) r["receive_device"] = e["receive_device"];
  for (const char* k : {"device", "receive_device", "held", "host"}) e.erase(k);
  r["inventory"] = e;
  return r;
}

int64_t Fleet::MaxStunMs(const std::string& vm) const {
  for (const auto& v : inv_.vms) {
    if (v.name == vm && v.max_stun) return std::chrono::duration_cast<std::chrono::milliseconds>(*v.max_stun).count();
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(inv_.policy.max_stun).count();
}

std::vector<std::string> Fleet::VmsOn(const std::string& host) const {
  std::vector<std::string> names;
  for (const auto& [name, e] : entries_) {
    if (e.value("host", "") == host) names.push_back(name);
  }
  return names;
}

std::vector<std::string> Fleet::Units(const std::string& vm, const planner::Target& to,
                                      const std::set<std::string>& mine) const {
  std::vector<std::string> units;
  const planner::Vm* v = nullptr;
  for (const auto& x : inv_.vms) {
    if (x.name == vm) v = &x;
  }
  const planner::Host* h = inv_.FindHost(to.host);
  if (v == nullptr || h == nullptr) return {fmt::format("{}/vm/{}", to.host, vm)};
  for (uint32_t g : to.gpus) {
    const planner::Gpu* gpu = nullptr;
    for (const auto& x : h->gpus) {
      if (x.index == g) gpu = &x;
    }
    if (gpu == nullptr) continue;
    if (gpu->mode == planner::GpuMode::kMig) {
      const planner::GpuModel* model = planner::FindGpuModel(gpu->model);
      const planner::MigProfile* p = model ? model->FindMigProfile(v->profile) : nullptr;
      const uint32_t start = to.placement.value_or(0);
      for (uint32_t s = start; p && s < start + p->slices; ++s) units.push_back(fmt::format("{}/gpu{}/slice{}", to.host, g, s));
    } else if (gpu->mode == planner::GpuMode::kPassthrough) {
      units.push_back(fmt::format("{}/gpu{}", to.host, g));
    } else {  // vGPU: equal slots, the next free one as this fleet stands
      uint32_t used = 0;
      for (const auto& x : inv_.vms) {
        if (x.host == to.host && x.name != vm && std::find(x.gpus.begin(), x.gpus.end(), g) != x.gpus.end()) ++used;
      }
      while (mine.count(fmt::format("{}/gpu{}/vgpu{}", to.host, g, used))) ++used;
      units.push_back(fmt::format("{}/gpu{}/vgpu{}", to.host, g, used));
    }
  }
  return units;
}

bool Fleet::On(const std::string& vm, const std::string& host) const {
  auto it = entries_.find(vm);
  return it != entries_.end() && it->second.value("host", "") == host;
}

bool Fleet::Held(const std::string& vm) const {
  auto it = entries_.find(vm);
  return it != entries_.end() && it->second.contains("held");
}

std::string Fleet::HeldWhy(const std::string& vm) const {
  auto it = entries_.find(vm);
  return it != entries_.end() ? it->second.value("held", "") : "";
}

}  // namespace gpumigrate::evacuation
