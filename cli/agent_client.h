// One request to a host's agent over mutual TLS, bounded in time: what
// `agent-call` and `evacuate` use.
#pragma once

#include <chrono>
#include <string>

#include "gpumigrate/agent.h"
#include "gpumigrate/status.h"

namespace gpumigrate::cli {

struct AgentTls;

// The reply, whether the agent did it ("ok": true) or refused ("ok": false,
// "error"); an error Status only when no reply came (connection, TLS, timeout).
Result<agent::Json> CallAgent(const std::string& address, const AgentTls& tls, const agent::Json& request,
                              std::chrono::milliseconds timeout);

}  // namespace gpumigrate::cli
