// `gpumigrate evacuate`: carries out the evacuation of one host (issue 12 item
// 2) through the hosts' agents: a plan (--plan, from `gpumigrate plan --json`,
// or made now from --inventory and --host, confirmed unless --yes), run in its
// order within each host's max_migrations, every step journaled and every
// target slot reserved in the state store (a directory, or etcd for several
// controllers), a line per VM as it goes, and a new plan for the VMs that are
// left when an action fails. A controller killed and started again with the
// same --id continues from the journal: a VM is never migrated twice.
// Exit 0: every VM has left the host; 1: some could not (they run where they
// were), or the plan is infeasible, or not confirmed (nothing moved); 2: usage;
// 3: some VM is in doubt (held for an operator).
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/agent_command.h"

namespace gpumigrate::cli {

struct EvacuateFlags {
  std::string inventory;
  std::string host;
  std::string plan;
  std::string store;
  std::string etcd;
  std::string etcd_prefix = "/gpumigrate/";
  std::string id;
  std::string poll = "100ms";
  std::string agent_timeout = "20s";
  std::string bandwidth;
  std::string events;         // --events FILE|-: one JSON object per state change
  std::string resume_window;  // passed to every migrate (a slower link, for demos and tests)
  bool yes = false;
  bool dry_run = false;
  bool batched = false;
  bool json = false;
  bool allow_power_off = false;
  bool no_pace = false;  // leave the link's division to TCP
  AgentTls tls;
};

CLI::App* AddEvacuateCommand(CLI::App& app, EvacuateFlags& flags);
int RunEvacuate(const EvacuateFlags& flags, const std::atomic<bool>& cancel);

}  // namespace gpumigrate::cli
