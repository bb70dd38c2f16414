// Resumable pre-copy over TCP: engine/session/net_reconnect.h.
#include "engine/session/net_reconnect.h"

#include <cerrno>
#include <thread>

#include <fmt/format.h>

namespace gpumigrate {

// Resumable pre-copy, source side: connections of one session (the first join
// and each resumption), kept alive until the session returns.
Reconnect SourceReconnect(const HostPort& to, uint32_t streams, const TlsConfig* tls, std::vector<NetSession>& links,
                          std::function<void(const std::string&)> note) {
  return [&to, streams, tls, &links, note](std::chrono::nanoseconds window) -> Result<Reconnected> {
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + window;
    note(fmt::format("connection to the receiver lost: resuming the session (up to {:.0f} s)",
                     std::chrono::duration<double>(window).count()));
    // Since when every attempt was refused (a plain time point and a flag: g++
    // took an optional's value here for maybe-uninitialized).
    std::chrono::steady_clock::time_point refused_since{};
    bool refused = false;
    Status last = Unavailable("no attempt was made");
    int attempts = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      auto ns = ConnectSession(to, streams, std::min(left, std::chrono::milliseconds(5000)), tls, &links.front().resume);
      ++attempts;
      if (ns.ok()) {
        links.push_back(std::move(ns).value());
        note(fmt::format("resumed over a new connection after {:.1f} s ({} attempt{})",
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), attempts,
                         attempts == 1 ? "" : "s"));
        return Reconnected{links.back().View(), links.back().aes_key};
      }
      last = ns.status();
      // The receiver refused this session: it no longer holds it. Trying again cannot help.
      if (last.code() == StatusCode::kFailedPrecondition) return last;
      // Nobody listens there any more: a receiver that is gone cannot resume either
      // (a short grace covers a listener that is briefly busy).
      if (last.error_number() == ECONNREFUSED) {
        const auto now = std::chrono::steady_clock::now();
        if (!refused) refused_since = now;
        refused = true;
        if (now - refused_since > std::chrono::seconds(3)) {
          return Unavailable(fmt::format("the receiver refuses connections, so it is gone: {}", last.message()));
        }
      } else {
        refused = false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return Status(StatusCode::kDeadlineExceeded, fmt::format("{} attempts, the last: {}", attempts, last.message()));
  };
}

// Resumable pre-copy, destination side: waits on the same listener for the
// source of this session, refusing (and naming) every other connection.
Reconnect DestinationReaccept(TcpListener& listener, const TlsConfig* tls, std::chrono::milliseconds handshake_timeout,
                              std::vector<NetSession>& links, std::function<void(const std::string&)> note) {
  return [&listener, tls, handshake_timeout, &links, note](std::chrono::nanoseconds window) -> Result<Reconnected> {
    note(fmt::format("connection lost; waiting up to {:.0f} s for the source to resume",
                     std::chrono::duration<double>(window).count()));
    std::vector<std::string> refused;
    auto ns = AcceptSession(listener, std::chrono::duration_cast<std::chrono::milliseconds>(window), tls,
                            handshake_timeout, &links.front().resume, &refused);
    for (const auto& why : refused) note("refused a connection while waiting: " + why);
    if (!ns.ok()) return ns.status();
    links.push_back(std::move(ns).value());
    note(fmt::format("the source resumed session {:016x}", links.back().session_id));
    return Reconnected{links.back().View(), links.back().aes_key};
  };
}

}  // namespace gpumigrate
