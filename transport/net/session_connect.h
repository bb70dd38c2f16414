// Joining the connections of one migration session over TCP.
//
//   source                                   destination (listening)
//   connect #0, preamble(kind=control, session, streams=N, secret) ─▶ accept
//   connect #1..N, preamble(kind=data, session, index, token)      ─▶ accept N,
//                                      check session, index and token, order by index
//
// Then the migration protocol runs on top (Hello, Manifest, ...).
//
// Resumable pre-copy: the first join leaves both sides a resume ticket (the
// session id and a 32-byte secret: with TLS derived from the first handshake's
// exporter, HKDF-SHA256 info "gpumigrate resume"; without, from the clear
// secret). A source whose connection broke joins again with a control preamble
// of kind 3 (resume) whose 16-byte field is a proof: with TLS, HKDF of the
// ticket's secret bound to the *new* handshake's exporter (a recorded proof is
// worth nothing on another connection); without TLS, a hash of the secret. The
// receiver waiting for that session answers "GMOK" to a valid proof and "GMNO"
// to anything else (a stranger, another session, a fresh join), and keeps
// waiting. The data streams and their key come from the new handshake.
//
// With TLS (the default in the CLI) the control connection is TLS 1.3 and both
// sides derive, from the TLS exporter, the data streams' AES-256-GCM key and each
// data connection's join token (HKDF-SHA256, salt = session id): a data
// connection can only join if it was opened by the peer of this TLS session.
// Without TLS (--insecure-no-tls) the token is XXH3-128 of a secret that crosses
// the network in the clear, and frames carry only an integrity tag: for trusted
// networks and tests.
//
// Preamble, 48 bytes little-endian: magic "GMJ1", version u16 (1), kind u16
// (1 control, 2 data), streams u32, index u32, session id u64, secret or token
// (16 bytes), 8 reserved zero bytes.
#pragma once

#include <chrono>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"
#include "transport/crypto/tls.h"
#include "transport/net/tcp.h"

namespace gpumigrate {

// What a session's first join leaves both sides to prove a later one is the same.
struct ResumeTicket {
  uint64_t session_id = 0;
  std::array<std::byte, 32> secret{};
};

struct NetSession {
  uint64_t session_id = 0;
  ResumeTicket resume;                               // the first join's, kept by every resumption
  std::optional<std::array<std::byte, 32>> aes_key;  // set with TLS
  std::string security;                              // what protects the session, for reports
  std::unique_ptr<Stream> control;
  std::vector<std::unique_ptr<Stream>> data;
  SessionStreams View() const {
    SessionStreams s;
    s.control = control.get();
    for (const auto& d : data) s.data.push_back(d.get());
    return s;
  }
};

// `tls` null: insecure mode. `timeout` bounds each step of the join: connecting
// (refusals retried), the TLS handshake, the receiver's acknowledgement.
// `resume` set: joins a new connection of that session (one connect attempt, no
// retry on refusal); FailedPrecondition when the receiver refuses it.
Result<NetSession> ConnectSession(const HostPort& to, uint32_t streams, std::chrono::milliseconds timeout,
                                  const TlsConfig* tls, const ResumeTicket* resume = nullptr);
// Waits up to `timeout` for the control connection; from then on each step
// (TLS handshake, preamble, each data connection and its preamble) has
// `handshake_timeout` (capped at `timeout`).
// `resume` set: waits up to `timeout` for the source of that session to join
// again with a valid proof; every other connection is refused ("GMNO") and
// counted in `*refused` (when given), and the wait goes on. Unset: a resume
// preamble is refused as a session this receiver does not hold.
Result<NetSession> AcceptSession(TcpListener& listener, std::chrono::milliseconds timeout, const TlsConfig* tls,
                                 std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10),
                                 const ResumeTicket* resume = nullptr, std::vector<std::string>* refused = nullptr);

// ReadExact bounded in time: a watchdog closes the stream when nothing has filled
// `out` within `timeout` (kDeadlineExceeded, naming `what`).
Status ReadWithin(Stream& s, std::span<std::byte> out, std::chrono::milliseconds timeout, std::string_view what);

}  // namespace gpumigrate
