// Joining the connections of one migration session over TCP.
//
//   source                                   destination (listening)
//   connect #0, preamble(kind=control, session, streams=N, secret) ─▶ accept
//   connect #1..N, preamble(kind=data, session, index, token)      ─▶ accept N,
//                                      check session, index and token, order by index
//
// Then the migration protocol runs on top (Hello, Manifest, ...). A data
// connection proves it belongs to the session with token = XXH3-128 of
// (secret, session id, index). Without TLS the secret crosses the network in
// the clear: that mode is for trusted networks and tests only (the CLI calls it
// --insecure-no-tls); with TLS the token will derive from the TLS exporter.
//
// Preamble, 48 bytes little-endian: magic "GMJ1", version u16 (1), kind u16
// (1 control, 2 data), streams u32, index u32, session id u64, secret or token
// (16 bytes), 8 reserved zero bytes.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "gpumigrate/session.h"
#include "gpumigrate/status.h"
#include "gpumigrate/stream.h"
#include "transport/net/tcp.h"

namespace gpumigrate {

struct NetSession {
  uint64_t session_id = 0;
  std::unique_ptr<Stream> control;
  std::vector<std::unique_ptr<Stream>> data;
  SessionStreams View() const {
    SessionStreams s;
    s.control = control.get();
    for (const auto& d : data) s.data.push_back(d.get());
    return s;
  }
};

Result<NetSession> ConnectSession(const HostPort& to, uint32_t streams, std::chrono::milliseconds timeout);
Result<NetSession> AcceptSession(TcpListener& listener, std::chrono::milliseconds timeout);

}  // namespace gpumigrate
