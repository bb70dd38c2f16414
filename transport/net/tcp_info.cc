// TcpBytesAcked and TcpBytesNotSent (tcp.h), apart from tcp.cc: linux/tcp.h's
// struct tcp_info has tcpi_bytes_acked and tcpi_notsent_bytes, glibc's
// netinet/tcp.h (which tcp.cc needs) does not, and the two cannot be included
// together.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

#include "transport/net/tcp.h"

namespace gpumigrate {
namespace {

// The socket's TCP_INFO and how many bytes of it the kernel filled (an older
// kernel fills less than this header's struct).
struct Info {
  tcp_info info{};
  socklen_t len = sizeof(tcp_info);
};

std::optional<Info> Read(int fd) {
  Info i;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &i.info, &i.len) != 0) return std::nullopt;
  return i;
}

}  // namespace

std::optional<uint64_t> TcpBytesAcked(int fd) {
  auto i = Read(fd);
  if (!i || i->len < offsetof(tcp_info, tcpi_bytes_acked) + sizeof(i->info.tcpi_bytes_acked)) return std::nullopt;
  return i->info.tcpi_bytes_acked;
}

std::optional<uint64_t> TcpBytesNotSent(int fd) {
  auto i = Read(fd);
  if (!i || i->len < offsetof(tcp_info, tcpi_notsent_bytes) + sizeof(i->info.tcpi_notsent_bytes)) return std::nullopt;
  return i->info.tcpi_notsent_bytes;
}

}  // namespace gpumigrate
