// Resumable pre-copy over TCP (`migrate` / `receive` between two processes):
// how each side joins a new connection of its session after the old one broke.
// The connections of one session (the first join and each resumption) are
// kept in `links`, alive until the session returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpumigrate/session/session.h"
#include "transport/net/session_connect.h"

namespace gpumigrate {

// The source connects to `to` again and again within the window (a receiver
// briefly busy is waited for); it gives up at once when the receiver refuses
// the session (it no longer holds it) and after 3 s of refused connections
// (nobody listens: the receiver is gone). `note`: what it does, for the user.
Reconnect SourceReconnect(const HostPort& to, uint32_t streams, const TlsConfig* tls, std::vector<NetSession>& links,
                          std::function<void(const std::string&)> note);

// The destination waits on the same listener for the source of this session,
// refusing (and noting) every other connection.
Reconnect DestinationReaccept(TcpListener& listener, const TlsConfig* tls, std::chrono::milliseconds handshake_timeout,
                              std::vector<NetSession>& links, std::function<void(const std::string&)> note);

}  // namespace gpumigrate
