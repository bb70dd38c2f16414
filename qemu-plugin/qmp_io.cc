#include "qemu-plugin/qmp_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace gpumigrate::qmp_io {

int64_t MsLeft(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? left.count() : 0;
}

Status PrepareFd(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status::FromErrno(errno, "qmp: make the socket non-blocking failed");
  }
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) return Status::FromErrno(errno, "qmp: set close-on-exec failed");
  return Status::Ok();
}

namespace {

// One connect attempt: the fd, or -errno.
int TryConnect(const sockaddr_un& addr) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) < 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

}  // namespace

Result<int> ConnectUnix(const std::string& path, Deadline deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return InvalidArgument(fmt::format("qmp: connect to {} failed: not a usable UNIX socket path "
                                       "(empty or {} bytes or more)", path, sizeof addr.sun_path));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  for (;;) {
    int r = TryConnect(addr);
    if (r >= 0) {
      Status s = PrepareFd(r);
      if (!s.ok()) {
        close(r);
        return s;
      }
      return r;
    }
    bool not_yet = r == -ENOENT || r == -ECONNREFUSED;
    if (!not_yet) return Status::FromErrno(r, fmt::format("qmp: connect to {} failed", path));
    if (std::chrono::steady_clock::now() >= deadline) {
      return Unavailable(fmt::format("qmp: connect to {} failed: {} until the connect timeout (is QEMU running "
                                     "with -qmp unix:{},server=on?)", path, std::strerror(-r), path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Result<Ready> WaitFor(int fd, short events, int cancel_fd, Deadline deadline) {
  for (;;) {
    pollfd fds[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    int r = poll(fds, cancel_fd >= 0 ? 2 : 1, static_cast<int>(MsLeft(deadline)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "qmp: poll failed");
    }
    if (cancel_fd >= 0 && (fds[1].revents & POLLIN)) return Ready::kCancelled;
    if (fds[0].revents != 0) return Ready::kReady;
    if (std::chrono::steady_clock::now() >= deadline) return Ready::kTimeout;
  }
}

Result<ssize_t> ReadSome(int fd, std::string& buf) {
  char chunk[64 * 1024];
  for (;;) {
    ssize_t n = read(fd, chunk, sizeof chunk);
    if (n > 0) {
      buf.append(chunk, static_cast<size_t>(n));
      return n;
    }
    if (n == 0) return ssize_t{0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return ssize_t{-1};
    if (errno == ECONNRESET) return ssize_t{0};  // QEMU went away with data unread
    return Status::FromErrno(errno, "qmp: read from the QMP socket failed");
  }
}

Status WriteAll(int fd, int cancel_fd, std::string_view data, Deadline deadline, std::string_view what) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return Unavailable(fmt::format("qmp: {} failed: QEMU closed the QMP socket before the command was sent",
                                     what));
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::FromErrno(errno, fmt::format("qmp: {} failed: write", what));
    }
    GM_ASSIGN_OR_RETURN(Ready ready, WaitFor(fd, POLLOUT, cancel_fd, deadline));
    if (ready == Ready::kCancelled) return Aborted(fmt::format("qmp: {} failed: cancelled", what));
    if (ready == Ready::kTimeout) {
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("qmp: {} failed: QEMU did not read the command (socket full)", what));
    }
  }
  return Status::Ok();
}

std::optional<std::string> PopLine(std::string& buf, size_t max_line_bytes, bool& oversized) {
  oversized = false;
  size_t nl = buf.find('\n');
  if (nl == std::string::npos) {
    oversized = buf.size() > max_line_bytes;
    return std::nullopt;
  }
  if (nl > max_line_bytes) {
    oversized = true;
    return std::nullopt;
  }
  size_t end = (nl > 0 && buf[nl - 1] == '\r') ? nl - 1 : nl;
  std::string line = buf.substr(0, end);
  buf.erase(0, nl + 1);
  return line;
}

}  // namespace gpumigrate::qmp_io
