// The agent's side of its control channel: controllers served over mutual TLS
// (`gpumigrate agent`). Each connection is served on a thread of its own, one
// request and its reply at a time (agent.h's framing), until it closes.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "gpumigrate/agent/agent.h"
#include "transport/crypto/tls.h"
#include "transport/net/tcp.h"

namespace gpumigrate::agent {

struct ServeOptions {
  std::chrono::milliseconds handshake_timeout{5000};  // a connection's TLS handshake
  int max_connections = 32;                           // served at once; more are closed, said so
  // A line per request ("PEER: OP ok" or "refused: ..."), per refused
  // connection and per error; may be empty.
  std::function<void(const std::string&)> log;
};

// Accepts controllers on `listener` until `cancel`, at most max_connections
// at once, and polls the agent's jobs whenever no connection came; then closes
// them all (their requests under way answered first).
void ServeControllers(TcpListener& listener, Agent& agent, const TlsConfig& tls, const ServeOptions& options,
                      const std::atomic<bool>& cancel);

}  // namespace gpumigrate::agent
