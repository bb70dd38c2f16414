// ParseAgentConfig: the agent's host configuration, checked key by key and then
// with the planner's own inventory rules (an inventory of this one host).
#include <set>

#include <fmt/format.h>

#include "engine/planner/json_reader.h"
#include "gpumigrate/agent/agent.h"
#include "gpumigrate/planner/planner.h"

namespace gpumigrate::agent {
namespace {

using planner::Child;
using planner::Index;
using planner::KeyError;

Result<std::vector<std::string>> ReadArgv(const planner::Json& obj, const std::string& key, const std::string& path) {
  const planner::Json& v = planner::Get(obj, key);
  std::vector<std::string> argv;
  if (v.is_null()) return argv;
  const std::string p = Child(path, key);
  if (!v.is_array() || v.empty()) return KeyError(p, "expected a command as a non-empty array of strings");
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return KeyError(Index(p, i), fmt::format("expected a string, got {}", planner::Describe(v[i])));
    argv.push_back(v[i].get<std::string>());
  }
  return argv;
}

// The groups: each goes to the planner's inventory without its hooks, which the agent keeps (cfg.hooks).
Status ReadGroups(const planner::Json& root, planner::Json& inv, AgentConfig& cfg) {
  const planner::Json& groups = planner::Get(root, "groups");
  if (!groups.is_null() && !groups.is_array()) return KeyError("groups", "expected an array");
  std::set<std::string> group_names;
  for (size_t i = 0; groups.is_array() && i < groups.size(); ++i) {
    const std::string gp = Index("groups", i);
    const planner::Json& g = groups[i];
    if (!g.is_object()) return KeyError(gp, "expected an object");
    GM_ASSIGN_OR_RETURN(auto name, planner::Required(planner::ReadString(g, "name", gp), Child(gp, "name")));
    if (!group_names.insert(name).second) return KeyError(Child(gp, "name"), fmt::format("group '{}' twice", name));
    planner::Json entry = g;
    entry.erase("hooks");
    inv["groups"].push_back(entry);
    cfg.groups.push_back(Json::parse(entry.dump()));
    const planner::Json& hooks = planner::Get(g, "hooks");
    GroupHooks h;
    if (!hooks.is_null()) {
      if (!hooks.is_object()) return KeyError(Child(gp, "hooks"), "expected an object with start_replica and drain");
      GM_ASSIGN_OR_RETURN(h.start_replica, ReadArgv(hooks, "start_replica", Child(gp, "hooks")));
      GM_ASSIGN_OR_RETURN(h.drain, ReadArgv(hooks, "drain", Child(gp, "hooks")));
    }
    cfg.hooks[name] = h;
  }
  return Status::Ok();
}

// The adopters: by name, the command that starts a process and the device that adopts it.
Status ReadAdopters(const planner::Json& root, AgentConfig& cfg) {
  const planner::Json& adopters = planner::Get(root, "adopters");
  if (!adopters.is_null() && !adopters.is_object()) {
    return KeyError("adopters", "expected an object: {\"NAME\": {\"command\": [...], \"device\": \"proc:{pid}\"}}");
  }
  for (auto it = adopters.begin(); adopters.is_object() && it != adopters.end(); ++it) {
    const std::string ap = Child("adopters", it.key());
    if (!it->is_object()) return KeyError(ap, "expected an object with \"command\" (and \"device\")");
    Adopter a;
    GM_ASSIGN_OR_RETURN(a.command, ReadArgv(*it, "command", ap));
    if (a.command.empty()) return KeyError(Child(ap, "command"), "missing: the command that starts the process");
    GM_ASSIGN_OR_RETURN(auto dev, planner::ReadString(*it, "device", ap));
    if (dev) a.device = *dev;
    if (a.device.find("{pid}") == std::string::npos) {
      return KeyError(Child(ap, "device"), fmt::format("'{}' names no {{pid}} (the adopting process)", a.device));
    }
    cfg.adopters[it.key()] = std::move(a);
  }
  return Status::Ok();
}

// The VMs: their devices stay with the agent; the rest goes to the planner's inventory, on this host.
Status ReadVms(const planner::Json& root, planner::Json& inv, AgentConfig& cfg) {
  const planner::Json& vms = planner::Get(root, "vms");
  if (!vms.is_null() && !vms.is_array()) return KeyError("vms", "expected an array");
  for (size_t i = 0; vms.is_array() && i < vms.size(); ++i) {
    const std::string vp = Index("vms", i);
    const planner::Json& v = vms[i];
    if (!v.is_object()) return KeyError(vp, "expected an object");
    VmRecord rec;
    GM_ASSIGN_OR_RETURN(rec.name, planner::Required(planner::ReadString(v, "name", vp), Child(vp, "name")));
    GM_ASSIGN_OR_RETURN(rec.device, planner::Required(planner::ReadString(v, "device", vp), Child(vp, "device")));
    if (rec.device.empty()) return KeyError(Child(vp, "device"), "is empty");
    GM_ASSIGN_OR_RETURN(auto recv, planner::ReadString(v, "receive_device", vp));
    rec.receive_device = recv.value_or("");
    if (!planner::Get(v, "host").is_null()) {
      return KeyError(Child(vp, "host"), "is given by the agent (this host); leave it out");
    }
    planner::Json entry = v;
    entry.erase("device");
    entry.erase("receive_device");
    rec.inventory = Json::parse(entry.dump());
    entry["host"] = cfg.host;
    inv["vms"].push_back(entry);
    cfg.vms.push_back(std::move(rec));
  }
  return Status::Ok();
}

}  // namespace

Result<AgentConfig> ParseAgentConfig(std::string_view json_text) {
  planner::Json root = planner::Json::parse(json_text, nullptr, false);
  if (root.is_discarded() || !root.is_object()) return InvalidArgument("the agent configuration is not a JSON object");
  GM_ASSIGN_OR_RETURN(auto version, planner::Required(planner::ReadInt(root, "version", "", 1, 1000), "version"));
  if (version != 1) return KeyError("version", fmt::format("{} is not supported (1 is)", version));
  const planner::Json& host = planner::Get(root, "host");
  if (!host.is_object()) return KeyError("host", "missing: the planner's host entry of this host (docs/planner.md)");
  AgentConfig cfg;
  GM_ASSIGN_OR_RETURN(cfg.host, planner::Required(planner::ReadString(host, "name", "host"), "host.name"));
  GM_ASSIGN_OR_RETURN(auto data, planner::ReadString(root, "data_address", ""));
  cfg.data_address = data.value_or("");
  GM_ASSIGN_OR_RETURN(auto store, planner::ReadString(root, "content_store", ""));
  cfg.content_store = store.value_or("");
  if (!cfg.content_store.empty() && cfg.content_store.front() != '/') {
    return KeyError("content_store", fmt::format("'{}' is not an absolute path", cfg.content_store));
  }
  cfg.host_entry = Json::parse(host.dump());

  // The inventory of this host alone, for the planner's checks: its errors then
  // name the same keys as this file ("vms[2].placement: ...", "host" for hosts[0]).
  planner::Json inv = {{"version", 1}, {"hosts", planner::Json::array({host})},
                       {"groups", planner::Json::array()}, {"vms", planner::Json::array()}};
  GM_RETURN_IF_ERROR(ReadGroups(root, inv, cfg));
  GM_ASSIGN_OR_RETURN(cfg.power_off, ReadArgv(root, "power_off", ""));
  GM_RETURN_IF_ERROR(ReadAdopters(root, cfg));
  GM_RETURN_IF_ERROR(ReadVms(root, inv, cfg));
  auto checked = planner::ParseInventory(inv.dump());
  if (!checked.ok()) {
    std::string m(checked.status().message());
    // hosts[0] is this file's "host".
    if (m.rfind("hosts[0]", 0) == 0) m = "host" + m.substr(8);
    return InvalidArgument(m);
  }
  cfg.max_migrations = static_cast<int>(checked->hosts[0].max_migrations);
  for (const auto& g : checked->groups) {
    if (!cfg.hooks.count(g.name)) cfg.hooks[g.name] = GroupHooks{};
  }
  return cfg;
}

}  // namespace gpumigrate::agent
