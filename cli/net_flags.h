// The flags `migrate` and `receive` share (cli/net_commands.h has the structs):
// TLS (certificates, a PSK, or --insecure-no-tls by name) and the liveness
// limits (how long a side waits on its peer, the resume window).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/net_commands.h"
#include "gpumigrate/common/status.h"
#include "transport/crypto/tls.h"

namespace gpumigrate::cli {

void AddTlsFlags(CLI::App* c, TlsFlags& f);
// nullopt: insecure mode, asked for by name.
Result<std::optional<TlsConfig>> MakeTls(const TlsFlags& f);

void AddLivenessFlags(CLI::App* c, LivenessFlags& f);
struct LivenessLimits {
  std::chrono::nanoseconds peer_timeout, silence, interval, resume_window;
};
Result<LivenessLimits> ParseLiveness(const LivenessFlags& f);
template <typename Options>
void ApplyLiveness(const LivenessLimits& l, Options& o) {
  o.peer_timeout = l.peer_timeout;
  o.peer_silence_timeout = l.silence;
  o.keepalive_interval = l.interval;
  o.resume_window = l.resume_window;
}

// The port listened on, for whoever started this process (an agent waits for
// it), written whole: to PATH.tmp, then renamed.
void WritePortFile(const std::string& path, int port);

// "gpumigrate CMD: message" on stderr; exit code 2 (usage).
int NetUsage(const char* cmd, const Status& s);

}  // namespace gpumigrate::cli
