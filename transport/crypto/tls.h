// TLS 1.3 for the control channel (OpenSSL): mutual certificate authentication,
// or an external pre-shared key from a file.
//
// TlsStream is a Stream over the TLS connection. One reader thread and one
// writer thread may use it at once: the socket is non-blocking, each SSL call
// runs under a mutex, and waiting for the socket happens outside it. ExportKey()
// derives key material both peers share (RFC 8446 exporter): the data-stream
// keys and join tokens come from it, so they are bound to this TLS session.
#pragma once

#include <array>
#include <chrono>
#include <memory>
#include <string>

#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate {

struct TlsConfig {
  // Mutual certificates: this side's chain and key, and the CA that signs the peer.
  std::string ca_file, cert_file, key_file;
  // Or an external PSK: a file holding at least 32 bytes as hex (e.g. `openssl rand -hex 32`).
  std::string psk_file;
  std::string psk_identity = "gpumigrate";
  // Client with certificates: the name or IP the server's certificate must carry.
  std::string expected_host;
  bool uses_psk() const { return !psk_file.empty(); }
  // "" when the configuration is complete and consistent, else what is wrong.
  std::string Problem() const;
};

class TlsStream : public Stream {
 public:
  // Take ownership of a connected socket and run the handshake within `timeout`.
  static Result<std::unique_ptr<TlsStream>> Client(int fd, const TlsConfig& cfg, std::chrono::milliseconds timeout);
  static Result<std::unique_ptr<TlsStream>> Server(int fd, const TlsConfig& cfg, std::chrono::milliseconds timeout);
  virtual Result<std::array<std::byte, 32>> ExportKey(std::string_view label) = 0;
  virtual std::string Describe() const = 0;  // protocol, cipher, peer
};

}  // namespace gpumigrate
