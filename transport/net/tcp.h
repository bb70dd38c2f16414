// TCP for migrations: address parsing, a listener, connecting with a deadline,
// and a Stream over a connected socket driven by io_uring.
//
// UringTcpStream keeps two rings, one for sends and one for receives, so one
// writer thread and one reader thread may use the stream at once (the Stream
// contract). Each WriteAll/ReadExact submits one request at a time on the
// caller's buffer, resubmits short transfers, and returns when the buffer is
// fully sent or filled; the buffer must stay valid until then. Close() shuts
// the socket down, which completes any pending receive with end-of-stream.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate {

struct HostPort {
  std::string host;  // "127.0.0.1", "::1", "localhost"
  uint16_t port = 0;
};
// "HOST:PORT" or "[V6]:PORT".
Result<HostPort> ParseHostPort(std::string_view text);

// tcpi_bytes_acked of a TCP socket (TCP_INFO, Linux 4.1+; linux/tcp.h, since
// glibc's struct tcp_info stops short of it); nullopt when the kernel does not say.
std::optional<uint64_t> TcpBytesAcked(int fd);
// tcpi_notsent_bytes (Linux 4.6+): written to the socket, not yet sent.
std::optional<uint64_t> TcpBytesNotSent(int fd);

// Resets a connected TCP socket at once (SO_LINGER 0, then a disconnect): the
// send queue is dropped, the peer gets a RST, and calls pending on fd fail with
// ECONNRESET; fd stays open (its owner closes it).
void ResetTcp(int fd);

// Wraps a connected socket (takes ownership of fd).
Result<std::unique_ptr<Stream>> MakeUringTcpStream(int fd, std::string name);

Result<std::unique_ptr<Stream>> ConnectTcp(const HostPort& to, std::chrono::milliseconds timeout);
// The connected, blocking socket itself (for TLS, which drives its own I/O).
Result<int> ConnectTcpFd(const HostPort& to, std::chrono::milliseconds timeout);
// As ConnectTcpFd, but a refused connection (nobody listening yet: a receiver
// still starting) is tried again every 100 ms until `timeout` has passed.
Result<int> ConnectTcpFdRetrying(const HostPort& to, std::chrono::milliseconds timeout);

class TcpListener {
 public:
  // Port 0 picks a free port; port() tells which.
  static Result<std::unique_ptr<TcpListener>> Listen(const HostPort& at);
  ~TcpListener();
  uint16_t port() const { return port_; }
  // Waits up to `timeout` for one connection.
  Result<std::unique_ptr<Stream>> Accept(std::chrono::milliseconds timeout, std::string name);
  Result<int> AcceptFd(std::chrono::milliseconds timeout);
  // While `cancel` (outliving the listener) is set, every wait for a connection
  // ends within 100 ms as kAborted: a receive told to stop (SIGTERM, an agent's
  // cancel) must not wait out its accept timeout or a resume window first.
  void SetCancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }

 private:
  TcpListener(int fd, uint16_t port) : fd_(fd), port_(port) {}
  int fd_;
  uint16_t port_;
  const std::atomic<bool>* cancel_ = nullptr;
};

}  // namespace gpumigrate
