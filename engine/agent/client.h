// The agents' mutual TLS from their certificate files: what the agent's server
// (cli/agent_command.cc) and the client (CallAgent) both configure.
#pragma once

#include "gpumigrate/agent/agent.h"
#include "transport/crypto/tls.h"

namespace gpumigrate::agent {

TlsConfig TlsConfigOf(const TlsFiles& files);

}  // namespace gpumigrate::agent
