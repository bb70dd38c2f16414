// The agent's side of its control channel (engine/agent/server.h): each
// controller's connection on a thread of its own, over mutual TLS.
#include "engine/agent/server.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <list>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace gpumigrate::agent {
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
  Connection(Agent& a, int fd, TlsConfig cfg, std::chrono::milliseconds handshake,
             const std::function<void(const std::string&)>& log)
      : agent_(a), fd_(fd), cfg_(std::move(cfg)), handshake_(handshake), log_(log), peer_(PeerOf(fd)) {
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
      log_(fmt::format("refused {}: {}", peer_, tls.status().message()));
      done_ = true;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = std::move(*tls);
      if (stopping_) stream_->Close();
    }
    while (true) {
      auto req = ReadMessage(*stream_);
      if (!req.ok()) {
        if (req.status().code() != StatusCode::kUnavailable) {
          log_(fmt::format("{}: {}", peer_, req.status().message()));
        }
        break;
      }
      const Json reply = agent_.Handle(*req);
      const bool ok = reply.value("ok", false);
      const auto& op = (*req)["op"];
      log_(fmt::format("{}: {} {}{}", peer_, op.is_string() ? op.get<std::string>() : "?", ok ? "ok" : "refused: ",
                       ok ? "" : reply.value("error", "")));
      if (!WriteMessage(*stream_, reply).ok()) break;
    }
    stream_->Close();
    done_ = true;
  }

  Agent& agent_;
  int fd_;
  TlsConfig cfg_;
  std::chrono::milliseconds handshake_;
  const std::function<void(const std::string&)>& log_;
  std::string peer_;
  std::mutex mu_;
  bool stopping_ = false;
  std::unique_ptr<Stream> stream_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace

void ServeControllers(TcpListener& listener, Agent& a, const TlsConfig& tls, const ServeOptions& o,
                      const std::atomic<bool>& cancel) {
  const std::function<void(const std::string&)> log = o.log ? o.log : [](const std::string&) {};
  std::list<std::unique_ptr<Connection>> conns;
  while (!cancel.load()) {
    auto fd = listener.AcceptFd(std::chrono::milliseconds(200));
    conns.remove_if([](const auto& c) { return c->Done(); });
    if (!fd.ok()) {
      if (fd.status().code() != StatusCode::kDeadlineExceeded) {
        log(std::string(fd.status().message()));
      }
      try {
        a.Poll();
      } catch (const std::exception& e) {
        log(fmt::format("polling the jobs: {}", e.what()));
      }
      continue;
    }
    if (static_cast<int>(conns.size()) >= o.max_connections) {
      log(fmt::format("refused {}: {} connections already open (--max-connections)", PeerOf(*fd), conns.size()));
      ::close(*fd);
      continue;
    }
    conns.push_back(std::make_unique<Connection>(a, *fd, tls, o.handshake_timeout, log));
  }
  for (auto& c : conns) c->Stop();
  conns.clear();
}

}  // namespace gpumigrate::agent
