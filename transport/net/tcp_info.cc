// TcpBytesAcked and TcpBytesNotSent (tcp.h), apart from tcp.cc: linux/tcp.h's struct tcp_info has
// tcpi_bytes_acked, glibc's netinet/tcp.h (which tcp.cc needs) does not, and the
// two cannot be included together.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

#include "transport/net/tcp.h"

namespace gpumigrate {

std::optional<uint64_t> TcpBytesAcked(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  if (len < offsetof(tcp_info, tcpi_bytes_acked) + sizeof(info.tcpi_bytes_acked)) return std::nullopt;
  return info.tcpi_bytes_acked;
}

std::optional<uint64_t> TcpBytesNotSent(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  if (len < offsetof(tcp_info, tcpi_notsent_bytes) + sizeof(info.tcpi_notsent_bytes)) return std::nullopt;
  return info.tcpi_notsent_bytes;
}

}  // namespace gpumigrate
