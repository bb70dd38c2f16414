#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/session/local_migration.h"
#include "transport/net/session_connect.h"

namespace gpumigrate {

LocalMigrationResult MigrateOverLoopback(Device& source, Device& destination, const LocalMigrationOptions& options,
                                         bool tls, std::string* security) {
  LocalMigrationResult result;
  auto fail = [&](Status st) {
    result.source.outcome = Outcome::kAborted;
    result.source.status = st.WithContext("loopback transport");
    result.source.resolution = "the source is RUNNING; nothing was sent";
    return result;
  };
  // An ephemeral PSK in a private temporary file, removed when done.
  std::string psk_path;
  TlsConfig cfg;
  if (tls) {
    char path[] = "/tmp/gpumigrate-demo-psk-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return fail(Status::FromErrno(errno, "create the ephemeral PSK file"));
    std::random_device rd;
    std::string hex;
    for (int i = 0; i < 32; ++i) hex += fmt::format("{:02x}", rd() & 0xff);
    hex += "\n";
    bool ok = ::write(fd, hex.data(), hex.size()) == static_cast<ssize_t>(hex.size());
    ::close(fd);
    psk_path = path;
    if (!ok) {
      ::unlink(path);
      return fail(Internal("write the ephemeral PSK file failed"));
    }
    cfg.psk_file = psk_path;
    cfg.psk_identity = "gpumigrate-demo";
  }
  auto listener = TcpListener::Listen({"127.0.0.1", 0});
  if (!listener.ok()) {
    if (!psk_path.empty()) ::unlink(psk_path.c_str());
    return fail(listener.status());
  }
  const auto timeout = std::chrono::milliseconds(10000);
  std::thread dest([&] {
    auto ns = AcceptSession(**listener, timeout, tls ? &cfg : nullptr);
    if (!ns.ok()) {
      result.destination.outcome = Outcome::kAborted;
      result.destination.status = ns.status();
      return;
    }
    DestinationOptions o = options.destination;
    o.aes_key = ns->aes_key;
    result.destination = RunDestination(destination, ns->View(), o);
  });
  auto ns = ConnectSession({"127.0.0.1", (*listener)->port()}, options.data_streams, timeout, tls ? &cfg : nullptr);
  if (!ns.ok()) {
    dest.join();
    if (!psk_path.empty()) ::unlink(psk_path.c_str());
    return fail(ns.status());
  }
  if (!psk_path.empty()) ::unlink(psk_path.c_str());  // both sides have read it
  if (security) *security = ns->security;
  SourceOptions o = options.source;
  o.session_id = ns->session_id;
  o.aes_key = ns->aes_key;
  result.source = RunSource(source, ns->View(), o);
  dest.join();
  return result;
}

}  // namespace gpumigrate
