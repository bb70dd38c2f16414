// What an evacuation (controller.cc) knows of the fleet: the inventory file (hosts,
// agents, groups, policy, estimates) with each host's VMs as its agent reports
// them now, the VMs in flight counted at their targets, and what the
// evacuation has learned (agents gone, migrations that would exceed max stun).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpumigrate/agent/agent.h"
#include "gpumigrate/evacuation/evacuation_store.h"
#include "gpumigrate/planner/planner.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::evacuation {

// A VM being moved: it occupies its target slot already, and is no longer
// planned from its source.
struct InFlight {
  std::string vm, source;
  planner::Target to;
  bool replica = false;
};

// The name a replacement replica gets on its new host.
std::string ReplicaName(const std::string& vm);

// The target slot a reservation's units name (the inverse of Fleet::Units):
// nullopt when they name no GPU of one host (a unit "HOST/vm/NAME").
std::optional<planner::Target> TargetOfUnits(const std::string& host, const std::vector<std::string>& units);

class Fleet {
 public:
  // `agents` outlives the Fleet.
  static Result<Fleet> Open(const std::string& inventory_text, agent::Client& agents, std::chrono::milliseconds timeout);
  bool HasHost(const std::string& host) const;
  // Asks every agent for its VMs; an agent that does not answer makes its host
  // no target (and is an error for `evacuating`, whose VMs must be known).
  // `elsewhere`: slots other evacuations hold in the store; each is counted
  // as taken (by a copy of the VM it is for) until its target lists that VM.
  Status Refresh(const std::vector<InFlight>& in_flight, const std::string& evacuating = "",
                 const std::vector<Reservation>& elsewhere = {});
  Result<planner::Plan> PlanFor(const std::string& host, bool allow_power_off) const;

  std::string Agent(const std::string& host) const;
  int MaxMigrations(const std::string& host) const;
  // The agent record of a VM for receive / start-replica: name, device, inventory.
  agent::Json Record(const std::string& vm) const;
  // The capacity units a VM takes at `to` (the store's reservation units); a
  // vGPU slot is the next one neither in use nor in `mine` (held already).
  std::vector<std::string> Units(const std::string& vm, const planner::Target& to,
                                 const std::set<std::string>& mine) const;
  // The VMs the agent of `host` lists now.
  std::vector<std::string> VmsOn(const std::string& host) const;
  int64_t MaxStunMs(const std::string& vm) const;
  bool On(const std::string& vm, const std::string& host) const;
  bool Held(const std::string& vm) const;
  std::string HeldWhy(const std::string& vm) const;
  void MarkUnreachable(const std::string& host) { unreachable_.insert(host); }
  bool Reachable(const std::string& host);
  // A migration of `vm` was aborted for its stun: it is not live-migrated again.
  void LearnStunTooLong(const std::string& vm) { stun_too_long_.insert(vm); }
  // What a host's link really carries (bytes/s), learned from a migration:
  // plans from now on use it instead of the inventory's.
  void LearnLinkRate(const std::string& host, double bytes_per_s) { learned_link_[host] = bytes_per_s; }
  // The link rate plans use for `host` now (bytes/s; 0 when unknown).
  double LinkRate(const std::string& host) const;
  const planner::Policy& Policy() const { return inv_.policy; }

 private:
  // Each agent's VMs into `vms` (the file's entries for an agent that does not answer).
  Status AskAgents(const std::string& evacuating, agent::Json& vms);
  void CountInFlight(const InFlight& m, agent::Json& vms) const;
  void CountReserved(const Reservation& r, agent::Json& vms) const;

  agent::Json file_;
  agent::Json live_;
  planner::Inventory inv_;
  std::map<std::string, agent::Json> entries_;  // vm -> its agent's entry (host, device, held)
  std::map<std::string, agent::Json> last_seen_;  // vm -> the last entry any agent listed for it
  std::set<std::string> unreachable_, stun_too_long_;
  std::map<std::string, double> learned_link_;
  agent::Client* agents_ = nullptr;
  std::chrono::milliseconds timeout_{20000};
};

}  // namespace gpumigrate::evacuation
