// `gpumigrate agent`: the per-host agent of a host evacuation (issue 12), serving
// controllers over mutual TLS (include/gpumigrate/agent/agent.h has the requests);
// `gpumigrate agent-call`: one request to an agent, its reply printed as JSON
// (exit 0 done, 1 refused by the agent, 2 usage, connection or TLS failure).
#pragma once

#include <atomic>
#include <string>

#include <CLI/CLI.hpp>

#include "gpumigrate/agent/agent.h"

namespace gpumigrate::cli {

using AgentTls = agent::TlsFiles;

struct AgentFlags {
  std::string config;
  std::string listen;
  std::string state_dir;
  std::string port_file;
  std::string handshake_timeout = "5s";
  int max_connections = 32;
  std::string metrics_listen;     // --metrics-listen: "" = no /metrics
  std::string metrics_port_file;  // --metrics-port-file
  bool metrics_tls = false;       // --metrics-tls: HTTPS with the agent's certificates, client certificate required
  AgentTls tls;
};

struct AgentCallFlags {
  std::string agent;
  std::string op;
  std::string body = "{}";
  std::string timeout = "30s";
  AgentTls tls;
};

// --tls-ca, --tls-cert, --tls-key, all required.
void AddAgentTlsFlags(CLI::App* c, AgentTls& tls);
CLI::App* AddAgentCommand(CLI::App& app, AgentFlags& flags);
int RunAgent(const AgentFlags& flags, const std::atomic<bool>& cancel);
CLI::App* AddAgentCallCommand(CLI::App& app, AgentCallFlags& flags);
int RunAgentCall(const AgentCallFlags& flags);

}  // namespace gpumigrate::cli
