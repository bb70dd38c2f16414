#include "cli/agent_command.h"

#include <filesystem>

#include <fmt/format.h>

#include "cli/agent_log.h"
#include "cli/net_flags.h"
#include "cli/plan_command.h"
#include "cli/print.h"
#include "gpumigrate/agent/agent.h"
#include "gpumigrate/net/metrics_server.h"
#include "gpumigrate/common/units.h"
#include "engine/agent/client.h"
#include "engine/agent/server.h"
#include "transport/crypto/tls.h"
#include "transport/net/tcp.h"

namespace gpumigrate::cli {
namespace {

int Fail(const char* cmd, const std::string& message) {
  Print(stderr, "gpumigrate {}: {}\n", cmd, message);
  return 2;
}

// The ADDR:PORT the agent reports as its own. Controllers and sources need an
// address they can reach: a wildcard listen address says none, so the config's
// data_address stands in for it.
Result<std::string> AgentListenAddress(const AgentFlags& f, const HostPort& at, const std::string& data_address,
                                       int port) {
  const bool wildcard = at.host == "0.0.0.0" || at.host == "::" || at.host.empty();
  if (wildcard && data_address.empty()) {
    return InvalidArgument(fmt::format("--listen {} is every address: set \"data_address\" in {} to the address "
                                       "other hosts reach this one at",
                                       f.listen, f.config));
  }
  const std::string reported = wildcard ? data_address : at.host;
  return fmt::format("{}:{}", reported.find(':') != std::string::npos ? "[" + reported + "]" : reported, port);
}

// The /metrics server of --metrics-listen (over the agent's TLS with
// --metrics-tls); null when not asked for.
Result<std::unique_ptr<MetricsServer>> StartAgentMetrics(const AgentFlags& f, const TlsConfig& tls,
                                                          agent::Agent* served) {
  if (f.metrics_listen.empty()) {
    if (f.metrics_tls || !f.metrics_port_file.empty()) {
      return InvalidArgument("--metrics-tls and --metrics-port-file need --metrics-listen");
    }
    return std::unique_ptr<MetricsServer>();
  }
  MetricsServerOptions mo;
  mo.listen = f.metrics_listen;
  if (f.metrics_tls) {
    mo.ca_file = tls.ca_file;
    mo.cert_file = tls.cert_file;
    mo.key_file = tls.key_file;
  }
  auto m = MetricsServer::Start(mo, [served] { return served->Metrics(); });
  if (!m.ok()) return InvalidArgument(fmt::format("--metrics-listen: {}", m.status().message()));
  std::unique_ptr<MetricsServer> metrics = std::move(m).value();
  if (!f.metrics_port_file.empty()) WritePortFile(f.metrics_port_file, metrics->port());
  Print(stderr, "gpumigrate agent: metrics at {}://{}:{}/metrics\n", f.metrics_tls ? "https" : "http",
        ParseHostPort(f.metrics_listen)->host, metrics->port());
  return metrics;
}

}  // namespace

void AddAgentTlsFlags(CLI::App* c, AgentTls& t) {
  c->add_option("--tls-ca", t.ca, "CA certificate (PEM) that signs every agent's and controller's certificate")
      ->required();
  c->add_option("--tls-cert", t.cert, "This side's certificate chain (PEM)")->required();
  c->add_option("--tls-key", t.key, "This side's private key (PEM)")->required();
}

CLI::App* AddAgentCommand(CLI::App& app, AgentFlags& f) {
  auto* c = app.add_subcommand(
      "agent",
      "Run this host's agent: report its VMs in the planner's inventory format and, for controllers whose "
      "certificate the CA signed (mutual TLS), receive VMs, migrate them to other agents, run replica hooks and "
      "enter or leave maintenance (a systemd unit: scripts/systemd/gpumigrate-agent.service).");
  c->add_option("--config", f.config, "The host's configuration (JSON: its inventory entry, VMs, group hooks)")
      ->required();
  c->add_option("--listen", f.listen, "ADDR:PORT controllers connect to (port 0: any free port, see --port-file)")
      ->required();
  c->add_option("--state-dir", f.state_dir,
                "Where the agent keeps its state (VMs, jobs, maintenance) and its children's reports across restarts")
      ->required();
  c->add_option("--port-file", f.port_file, "Write the port actually listened on to this file");
  c->add_option("--handshake-timeout", f.handshake_timeout, "How long a connection's TLS handshake may take")
      ->capture_default_str();
  c->add_option("--max-connections", f.max_connections, "Controllers served at once")->capture_default_str();
  c->add_option("--metrics-listen", f.metrics_listen,
                "Serve Prometheus metrics at http://ADDR:PORT/metrics (port 0: any free port; off when not given; "
                "the series: README, Metrics)");
  c->add_option("--metrics-port-file", f.metrics_port_file, "Write the metrics port actually listened on to this file");
  c->add_flag("--metrics-tls", f.metrics_tls,
              "Serve /metrics over HTTPS with the agent's certificate, requiring a client certificate the CA signed "
              "(give Prometheus one: its scrape config's tls_config)");
  AddAgentTlsFlags(c, f.tls);
  return c;
}

int RunAgent(const AgentFlags& f, const std::atomic<bool>& cancel) {
  std::string text, error;
  if (!ReadWholeFile(f.config, &text, &error)) return Fail("agent", "--config " + error);
  auto config = agent::ParseAgentConfig(text);
  if (!config.ok()) return Fail("agent", fmt::format("{}: {}", f.config, config.status().message()));
  auto at = ParseHostPort(f.listen);
  if (!at.ok()) return Fail("agent", std::string(at.status().message()));
  auto handshake = ParseDuration(f.handshake_timeout);
  if (!handshake.ok()) return Fail("agent", std::string(handshake.status().message()));
  const TlsConfig tls = agent::TlsConfigOf(f.tls);
  if (std::string p = tls.Problem(); !p.empty()) return Fail("agent", p);
  auto listener = TcpListener::Listen(*at);
  if (!listener.ok()) return Fail("agent", std::string(listener.status().message()));

  auto address = AgentListenAddress(f, *at, config->data_address, (*listener)->port());
  if (!address.ok()) return Fail("agent", std::string(address.status().message()));
  agent::AgentOptions o;
  o.self_exe = std::filesystem::read_symlink("/proc/self/exe").string();
  o.state_dir = f.state_dir;
  o.listen_address = *address;
  o.child_tls_args = {"--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file};
  AgentLog log;
  o.on_job_event = [&log](const agent::Json& e) { log.JobEvent(e); };
  auto a = agent::Agent::Open(std::move(*config), o, agent::MakeProcessLauncher());
  if (!a.ok()) return Fail("agent", std::string(a.status().message()));
  for (const auto& line : (*a)->Findings()) log.Line(5, line);
  auto started = StartAgentMetrics(f, tls, a->get());
  if (!started.ok()) return Fail("agent", std::string(started.status().message()));
  std::unique_ptr<MetricsServer> metrics = std::move(started).value();
  if (!f.port_file.empty()) WritePortFile(f.port_file, (*listener)->port());
  log.Line(6, fmt::format("listening on {}{}", o.listen_address, log.to_journal() ? " (logging to the journal)" : ""));

  agent::ServeOptions so;
  so.handshake_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(*handshake);
  so.max_connections = f.max_connections;
  so.log = [](const std::string& line) { Print(stderr, "gpumigrate agent: {}\n", line); };
  agent::ServeControllers(**listener, **a, tls, so, cancel);
  metrics.reset();
  Print(stderr, "gpumigrate agent: stopped; migrations in flight run on and are found again at the next start\n");
  return 0;
}

CLI::App* AddAgentCallCommand(CLI::App& app, AgentCallFlags& f) {
  auto* c = app.add_subcommand("agent-call",
                               "Send one request to a host's agent and print its reply (JSON): inventory, status, "
                               "receive, migrate, start-replica, drain, power-off, resolve, maintenance.");
  c->add_option("--agent", f.agent, "The agent's ADDR:PORT (its certificate must name ADDR)")->required();
  c->add_option("--timeout", f.timeout, "How long to wait for the connection and the reply")->capture_default_str();
  AddAgentTlsFlags(c, f.tls);
  c->add_option("op", f.op, "The request")->required();
  c->add_option("body", f.body, "The request's other keys, as a JSON object (e.g. '{\"vm\": \"llm-1\"}')")
      ->capture_default_str();
  return c;
}

int RunAgentCall(const AgentCallFlags& f) {
  agent::Json req = agent::Json::parse(f.body, nullptr, false);
  if (req.is_discarded() || !req.is_object()) return Fail("agent-call", "the body is not a JSON object: " + f.body);
  req["op"] = f.op;
  auto timeout = ParseDuration(f.timeout);
  if (!timeout.ok()) return Fail("agent-call", std::string(timeout.status().message()));
  auto reply = agent::CallAgent(f.agent, f.tls, req, std::chrono::duration_cast<std::chrono::milliseconds>(*timeout));
  if (!reply.ok()) return Fail("agent-call", std::string(reply.status().message()));
  Print("{}\n", reply->dump());
  if (!reply->value("ok", false)) {
    Print(stderr, "gpumigrate agent-call: {} refused {}: {}\n", f.agent, f.op, reply->value("error", ""));
    return 1;
  }
  return 0;
}

}  // namespace gpumigrate::cli
