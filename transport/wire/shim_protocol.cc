#include "transport/wire/shim_protocol.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace gpumigrate::shimwire {

std::string ShimSocketPath(int pid) {
  const char* dir = std::getenv("GPUMIGRATE_SHIM_DIR");
  std::string d = (dir != nullptr && *dir != '\0') ? dir : "/tmp";
  return d + "/gpumigrate-shim." + std::to_string(pid) + ".sock";
}

namespace {

int WriteAll(int sock, const std::byte* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(sock, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

int WaitReadable(int sock, int timeout_ms) {
  if (timeout_ms < 0) return 0;
  pollfd pfd{sock, POLLIN, 0};
  while (true) {
    int r = ::poll(&pfd, 1, timeout_ms);
    if (r > 0) return 0;
    if (r == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
  }
}

int ReadAll(int sock, std::byte* p, size_t n, int timeout_ms) {
  while (n > 0) {
    if (int e = WaitReadable(sock, timeout_ms); e != 0) return e;
    ssize_t r = ::recv(sock, p, n, 0);
    if (r == 0) return -ECONNRESET;
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

}  // namespace

int SendMsg(int sock, Msg type, uint32_t error, std::span<const std::byte> payload, std::span<const int> fds) {
  if (fds.size() > static_cast<size_t>(kMaxFds)) return -E2BIG;
  Header h;
  h.type = static_cast<uint16_t>(type);
  h.error = error;
  h.len = static_cast<uint32_t>(payload.size());
  iovec iov{&h, sizeof(h)};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    m.msg_control = control;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t w;
  do {
    w = ::sendmsg(sock, &m, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w < 0) return -errno;
  if (static_cast<size_t>(w) < sizeof(h)) {
    if (int e = WriteAll(sock, reinterpret_cast<const std::byte*>(&h) + w, sizeof(h) - w); e != 0) return e;
  }
  return WriteAll(sock, payload.data(), payload.size());
}

int RecvMsg(int sock, Header& h, std::vector<std::byte>& payload, std::vector<int>& fds, int timeout_ms) {
  fds.clear();
  if (int e = WaitReadable(sock, timeout_ms); e != 0) return e;
  iovec iov{&h, sizeof(h)};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  m.msg_control = control;
  m.msg_controllen = sizeof(control);
  ssize_t r;
  do {
    r = ::recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return -errno;
  if (r == 0) return -ECONNRESET;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const auto* p = reinterpret_cast<const int*>(CMSG_DATA(c));
      fds.assign(p, p + n);
    }
  }
  auto close_fds = [&] {
    for (int fd : fds) ::close(fd);
    fds.clear();
  };
  if (static_cast<size_t>(r) < sizeof(h)) {
    if (int e = ReadAll(sock, reinterpret_cast<std::byte*>(&h) + r, sizeof(h) - r, timeout_ms); e != 0) {
      close_fds();
      return e;
    }
  }
  if (h.magic != kMagic || h.len > kMaxPayload) {
    close_fds();
    return -EPROTO;
  }
  payload.resize(h.len);
  if (int e = ReadAll(sock, payload.data(), h.len, timeout_ms); e != 0) {
    close_fds();
    return e;
  }
  return 0;
}

}  // namespace gpumigrate::shimwire
