#include "transport/crypto/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <cctype>
#include <charconv>
#include <fstream>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

namespace gpumigrate {
namespace {

std::string OpenSslErrors() {
  std::string out;
  unsigned long e;
  while ((e = ERR_get_error()) != 0) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("no detail from OpenSSL") : out;
}

Result<std::vector<unsigned char>> ReadPsk(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(fmt::format("tls: cannot read PSK file {}", path));
  std::string text, line;
  while (std::getline(in, line)) text += line;
  std::string hex;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) hex += c;
  }
  if (hex.size() < 64 || hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    return InvalidArgument(fmt::format("tls: PSK file {} must hold at least 32 bytes as hex (openssl rand -hex 32)", path));
  }
  std::vector<unsigned char> key(hex.size() / 2);
  for (size_t i = 0; i < key.size(); ++i) {
    // Cannot fail: every character was checked to be a hex digit above.
    (void)std::from_chars(hex.data() + 2 * i, hex.data() + 2 * i + 2, key[i], 16);
  }
  return key;
}

// TLS 1.3 external PSK: a session object carrying the key, for TLS_AES_256_GCM_SHA384.
SSL_SESSION* PskSession(SSL* ssl, const std::vector<unsigned char>& key) {
  static const unsigned char kAes256GcmSha384[] = {0x13, 0x02};
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kAes256GcmSha384);
  if (cipher == nullptr) return nullptr;
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr || !SSL_SESSION_set1_master_key(s, key.data(), key.size()) ||
      !SSL_SESSION_set_cipher(s, cipher) || !SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION)) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

struct PskState {
  std::vector<unsigned char> key;
  std::string identity;
};

int ClientPskCb(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen, SSL_SESSION** sess) {
  auto* st = static_cast<PskState*>(SSL_get_ex_data(ssl, 0));
  SSL_SESSION* s = PskSession(ssl, st->key);
  if (s == nullptr) return 0;
  if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s))) {
    SSL_SESSION_free(s);
    *sess = nullptr;
    return 1;
  }
  *sess = s;
  *id = reinterpret_cast<const unsigned char*>(st->identity.data());
  *idlen = st->identity.size();
  return 1;
}

int ServerPskCb(SSL* ssl, const unsigned char* id, size_t idlen, SSL_SESSION** sess) {
  auto* st = static_cast<PskState*>(SSL_get_ex_data(ssl, 0));
  if (idlen != st->identity.size() || std::memcmp(id, st->identity.data(), idlen) != 0) {
    *sess = nullptr;  // unknown identity: the handshake fails
    return 1;
  }
  *sess = PskSession(ssl, st->key);
  return *sess != nullptr ? 1 : 0;
}

// A socket BIO whose writes never raise SIGPIPE. OpenSSL's own socket BIO writes
// with write(2): a peer that closed first would kill the whole process (SIGPIPE)
// instead of failing the write with EPIPE. Reads and controls are the stock
// socket BIO's; only the write differs (send with MSG_NOSIGNAL).
int NoSigpipeWrite(BIO* b, const char* buf, int len) {
  int fd = -1;
  BIO_get_fd(b, &fd);
  errno = 0;
  ssize_t n = ::send(fd, buf, static_cast<size_t>(len), MSG_NOSIGNAL);
  BIO_clear_retry_flags(b);
  if (n <= 0 && BIO_sock_should_retry(static_cast<int>(n))) BIO_set_retry_write(b);
  return static_cast<int>(n);
}

int NoSigpipePuts(BIO* b, const char* str) { return NoSigpipeWrite(b, str, static_cast<int>(std::strlen(str))); }

const BIO_METHOD* NoSigpipeSocketMethod() {
  static const BIO_METHOD* method = [] {
    const BIO_METHOD* base = BIO_s_socket();
    BIO_METHOD* m = BIO_meth_new(BIO_TYPE_SOCKET, "socket (MSG_NOSIGNAL)");
    if (m == nullptr) return static_cast<BIO_METHOD*>(nullptr);
    BIO_meth_set_write(m, NoSigpipeWrite);
    BIO_meth_set_puts(m, NoSigpipePuts);
    BIO_meth_set_read(m, BIO_meth_get_read(base));
    BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(base));
    BIO_meth_set_create(m, BIO_meth_get_create(base));
    BIO_meth_set_destroy(m, BIO_meth_get_destroy(base));
    return m;
  }();
  return method;
}

// Binds `ssl` to `fd` through the no-SIGPIPE BIO (the SSL takes the BIO, not the fd).
bool SetNoSigpipeFd(SSL* ssl, int fd) {
  const BIO_METHOD* m = NoSigpipeSocketMethod();
  if (m == nullptr) return false;
  BIO* bio = BIO_new(m);
  if (bio == nullptr) return false;
  BIO_set_fd(bio, fd, BIO_NOCLOSE);
  SSL_set_bio(ssl, bio, bio);
  return true;
}

class TlsStreamImpl final : public TlsStream {
 public:
  TlsStreamImpl(int fd, SSL_CTX* ctx, SSL* ssl, std::unique_ptr<PskState> psk, std::string name)
      : fd_(fd), ctx_(ctx), ssl_(ssl), psk_(std::move(psk)), name_(std::move(name)) {}
  ~TlsStreamImpl() override {
    Close();
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
    ::close(fd_);
  }
  std::string Name() const override { return name_; }

  Status WriteAll(std::span<const std::byte> data) override {
    size_t done = 0;
    while (done < data.size()) {
      if (closed_.load()) return Unavailable(fmt::format("{}: write failed: stream closed", name_));
      size_t n = 0;
      int err, saved_errno = 0;
      {
        std::lock_guard lk(mu_);
        int ok = SSL_write_ex(ssl_, data.data() + done, data.size() - done, &n);
        saved_errno = errno;
        err = ok ? SSL_ERROR_NONE : SSL_get_error(ssl_, 0);
      }
      if (err == SSL_ERROR_NONE) {
        done += n;
      } else if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT);
      } else if (err == SSL_ERROR_SYSCALL && saved_errno != 0 && ERR_peek_error() == 0) {
        // The socket failed under TLS: EPIPE/ECONNRESET when the peer closed first.
        return Status::FromErrno(saved_errno,
                                 fmt::format("{}: write failed after {} of {} bytes", name_, done, data.size()));
      } else {
        return Unavailable(fmt::format("{}: write failed after {} of {} bytes: {}", name_, done, data.size(),
                                       OpenSslErrors()));
      }
    }
    return Status::Ok();
  }

  Status ReadExact(std::span<std::byte> out) override {
    size_t done = 0;
    while (done < out.size()) {
      if (closed_.load()) return Unavailable(fmt::format("{}: read failed: stream closed after {} of {} bytes", name_, done, out.size()));
      size_t n = 0;
      int err;
      {
        std::lock_guard lk(mu_);
        int ok = SSL_read_ex(ssl_, out.data() + done, out.size() - done, &n);
        err = ok ? SSL_ERROR_NONE : SSL_get_error(ssl_, 0);
      }
      if (err == SSL_ERROR_NONE) {
        done += n;
      } else if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT);
      } else if (err == SSL_ERROR_ZERO_RETURN || err == SSL_ERROR_SYSCALL) {
        return Unavailable(fmt::format("{}: read failed: stream closed after {} of {} bytes", name_, done, out.size()));
      } else {
        return Unavailable(fmt::format("{}: read failed: {}", name_, OpenSslErrors()));
      }
    }
    return Status::Ok();
  }

  void Close() override {
    if (closed_.exchange(true)) return;
    {
      std::lock_guard lk(mu_);
      (void)SSL_shutdown(ssl_);  // close_notify after what was written; non-blocking, best effort
    }
    ::shutdown(fd_, SHUT_RDWR);
  }

  Result<std::array<std::byte, 32>> ExportKey(std::string_view label) override {
    std::array<std::byte, 32> out;
    std::lock_guard lk(mu_);
    if (SSL_export_keying_material(ssl_, reinterpret_cast<unsigned char*>(out.data()), out.size(), label.data(),
                                   label.size(), nullptr, 0, 0) != 1) {
      return Internal(fmt::format("tls: exporter failed: {}", OpenSslErrors()));
    }
    return out;
  }

  std::string Describe() const override {
    return fmt::format("{} {}{}", SSL_get_version(ssl_), SSL_CIPHER_get_name(SSL_get_current_cipher(ssl_)),
                       psk_ ? " (external PSK)" : " (mutual certificates)");
  }

 private:
  void Wait(short events) {
    pollfd p{fd_, events, 0};
    (void)::poll(&p, 1, 100);  // bounded, so Close() from another thread is noticed
  }

  int fd_;
  SSL_CTX* ctx_;
  SSL* ssl_;
  std::unique_ptr<PskState> psk_;
  std::string name_;
  std::mutex mu_;
  std::atomic<bool> closed_{false};
};

// Why a handshake failed, in words: the peer's silence, a socket error, or
// OpenSSL's reasons (with the certificate check's verdict).
std::string HandshakeFailure(SSL* ssl, const TlsConfig& cfg, int err, int saved_errno,
                             std::chrono::milliseconds timeout) {
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    return fmt::format("no answer within {} ms", timeout.count());
  }
  if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    // The socket, not TLS, failed: the peer closed mid-handshake.
    return saved_errno != 0 ? fmt::format("{} (errno {})", std::strerror(saved_errno), saved_errno)
                            : std::string("the peer closed the connection during the handshake");
  }
  std::string why = OpenSslErrors();
  long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK && !cfg.uses_psk()) {
    why += fmt::format(" (peer certificate: {})", X509_verify_cert_error_string(verify));
  }
  return why;
}

// Loads this end's certificate, key and CA for mutual certificates: the step
// that failed (OpenSSL's queue says why), none where all loaded.
std::optional<std::string> LoadCertificates(SSL_CTX* ctx, const TlsConfig& cfg) {
  if (SSL_CTX_use_certificate_chain_file(ctx, cfg.cert_file.c_str()) != 1) return "load " + cfg.cert_file;
  if (SSL_CTX_use_PrivateKey_file(ctx, cfg.key_file.c_str(), SSL_FILETYPE_PEM) != 1) return "load " + cfg.key_file;
  if (SSL_CTX_check_private_key(ctx) != 1) return "match key to certificate";
  if (SSL_CTX_load_verify_locations(ctx, cfg.ca_file.c_str(), nullptr) != 1) return "load CA " + cfg.ca_file;
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return std::nullopt;
}

// How the connection checks its peer: by the external PSK, or (a client) by
// the name or address the peer's certificate must carry.
void SetPeerChecks(SSL* ssl, const TlsConfig& cfg, PskState* psk, bool server) {
  if (psk) {
    SSL_set_ex_data(ssl, 0, psk);
    if (server) {
      SSL_set_psk_find_session_callback(ssl, ServerPskCb);
    } else {
      SSL_set_psk_use_session_callback(ssl, ClientPskCb);
    }
  } else if (!server && !cfg.expected_host.empty()) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    in6_addr a6;
    in_addr a4;
    if (inet_pton(AF_INET, cfg.expected_host.c_str(), &a4) == 1 || inet_pton(AF_INET6, cfg.expected_host.c_str(), &a6) == 1) {
      X509_VERIFY_PARAM_set1_ip_asc(param, cfg.expected_host.c_str());
    } else {
      X509_VERIFY_PARAM_set1_host(param, cfg.expected_host.c_str(), 0);
    }
  }
}

// Bounds the socket's blocking reads and writes (0: no bound).
void SetSocketTimeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Runs the handshake: SSL_accept's or SSL_connect's result, with its SSL error
// and errno. A blocking call with a socket timeout returns EINTR (not a
// restart) when io_uring task work or a signal interrupts it: it tries again
// until the deadline.
int RunHandshake(SSL* ssl, bool server, std::chrono::milliseconds timeout, int& err, int& saved_errno) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int rc;
  while (true) {
    errno = 0;
    rc = server ? SSL_accept(ssl) : SSL_connect(ssl);
    saved_errno = errno;
    err = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl, rc);
    const bool again = err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE;
    if (!(again && saved_errno == EINTR && std::chrono::steady_clock::now() < deadline)) break;
  }
  return rc;
}

Result<std::unique_ptr<TlsStream>> Handshake(int fd, const TlsConfig& cfg, bool server,
                                             std::chrono::milliseconds timeout) {
  if (std::string p = cfg.Problem(); !p.empty()) {
    ::close(fd);
    return InvalidArgument("tls: " + p);
  }
  SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  auto fail = [&](std::string what) -> Status {
    Status st = Unavailable(fmt::format("tls: {} failed: {}", what, OpenSslErrors()));
    SSL_CTX_free(ctx);
    ::close(fd);
    return st;
  };
  if (ctx == nullptr) return fail("context");
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
  std::unique_ptr<PskState> psk;
  if (cfg.uses_psk()) {
    auto key = ReadPsk(cfg.psk_file);
    if (!key.ok()) {
      SSL_CTX_free(ctx);
      ::close(fd);
      return key.status();
    }
    psk = std::make_unique<PskState>(PskState{*key, cfg.psk_identity});
  } else if (std::optional<std::string> failed_step = LoadCertificates(ctx, cfg)) {
    return fail(*failed_step);
  }
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) return fail("new connection");
  if (!SetNoSigpipeFd(ssl, fd)) {
    SSL_free(ssl);
    return fail("socket BIO");
  }
  SetPeerChecks(ssl, cfg, psk.get(), server);
  // The handshake blocks, bounded by socket timeouts; the data phase is non-blocking.
  SetSocketTimeouts(fd, timeout);
  int err = 0, saved_errno = 0;
  const int rc = RunHandshake(ssl, server, timeout, err, saved_errno);
  if (rc != 1) {
    std::string why = HandshakeFailure(ssl, cfg, err, saved_errno, timeout);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    ::close(fd);
    return Unavailable(fmt::format("tls: handshake as {} failed: {}", server ? "server" : "client", why));
  }
  SetSocketTimeouts(fd, std::chrono::milliseconds(0));
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return std::unique_ptr<TlsStream>(
      std::make_unique<TlsStreamImpl>(fd, ctx, ssl, std::move(psk), server ? "tls control (server)" : "tls control (client)"));
}

}  // namespace

std::string TlsConfig::Problem() const {
  bool certs = !ca_file.empty() || !cert_file.empty() || !key_file.empty();
  if (uses_psk() && certs) return "give either --psk-file or --tls-ca/--tls-cert/--tls-key, not both";
  if (uses_psk()) return "";
  if (ca_file.empty() || cert_file.empty() || key_file.empty()) {
    return "mutual TLS needs --tls-ca, --tls-cert and --tls-key (or use --psk-file)";
  }
  return "";
}

Result<std::unique_ptr<TlsStream>> TlsStream::Client(int fd, const TlsConfig& cfg, std::chrono::milliseconds timeout) {
  return Handshake(fd, cfg, false, timeout);
}

Result<std::unique_ptr<TlsStream>> TlsStream::Server(int fd, const TlsConfig& cfg, std::chrono::milliseconds timeout) {
  return Handshake(fd, cfg, true, timeout);
}

}  // namespace gpumigrate
