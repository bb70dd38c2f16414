#include "transport/net/tcp.h"

#include <liburing.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "gpumigrate/common/clock.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {

Result<HostPort> ParseHostPort(std::string_view text) {
  HostPort hp;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return InvalidArgument(fmt::format("address '{}' is not [IPV6]:PORT", text));
    }
    hp.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      return InvalidArgument(fmt::format("address '{}' is not HOST:PORT", text));
    }
    hp.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  auto p = ParseUint(port, 0, 65535);
  if (!p.ok()) return InvalidArgument(fmt::format("address '{}': port '{}' is not 0..65535", text, port));
  hp.port = static_cast<uint16_t>(*p);
  return hp;
}

namespace {

constexpr std::chrono::milliseconds kRetryEvery{100};

Result<addrinfo*> Resolve(const HostPort& hp, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string port = std::to_string(hp.port);
  int rc = getaddrinfo(hp.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Unavailable(fmt::format("tcp: resolve {}:{} failed: {}", hp.host, hp.port, gai_strerror(rc)));
  }
  return res;
}

// Sent data unacknowledged this long (a peer or link that swallows packets)
// fails the connection with ETIMEDOUT, instead of the kernel's ~15 minutes of
// retransmissions. A live peer acknowledges even while its window is closed, so
// a slow reader is not cut off; the session's keepalives bound the rest.
constexpr unsigned kUserTimeoutMs = 30'000;

void Tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  unsigned user_timeout = kUserTimeoutMs;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

// One direction's ring; requests go one at a time under the mutex.
class Ring {
 public:
  Status Init() {
    int rc = io_uring_queue_init(4, &ring_, 0);
    if (rc < 0) return Status::FromErrno(rc, "tcp: io_uring_queue_init");
    ok_ = true;
    return Status::Ok();
  }
  ~Ring() {
    if (ok_) io_uring_queue_exit(&ring_);
  }
  // Returns the completion's result (bytes, or -errno).
  int Run(bool send, int fd, std::byte* buf, size_t len) {
    std::lock_guard lk(mu_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return -EBUSY;
    if (send) {
      io_uring_prep_send(sqe, fd, buf, len, MSG_NOSIGNAL);
    } else {
      io_uring_prep_recv(sqe, fd, buf, len, 0);
    }
    int rc = io_uring_submit(&ring_);
    if (rc < 0) return rc;
    io_uring_cqe* cqe = nullptr;
    do {
      rc = io_uring_wait_cqe(&ring_, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return rc;
    int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    return res;
  }

 private:
  io_uring ring_{};
  bool ok_ = false;
  std::mutex mu_;
};

class UringTcpStream final : public Stream {
 public:
  UringTcpStream(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  ~UringTcpStream() override {
    Close();
    ::close(fd_);
  }
  Status Init() {
    GM_RETURN_IF_ERROR(send_.Init());
    return recv_.Init();
  }
  std::string Name() const override { return name_; }

  Status WriteAll(std::span<const std::byte> data) override {
    size_t done = 0;
    while (done < data.size()) {
      if (closed_.load()) return Unavailable(fmt::format("{}: write failed: stream closed", name_));
      int n = send_.Run(true, fd_, const_cast<std::byte*>(data.data()) + done, data.size() - done);
      if (n < 0) {
        return Status::FromErrno(n, fmt::format("{}: write failed after {} of {} bytes", name_, done, data.size()));
      }
      done += static_cast<size_t>(n);  // short sends are resubmitted
    }
    return Status::Ok();
  }

  Status ReadExact(std::span<std::byte> out) override {
    size_t done = 0;
    while (done < out.size()) {
      int n = recv_.Run(false, fd_, out.data() + done, out.size() - done);
      if (n < 0) {
        return Status::FromErrno(n, fmt::format("{}: read failed after {} of {} bytes", name_, done, out.size()));
      }
      if (n == 0) {
        return Unavailable(fmt::format("{}: read failed: stream closed after {} of {} bytes", name_, done, out.size()));
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  Result<size_t> ReadSome(std::span<std::byte> out) override {
    if (out.empty()) return size_t{0};
    int n = recv_.Run(false, fd_, out.data(), out.size());
    if (n < 0) return Status::FromErrno(n, fmt::format("{}: read failed", name_));
    return static_cast<size_t>(n);
  }

  void Close() override {
    if (!closed_.exchange(true)) ::shutdown(fd_, SHUT_RDWR);
  }
  void Reset() override {
    closed_ = true;
    ResetTcp(fd_);
  }

  std::optional<uint64_t> BytesDelivered() const override { return TcpBytesAcked(fd_); }
  std::optional<uint64_t> BytesUnsent() const override { return TcpBytesNotSent(fd_); }

 private:
  int fd_;
  std::string name_;
  Ring send_, recv_;
  std::atomic<bool> closed_{false};
};

}  // namespace

void ResetTcp(int fd) {
  linger l{1, 0};  // should the owner close(fd) now, that too resets rather than drains
  (void)::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  // connect(AF_UNSPEC) disconnects a TCP socket in place (tcp_disconnect): the
  // send queue is purged, a RST goes out, and waiters see ECONNRESET.
  sockaddr sa{};
  sa.sa_family = AF_UNSPEC;
  (void)::connect(fd, &sa, sizeof(sa));
  (void)::shutdown(fd, SHUT_RDWR);  // whatever the disconnect left, wake it
}

Result<std::unique_ptr<Stream>> MakeUringTcpStream(int fd, std::string name) {
  Tune(fd);
  auto s = std::make_unique<UringTcpStream>(fd, std::move(name));
  GM_RETURN_IF_ERROR(s->Init());
  return std::unique_ptr<Stream>(std::move(s));
}

Result<std::unique_ptr<Stream>> ConnectTcp(const HostPort& to, std::chrono::milliseconds timeout) {
  GM_ASSIGN_OR_RETURN(int fd, ConnectTcpFd(to, timeout));
  return MakeUringTcpStream(fd, fmt::format("tcp {}:{}", to.host, to.port));
}

Result<int> ConnectTcpFd(const HostPort& to, std::chrono::milliseconds timeout) {
  GM_ASSIGN_OR_RETURN(addrinfo * res, Resolve(to, false));
  Status last = Unavailable(fmt::format("tcp: connect {}:{} failed", to.host, to.port));
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
      if (rc == 0) {
        ::close(fd);
        last = Status(StatusCode::kDeadlineExceeded,
                      fmt::format("tcp: connect {}:{} timed out after {} ms", to.host, to.port, timeout.count()));
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err ? -1 : 0;
      errno = err;
    }
    if (rc < 0) {
      last = Status::FromErrno(errno, fmt::format("tcp: connect {}:{}", to.host, to.port));
      ::close(fd);
      continue;
    }
    int flags = 0;  // back to blocking: io_uring (or TLS) does the waiting
    ::ioctl(fd, FIONBIO, &flags);
    freeaddrinfo(res);
    Tune(fd);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

Result<int> ConnectTcpFdRetrying(const HostPort& to, std::chrono::milliseconds timeout) {
  Clock& clock = SystemClock();
  const auto deadline = clock.Now() + timeout;
  int attempts = 0;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock.Now());
    auto fd = ConnectTcpFd(to, std::max(left, std::chrono::milliseconds(1)));
    ++attempts;
    if (fd.ok() || fd.status().code() != StatusCode::kUnavailable || clock.Now() + kRetryEvery >= deadline) {
      if (!fd.ok() && attempts > 1) {
        return Status(fd.status().code(), fmt::format("{}; nobody accepted within {} ms ({} attempts)",
                                                      fd.status().message(), timeout.count(), attempts));
      }
      return fd;
    }
    clock.SleepUntil(clock.Now() + kRetryEvery);
  }
}

Result<std::unique_ptr<TcpListener>> TcpListener::Listen(const HostPort& at) {
  GM_ASSIGN_OR_RETURN(addrinfo * res, Resolve(at, true));
  int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return Status::FromErrno(errno, "tcp: socket");
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd, res->ai_addr, res->ai_addrlen) < 0 || ::listen(fd, 64) < 0) {
    Status st = Status::FromErrno(errno, fmt::format("tcp: listen on {}:{}", at.host, at.port));
    ::close(fd);
    freeaddrinfo(res);
    return st;
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  uint16_t port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return std::unique_ptr<TcpListener>(new TcpListener(fd, port));
}

TcpListener::~TcpListener() { ::close(fd_); }

Result<std::unique_ptr<Stream>> TcpListener::Accept(std::chrono::milliseconds timeout, std::string name) {
  GM_ASSIGN_OR_RETURN(int fd, AcceptFd(timeout));
  return MakeUringTcpStream(fd, std::move(name));
}

Result<int> TcpListener::AcceptFd(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  pollfd p{fd_, POLLIN, 0};
  int rc = 0;
  while (true) {
    if (cancel_ != nullptr && cancel_->load()) {
      return Aborted(fmt::format("tcp: cancelled while waiting for a connection on port {}", port_));
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) break;
    // In slices when a cancel flag is watched (a signal handler's flag does not interrupt poll).
    const auto slice = cancel_ != nullptr ? std::min(left, std::chrono::milliseconds(100)) : left;
    rc = ::poll(&p, 1, static_cast<int>(slice.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc != 0) break;
  }
  if (rc < 0) return Status::FromErrno(errno, "tcp: poll listener");
  if (rc == 0) {
    return Status(StatusCode::kDeadlineExceeded,
                  fmt::format("tcp: no connection on port {} within {} ms", port_, timeout.count()));
  }
  int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "tcp: accept");
  Tune(fd);
  return fd;
}

}  // namespace gpumigrate
