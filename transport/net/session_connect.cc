#include "transport/net/session_connect.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <xxhash.h>

#include "transport/crypto/frame_protector.h"

namespace gpumigrate {
namespace {

constexpr uint32_t kMagic = 0x314A4D47;  // "GMJ1"
constexpr uint16_t kVersion = 1;
constexpr uint16_t kControl = 1, kData = 2, kResume = 3;
constexpr uint32_t kMaxStreams = 64;

struct Preamble {
  uint16_t kind = 0;
  uint32_t streams = 0;
  uint32_t index = 0;
  uint64_t session_id = 0;
  std::array<std::byte, 16> secret{};
};

std::array<std::byte, 48> Encode(const Preamble& p) {
  std::array<std::byte, 48> b{};
  uint16_t version = kVersion;
  std::memcpy(&b[0], &kMagic, 4);
  std::memcpy(&b[4], &version, 2);
  std::memcpy(&b[6], &p.kind, 2);
  std::memcpy(&b[8], &p.streams, 4);
  std::memcpy(&b[12], &p.index, 4);
  std::memcpy(&b[16], &p.session_id, 8);
  std::memcpy(&b[24], p.secret.data(), 16);
  return b;
}

}  // namespace

Status ReadWithin(Stream& s, std::span<std::byte> out, std::chrono::milliseconds timeout, std::string_view what) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false, expired = false;
  std::thread watchdog([&] {
    std::unique_lock lk(mu);
    if (!cv.wait_for(lk, timeout, [&] { return done; })) {
      expired = true;
      s.Close();
    }
  });
  Status st = s.ReadExact(out);
  {
    std::lock_guard lk(mu);
    done = true;
  }
  cv.notify_all();
  watchdog.join();
  if (expired) {
    return Status(StatusCode::kDeadlineExceeded,
                  fmt::format("{} failed: nothing within {} ms (the peer is silent)", what, timeout.count()));
  }
  return st.WithContext(what);
}

namespace {

// A connection that sends nothing must not hold the join past `timeout`.
Result<Preamble> Read(Stream& s, std::chrono::milliseconds timeout) {
  std::array<std::byte, 48> b;
  GM_RETURN_IF_ERROR(ReadWithin(s, b, timeout, "session join: read preamble"));
  uint32_t magic;
  uint16_t version;
  Preamble p;
  std::memcpy(&magic, &b[0], 4);
  std::memcpy(&version, &b[4], 2);
  std::memcpy(&p.kind, &b[6], 2);
  std::memcpy(&p.streams, &b[8], 4);
  std::memcpy(&p.index, &b[12], 4);
  std::memcpy(&p.session_id, &b[16], 8);
  std::memcpy(p.secret.data(), &b[24], 16);
  if (magic != kMagic) return Corrupt(fmt::format("session join: bad preamble magic 0x{:08x} (not a gpumigrate peer?)", magic));
  if (version != kVersion) {
    return Corrupt(fmt::format("session join: preamble version {} is not supported (this build speaks {})", version,
                               kVersion));
  }
  for (int i = 40; i < 48; ++i) {
    if (b[i] != std::byte{0}) return Corrupt("session join: reserved preamble bytes are not zero");
  }
  return p;
}

constexpr const char* kExporterLabel = "EXPORTER-gpumigrate-v1";

// With TLS: from the exporter secret; without: from the preamble's secret.
Result<std::array<std::byte, 16>> TlsToken(const std::array<std::byte, 32>& exported, uint64_t session, uint32_t index) {
  GM_ASSIGN_OR_RETURN(auto k, DeriveKey(exported, session, fmt::format("gpumigrate join {}", index)));
  std::array<std::byte, 16> t;
  std::memcpy(t.data(), k.data(), 16);
  return t;
}

std::array<std::byte, 16> Token(const std::array<std::byte, 16>& secret, uint64_t session, uint32_t index) {
  std::byte buf[28];
  std::memcpy(buf, secret.data(), 16);
  std::memcpy(buf + 16, &session, 8);
  std::memcpy(buf + 24, &index, 4);
  XXH128_hash_t h = XXH3_128bits(buf, sizeof buf);
  std::array<std::byte, 16> t;
  std::memcpy(t.data(), &h.low64, 8);
  std::memcpy(t.data() + 8, &h.high64, 8);
  return t;
}

// The ticket both sides keep from the first join.
Result<std::array<std::byte, 32>> ResumeSecret(const std::array<std::byte, 32>* exported,
                                               const std::array<std::byte, 16>& clear, uint64_t session) {
  if (exported) return DeriveKey(*exported, session, "gpumigrate resume");
  std::array<std::byte, 32> s;
  auto a = Token(clear, session, 0xFFFFFFFEu), b = Token(clear, session, 0xFFFFFFFDu);
  std::memcpy(s.data(), a.data(), 16);
  std::memcpy(s.data() + 16, b.data(), 16);
  return s;
}

// The proof a resuming source sends: with TLS bound to the new handshake.
Result<std::array<std::byte, 16>> ResumeProof(const ResumeTicket& t, const std::array<std::byte, 32>* exported) {
  std::array<std::byte, 16> proof;
  if (exported) {
    std::string info = "gpumigrate resume proof ";
    for (std::byte b : *exported) info += fmt::format("{:02x}", static_cast<unsigned>(b));
    GM_ASSIGN_OR_RETURN(auto k, DeriveKey(t.secret, t.session_id, info));
    std::memcpy(proof.data(), k.data(), 16);
    return proof;
  }
  std::array<std::byte, 16> half;
  std::memcpy(half.data(), t.secret.data(), 16);
  return Token(half, t.session_id, 0xFFFFFFFCu);
}

bool ConstantTimeEqual(const std::array<std::byte, 16>& a, const std::array<std::byte, 16>& b) {
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

Result<NetSession> ConnectSession(const HostPort& to, uint32_t streams, std::chrono::milliseconds timeout,
                                  const TlsConfig* tls, const ResumeTicket* resume) {
  if (streams == 0 || streams > kMaxStreams) {
    return InvalidArgument(fmt::format("session join: {} data streams is outside 1..{}", streams, kMaxStreams));
  }
  std::random_device rd;
  NetSession ns;
  ns.session_id = resume ? resume->session_id : (uint64_t{rd()} << 32) | rd();
  Preamble ctl;
  ctl.kind = resume ? kResume : kControl;
  ctl.streams = streams;
  ctl.session_id = ns.session_id;
  std::array<std::byte, 32> exported{};
  // A resumption is one attempt: the caller decides whether to try again.
  auto connect_fd = [&]() { return resume ? ConnectTcpFd(to, timeout) : ConnectTcpFdRetrying(to, timeout); };
  if (tls) {
    GM_ASSIGN_OR_RETURN(int fd, connect_fd());
    TlsConfig cfg = *tls;
    if (cfg.expected_host.empty()) cfg.expected_host = to.host;
    GM_ASSIGN_OR_RETURN(auto t, TlsStream::Client(fd, cfg, timeout));
    GM_ASSIGN_OR_RETURN(exported, t->ExportKey(kExporterLabel));
    ns.security = t->Describe() + "; data: AES-256-GCM, keys from the TLS exporter";
    ns.control = std::move(t);
    GM_ASSIGN_OR_RETURN(auto key, DeriveKey(exported, ns.session_id, "gpumigrate data"));
    ns.aes_key = key;
  } else {
    for (auto& b : ctl.secret) b = static_cast<std::byte>(rd());
    GM_ASSIGN_OR_RETURN(int fd, connect_fd());
    GM_ASSIGN_OR_RETURN(ns.control, MakeUringTcpStream(fd, fmt::format("tcp {}:{}", to.host, to.port)));
    ns.security = "INSECURE: no TLS, frames carry an integrity tag only";
  }
  // The data tokens come from this connection (its exporter or clear secret);
  // a resumption's control preamble carries the proof instead of the secret.
  const std::array<std::byte, 16> clear = ctl.secret;
  if (resume) {
    ns.resume = *resume;
    // Without TLS the data tokens are then derived from the proof, on both sides.
    GM_ASSIGN_OR_RETURN(ctl.secret, ResumeProof(*resume, tls ? &exported : nullptr));
  } else {
    ns.resume.session_id = ns.session_id;
    GM_ASSIGN_OR_RETURN(ns.resume.secret, ResumeSecret(tls ? &exported : nullptr, clear, ns.session_id));
  }
  // The receiver acknowledges the control connection before data streams open. In
  // TLS 1.3 a client's handshake ends before the server has checked the client's
  // certificate: a refusal shows up here, as the server's alert, which a read
  // surfaces even when the write already failed.
  Status sent = ns.control->WriteAll(Encode(ctl));
  std::array<std::byte, 4> ack;
  Status got = ReadWithin(*ns.control, ack, timeout, "session join: read the acknowledgement");
  if (!sent.ok() || !got.ok()) {
    const Status& why = (!got.ok() && (sent.ok() || got.message().find("alert") != std::string::npos)) ? got : sent;
    return Unavailable(fmt::format(
        "session join: the receiver did not accept the control connection (TLS handshake refused?): {}", why.message()));
  }
  if (resume && std::memcmp(ack.data(), "GMNO", 4) == 0) {
    return FailedPrecondition(fmt::format(
        "session join: the receiver refused to resume session {:016x} (it no longer holds it, or the proof failed)",
        ns.session_id));
  }
  if (std::memcmp(ack.data(), "GMOK", 4) != 0) return Corrupt("session join: bad acknowledgement from the receiver");
  for (uint32_t i = 0; i < streams; ++i) {
    GM_ASSIGN_OR_RETURN(auto d, ConnectTcp(to, timeout));
    Preamble p;
    p.kind = kData;
    p.index = i;
    p.session_id = ns.session_id;
    if (tls) {
      GM_ASSIGN_OR_RETURN(p.secret, TlsToken(exported, ns.session_id, i));
    } else {
      p.secret = Token(ctl.secret, ns.session_id, i);  // a resumption's: from its proof
    }
    GM_RETURN_IF_ERROR(d->WriteAll(Encode(p)).WithContext(fmt::format("session join: data stream {}", i)));
    ns.data.push_back(std::move(d));
  }
  return ns;
}

namespace {

// One connection's join. A control connection that is not the one awaited (a
// fresh join while a resumption is awaited, a resumption of a session this
// receiver does not hold, a bad proof) gets "GMNO" and sets *refused with why.
Result<NetSession> AcceptOnce(TcpListener& listener, std::chrono::milliseconds timeout, const TlsConfig* tls,
                              std::chrono::milliseconds hs, const ResumeTicket* resume, std::string* refused) {
  NetSession ns;
  std::array<std::byte, 32> exported{};
  if (tls) {
    GM_ASSIGN_OR_RETURN(int fd, listener.AcceptFd(timeout));
    GM_ASSIGN_OR_RETURN(auto t, TlsStream::Server(fd, *tls, hs));
    GM_ASSIGN_OR_RETURN(exported, t->ExportKey(kExporterLabel));
    ns.security = t->Describe() + "; data: AES-256-GCM, keys from the TLS exporter";
    ns.control = std::move(t);
  } else {
    GM_ASSIGN_OR_RETURN(ns.control, listener.Accept(timeout, "control"));
    ns.security = "INSECURE: no TLS, frames carry an integrity tag only";
  }
  GM_ASSIGN_OR_RETURN(Preamble ctl, Read(*ns.control, hs));
  auto refuse = [&](std::string why) -> Status {
    (void)ns.control->WriteAll(std::as_bytes(std::span("GMNO", 4)));
    ns.control->Close();
    *refused = why;
    return FailedPrecondition(why);
  };
  if (resume) {
    if (ctl.kind != kResume) return refuse("a new session's join while a resumption was awaited");
    if (ctl.session_id != resume->session_id) {
      return refuse(fmt::format("a resumption of session {:016x}, not {:016x}", ctl.session_id, resume->session_id));
    }
    GM_ASSIGN_OR_RETURN(auto want, ResumeProof(*resume, tls ? &exported : nullptr));
    if (!ConstantTimeEqual(want, ctl.secret)) return refuse("a resumption whose proof is wrong");
    ns.resume = *resume;
  } else if (ctl.kind == kResume) {
    (void)refuse("");
    return Corrupt(fmt::format("session join: a resumption of session {:016x}, which this receiver does not hold",
                               ctl.session_id));
  } else if (ctl.kind != kControl) {
    return Corrupt("session join: the first connection is not a control connection");
  }
  if (ctl.streams == 0 || ctl.streams > kMaxStreams) {
    return Corrupt(fmt::format("session join: {} data streams is outside 1..{}", ctl.streams, kMaxStreams));
  }
  ns.session_id = ctl.session_id;
  if (!resume) {
    ns.resume.session_id = ns.session_id;
    GM_ASSIGN_OR_RETURN(ns.resume.secret, ResumeSecret(tls ? &exported : nullptr, ctl.secret, ns.session_id));
  }
  GM_RETURN_IF_ERROR(ns.control->WriteAll(std::as_bytes(std::span("GMOK", 4))).WithContext("session join: acknowledge"));
  if (tls) {
    GM_ASSIGN_OR_RETURN(auto key, DeriveKey(exported, ns.session_id, "gpumigrate data"));
    ns.aes_key = key;
  }
  ns.data.resize(ctl.streams);
  for (uint32_t joined = 0; joined < ctl.streams;) {
    GM_ASSIGN_OR_RETURN(auto d, listener.Accept(hs, "data"));
    GM_ASSIGN_OR_RETURN(Preamble p, Read(*d, hs));
    // A connection of another session, or a bad token, is refused and dropped; it
    // does not end this session (it may be a stray or a scanner).
    std::array<std::byte, 16> want{};
    if (p.kind == kData && p.index < ctl.streams) {
      if (tls) {
        GM_ASSIGN_OR_RETURN(want, TlsToken(exported, ns.session_id, p.index));
      } else {
        want = Token(ctl.secret, ns.session_id, p.index);
      }
    }
    if (p.kind != kData || p.session_id != ns.session_id || p.index >= ctl.streams || ns.data[p.index] ||
        p.secret != want) {
      if (p.session_id != ns.session_id || p.kind != kData) continue;
      return Corrupt(fmt::format("session join: data stream {} did not authenticate", p.index));
    }
    ns.data[p.index] = std::move(d);
    ++joined;
  }
  return ns;
}

}  // namespace

Result<NetSession> AcceptSession(TcpListener& listener, std::chrono::milliseconds timeout, const TlsConfig* tls,
                                 std::chrono::milliseconds handshake_timeout, const ResumeTicket* resume,
                                 std::vector<std::string>* refused) {
  // Waiting for the source is `timeout`; everything once it has connected is
  // `handshake_timeout`, so a silent stranger cannot hold the listener longer.
  const auto hs = std::min(timeout, handshake_timeout);
  if (!resume) {
    std::string why;
    return AcceptOnce(listener, timeout, tls, hs, nullptr, &why);
  }
  // Awaiting a resumption: whatever else connects is refused, and the wait goes on.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= std::chrono::milliseconds(0)) {
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("session join: session {:016x} was not resumed within {} ms", resume->session_id,
                                timeout.count()));
    }
    std::string why;
    auto ns = AcceptOnce(listener, left, tls, std::min(left, hs), resume, &why);
    if (ns.ok()) return ns;
    if (ns.status().code() == StatusCode::kAborted) return ns.status();  // the listener's cancel: stop waiting
    if (why.empty() && ns.status().code() == StatusCode::kDeadlineExceeded &&
        std::chrono::steady_clock::now() >= deadline) {
      continue;  // reported above as "not resumed"
    }
    if (refused) refused->push_back(why.empty() ? ns.status().message() : why);
    if (why.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // never a hot spin
  }
}

}  // namespace gpumigrate
