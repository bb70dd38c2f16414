// The flags `migrate` and `receive` share: TLS and how long a side waits on its peer.
#include "cli/net_flags.h"

#include <cstdio>
#include <fstream>

#include <fmt/format.h>

#include "cli/print.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

namespace {

constexpr const char* kInsecureHelp =
    "Run the control channel and data unencrypted and unauthenticated (frames keep an integrity tag): only on a "
    "trusted network or for tests";

}  // namespace

void AddTlsFlags(CLI::App* c, TlsFlags& f) {
  c->add_option("--tls-ca", f.ca, "CA certificate (PEM) that signs the peer's certificate (see scripts/make-test-certs)");
  c->add_option("--tls-cert", f.cert, "This side's certificate chain (PEM)");
  c->add_option("--tls-key", f.key, "This side's private key (PEM)");
  c->add_option("--psk-file", f.psk_file,
                "Instead of certificates: a file with a pre-shared key of at least 32 bytes as hex "
                "(openssl rand -hex 32), the same on both sides");
  c->add_option("--psk-identity", f.psk_identity, "The PSK's identity, the same on both sides")->capture_default_str();
  c->add_flag("--insecure-no-tls", f.insecure, kInsecureHelp);
}

// nullopt: insecure mode, asked for by name.
Result<std::optional<TlsConfig>> MakeTls(const TlsFlags& f) {
  bool any = !f.ca.empty() || !f.cert.empty() || !f.key.empty() || !f.psk_file.empty();
  if (f.insecure) {
    if (any) return InvalidArgument("--insecure-no-tls cannot be combined with TLS options");
    return std::optional<TlsConfig>();
  }
  TlsConfig cfg;
  cfg.ca_file = f.ca;
  cfg.cert_file = f.cert;
  cfg.key_file = f.key;
  cfg.psk_file = f.psk_file;
  cfg.psk_identity = f.psk_identity;
  if (!any) {
    return InvalidArgument(
        "TLS needs --tls-ca/--tls-cert/--tls-key (scripts/make-test-certs makes a test set) or --psk-file; "
        "--insecure-no-tls runs without it on a trusted network");
  }
  if (std::string p = cfg.Problem(); !p.empty()) return InvalidArgument(p);
  return std::optional<TlsConfig>(cfg);
}

void AddLivenessFlags(CLI::App* c, LivenessFlags& f) {
  c->add_option("--peer-timeout", f.peer_timeout,
                "Longest wait on the peer while it makes no progress (it keeps sending keepalives but gets no work "
                "done); a peer that gets work done is never cut off")
      ->capture_default_str();
  c->add_option("--peer-silence-timeout", f.peer_silence_timeout,
                "Fail when nothing, not even a keepalive, has come from the peer for this long, or a control write "
                "has been blocked this long: the peer or the link is down")
      ->capture_default_str();
  c->add_option("--keepalive-interval", f.keepalive_interval,
                "How often this side tells the peer it is alive (less than half the peer's silence timeout)")
      ->capture_default_str();
  c->add_option("--resume-window", f.resume_window,
                "When the connection breaks during pre-copy: how long to keep the session and try to carry it on "
                "over a new connection (the source reconnects, proving it is the same session; the destination "
                "waits) instead of starting again; 0 ends the migration at once (rolled back)")
      ->capture_default_str();
}

Result<LivenessLimits> ParseLiveness(const LivenessFlags& f) {
  GM_ASSIGN_OR_RETURN(auto peer, ParseDuration(f.peer_timeout));
  GM_ASSIGN_OR_RETURN(auto silence, ParseDuration(f.peer_silence_timeout));
  GM_ASSIGN_OR_RETURN(auto interval, ParseDuration(f.keepalive_interval));
  GM_ASSIGN_OR_RETURN(auto window, ParseDuration(f.resume_window));
  LivenessLimits l{std::chrono::duration_cast<std::chrono::nanoseconds>(peer),
             std::chrono::duration_cast<std::chrono::nanoseconds>(silence),
             std::chrono::duration_cast<std::chrono::nanoseconds>(interval),
             std::chrono::duration_cast<std::chrono::nanoseconds>(window)};
  if (l.resume_window < std::chrono::nanoseconds(0)) return InvalidArgument("--resume-window must not be negative");
  if (l.peer_timeout <= std::chrono::nanoseconds(0) || l.interval <= std::chrono::nanoseconds(0)) {
    return InvalidArgument("--peer-timeout and --keepalive-interval must be positive");
  }
  if (l.silence < 2 * l.interval) {
    return InvalidArgument(fmt::format("--peer-silence-timeout {} must be at least twice --keepalive-interval {}: a "
                                       "live peer would be taken for dead",
                                       f.peer_silence_timeout, f.keepalive_interval));
  }
  return l;
}

void WritePortFile(const std::string& path, int port) {
  std::ofstream pf(path + ".tmp");
  pf << port << "\n";
  pf.close();
  std::rename((path + ".tmp").c_str(), path.c_str());
}

int NetUsage(const char* cmd, const Status& s) {
  Print(stderr, "gpumigrate {}: {}\n", cmd, s.message());
  return 2;
}

}  // namespace gpumigrate::cli
