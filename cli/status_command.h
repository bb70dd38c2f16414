// `gpumigrate status`: what is happening now, from any terminal: a running
// agent's jobs (--agent, over mutual TLS), or an evacuation's journal in its
// state store (--store / --etcd), with the running migrations' progress from the
// agents when --inventory names them. --watch redraws it every --interval.
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/agent_command.h"

namespace gpumigrate::cli {

struct StatusFlags {
  std::string agent;      // ADDR:PORT of one agent
  std::string store;      // or an evacuation's store: a directory
  std::string etcd;       // or etcd
  std::string etcd_prefix = "/gpumigrate/";
  std::string id;         // the evacuation (default: every one in the store)
  std::string inventory;  // the fleet: the agents asked for the progress of running migrations
  std::string interval = "1s";
  std::string timeout = "5s";
  bool watch = false;
  bool json = false;
  AgentTls tls;
};

CLI::App* AddStatusCommand(CLI::App& app, StatusFlags& flags);
int RunStatus(const StatusFlags& flags, const std::atomic<bool>& cancel);

}  // namespace gpumigrate::cli
