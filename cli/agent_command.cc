#include "cli/agent_command.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "cli/agent_log.h"
#include "cli/plan_command.h"
#include "cli/print.h"
#include "gpumigrate/agent.h"
#include "gpumigrate/metrics_server.h"
#include "gpumigrate/units.h"
#include "engine/agent/client.h"
#include "transport/crypto/tls.h"
#include "transport/net/tcp.h"

namespace gpumigrate::cli {
namespace {


std::string PeerOf(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
  port = ntohs(a->sin6_port);
  return fmt::format("[{}]:{}", host, port);
}

// One controller's connection: requests and replies until it closes.
class Connection {
 public:
  Connection(agent::Agent& a, int fd, TlsConfig cfg, std::chrono::milliseconds handshake)
      : agent_(a), fd_(fd), cfg_(std::move(cfg)), handshake_(handshake), peer_(PeerOf(fd)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Connection() {
    Stop();
    thread_.join();
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (stream_) stream_->Close();
  }
  bool Done() const { return done_.load(); }

 private:
  void Run() {
    auto tls = TlsStream::Server(fd_, cfg_, handshake_);
    if (!tls.ok()) {
      Print(stderr, "gpumigrate agent: refused {}: {}\n", peer_, tls.status().message());
      done_ = true;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = std::move(*tls);
      if (stopping_) stream_->Close();
    }
    while (true) {
      auto req = agent::ReadMessage(*stream_);
      if (!req.ok()) {
        if (req.status().code() != StatusCode::kUnavailable) {
          Print(stderr, "gpumigrate agent: {}: {}\n", peer_, req.status().message());
        }
        break;
      }
      const agent::Json reply = agent_.Handle(*req);
      const bool ok = reply.value("ok", false);
      const auto& op = (*req)["op"];
      Print(stderr, "gpumigrate agent: {}: {} {}{}\n", peer_, op.is_string() ? op.get<std::string>() : "?",
            ok ? "ok" : "refused: ", ok ? "" : reply.value("error", ""));
      if (!agent::WriteMessage(*stream_, reply).ok()) break;
    }
    stream_->Close();
    done_ = true;
  }

  agent::Agent& agent_;
  int fd_;
  TlsConfig cfg_;
  std::chrono::milliseconds handshake_;
  std::string peer_;
  std::mutex mu_;
  bool stopping_ = false;
  std::unique_ptr<Stream> stream_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

int Fail(const char* cmd, const std::string& message) {
  Print(stderr, "gpumigrate {}: {}\n", cmd, message);
  return 2;
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

namespace {

void WritePortFile(const std::string& path, int port) {
  std::ofstream pf(path + ".tmp");
  pf << port << "\n";
  pf.close();
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace

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

  // Controllers and sources need an address they can reach: a wildcard listen
  // address says none.
  const bool wildcard = at->host == "0.0.0.0" || at->host == "::" || at->host.empty();
  if (wildcard && config->data_address.empty()) {
    return Fail("agent", fmt::format("--listen {} is every address: set \"data_address\" in {} to the address "
                                     "other hosts reach this one at",
                                     f.listen, f.config));
  }
  const std::string reported = wildcard ? config->data_address : at->host;
  agent::AgentOptions o;
  o.self_exe = std::filesystem::read_symlink("/proc/self/exe").string();
  o.state_dir = f.state_dir;
  o.listen_address = fmt::format("{}:{}", reported.find(':') != std::string::npos ? "[" + reported + "]" : reported,
                                 (*listener)->port());
  o.child_tls_args = {"--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file};
  AgentLog log;
  o.on_job_event = [&log](const agent::Json& e) { log.JobEvent(e); };
  auto a = agent::Agent::Open(std::move(*config), o, agent::MakeProcessLauncher());
  if (!a.ok()) return Fail("agent", std::string(a.status().message()));
  for (const auto& line : (*a)->Findings()) log.Line(5, line);
  std::unique_ptr<MetricsServer> metrics;
  if (!f.metrics_listen.empty()) {
    MetricsServerOptions mo;
    mo.listen = f.metrics_listen;
    if (f.metrics_tls) {
      mo.ca_file = tls.ca_file;
      mo.cert_file = tls.cert_file;
      mo.key_file = tls.key_file;
    }
    agent::Agent* served = a->get();
    auto m = MetricsServer::Start(mo, [served] { return served->Metrics(); });
    if (!m.ok()) return Fail("agent", fmt::format("--metrics-listen: {}", m.status().message()));
    metrics = std::move(m).value();
    if (!f.metrics_port_file.empty()) WritePortFile(f.metrics_port_file, metrics->port());
    Print(stderr, "gpumigrate agent: metrics at {}://{}:{}/metrics\n", f.metrics_tls ? "https" : "http",
          ParseHostPort(f.metrics_listen)->host, metrics->port());
  } else if (f.metrics_tls || !f.metrics_port_file.empty()) {
    return Fail("agent", "--metrics-tls and --metrics-port-file need --metrics-listen");
  }
  if (!f.port_file.empty()) WritePortFile(f.port_file, (*listener)->port());
  log.Line(6, fmt::format("listening on {}{}", o.listen_address, log.to_journal() ? " (logging to the journal)" : ""));

  std::list<std::unique_ptr<Connection>> conns;
  const auto hs = std::chrono::duration_cast<std::chrono::milliseconds>(*handshake);
  while (!cancel.load()) {
    auto fd = (*listener)->AcceptFd(std::chrono::milliseconds(200));
    conns.remove_if([](const auto& c) { return c->Done(); });
    if (!fd.ok()) {
      if (fd.status().code() != StatusCode::kDeadlineExceeded) {
        Print(stderr, "gpumigrate agent: {}\n", fd.status().message());
      }
      try {
        (*a)->Poll();
      } catch (const std::exception& e) {
        Print(stderr, "gpumigrate agent: polling the jobs: {}\n", e.what());
      }
      continue;
    }
    if (static_cast<int>(conns.size()) >= f.max_connections) {
      Print(stderr, "gpumigrate agent: refused {}: {} connections already open (--max-connections)\n", PeerOf(*fd),
            conns.size());
      ::close(*fd);
      continue;
    }
    conns.push_back(std::make_unique<Connection>(**a, *fd, tls, hs));
  }
  for (auto& c : conns) c->Stop();
  conns.clear();
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
