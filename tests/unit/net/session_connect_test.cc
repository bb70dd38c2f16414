// Joining a session's connections over loopback TCP, insecure and with an
// external PSK: streams join in order and carry bytes, both sides agree on the
// session (and with TLS on the data key), and strangers, wrong keys and bad
// preambles are refused within the timeout. Only 127.0.0.1, ports from the OS,
// every wait bounded.
#include "transport/net/session_connect.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <gtest/gtest.h>
#include <xxhash.h>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr auto kTimeout = 3000ms;
// How long a test waits for a side that should already have finished.
constexpr auto kBound = 10s;

std::unique_ptr<TcpListener> Listen() {
  auto l = TcpListener::Listen({"127.0.0.1", 0});
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return l.ok() ? std::move(l).value() : nullptr;
}

HostPort At(const TcpListener& l) { return {"127.0.0.1", l.port()}; }

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 13 + seed) & 0xff);
  return v;
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = ::testing::TempDir() + "gm_join_XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string Write(const std::string& name, const std::string& text) const {
    std::string p = (path_ / name).string();
    std::ofstream(p) << text << "\n";
    return p;
  }

 private:
  fs::path path_;
};

struct Joined {
  Result<NetSession> source = Internal("not run");
  Result<NetSession> destination = Internal("not run");
};

// Both sides at once; each must finish within kBound.
Joined Join(uint32_t streams, const TlsConfig* src_tls, const TlsConfig* dst_tls) {
  Joined j;
  auto l = Listen();
  if (!l) return j;
  auto src = std::async(std::launch::async, [&] { return ConnectSession(At(*l), streams, kTimeout, src_tls); });
  auto dst = std::async(std::launch::async, [&] { return AcceptSession(*l, kTimeout, dst_tls); });
  EXPECT_EQ(src.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(dst.wait_for(kBound), std::future_status::ready);
  j.source = src.get();
  j.destination = dst.get();
  return j;
}

// Every stream carries bytes from the source to the destination's stream of the same index.
void ExpectStreamsCarryBytes(NetSession& src, NetSession& dst) {
  ASSERT_EQ(src.data.size(), dst.data.size());
  for (size_t i = 0; i < src.data.size(); ++i) {
    auto sent = Bytes(100000, static_cast<uint8_t>(i));
    std::thread w([&] { EXPECT_TRUE(src.data[i]->WriteAll(sent).ok()); });
    std::vector<std::byte> got(sent.size());
    EXPECT_TRUE(dst.data[i]->ReadExact(got).ok());
    w.join();
    EXPECT_EQ(got, sent) << "data stream " << i;
  }
  auto hello = Bytes(10, 99), back = Bytes(10, 98);
  ASSERT_TRUE(src.control->WriteAll(hello).ok());
  std::vector<std::byte> got(10);
  ASSERT_TRUE(dst.control->ReadExact(got).ok());
  EXPECT_EQ(got, hello);
  ASSERT_TRUE(dst.control->WriteAll(back).ok());
  ASSERT_TRUE(src.control->ReadExact(got).ok());
  EXPECT_EQ(got, back);
}

TEST(SessionConnect, InsecureStreamsJoinAndCarryBytes) {
  Joined j = Join(3, nullptr, nullptr);
  ASSERT_TRUE(j.source.ok()) << j.source.status().ToString();
  ASSERT_TRUE(j.destination.ok()) << j.destination.status().ToString();
  EXPECT_EQ(j.source->session_id, j.destination->session_id);
  EXPECT_FALSE(j.source->aes_key.has_value());
  EXPECT_FALSE(j.destination->aes_key.has_value());
  EXPECT_EQ(j.source->security, "INSECURE: no TLS, frames carry an integrity tag only");
  EXPECT_EQ(j.destination->data.size(), 3u);
  ExpectStreamsCarryBytes(*j.source, *j.destination);
}

TEST(SessionConnect, StreamCountOutsideTheRangeIsRefusedBeforeConnecting) {
  auto r = ConnectSession({"127.0.0.1", 1}, 0, kTimeout, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "session join: 0 data streams is outside 1..64");
  r = ConnectSession({"127.0.0.1", 1}, 65, kTimeout, nullptr);
  EXPECT_EQ(r.status().message(), "session join: 65 data streams is outside 1..64");
}

TEST(SessionConnect, PskStreamsJoinWithTheSameDataKey) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("psk", std::string(64, 'a'));
  Joined j = Join(2, &tls, &tls);
  ASSERT_TRUE(j.source.ok()) << j.source.status().ToString();
  ASSERT_TRUE(j.destination.ok()) << j.destination.status().ToString();
  EXPECT_EQ(j.source->session_id, j.destination->session_id);
  ASSERT_TRUE(j.source->aes_key.has_value());
  ASSERT_TRUE(j.destination->aes_key.has_value());
  EXPECT_EQ(*j.source->aes_key, *j.destination->aes_key);
  EXPECT_NE(*j.source->aes_key, (std::array<std::byte, 32>{})) << "a derived key, not zeros";
  EXPECT_NE(j.source->security.find("external PSK"), std::string::npos) << j.source->security;
  ExpectStreamsCarryBytes(*j.source, *j.destination);
}

TEST(SessionConnect, TwoPskSessionsGetDifferentDataKeys) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("psk", std::string(64, 'b'));
  Joined a = Join(1, &tls, &tls), b = Join(1, &tls, &tls);
  ASSERT_TRUE(a.source.ok() && b.source.ok());
  EXPECT_NE(a.source->session_id, b.source->session_id);
  EXPECT_NE(*a.source->aes_key, *b.source->aes_key) << "keys come from each TLS session's exporter";
}

TEST(SessionConnect, AWrongPskFailsOnBothSides) {
  TempDir dir;
  TlsConfig src_tls, dst_tls;
  src_tls.psk_file = dir.Write("src", std::string(64, 'a'));
  dst_tls.psk_file = dir.Write("dst", std::string(64, 'b'));
  Joined j = Join(1, &src_tls, &dst_tls);
  ASSERT_FALSE(j.source.ok());
  ASSERT_FALSE(j.destination.ok());
  EXPECT_EQ(j.source.status().code(), StatusCode::kUnavailable) << j.source.status().ToString();
  EXPECT_EQ(j.destination.status().code(), StatusCode::kUnavailable) << j.destination.status().ToString();
  EXPECT_EQ(j.destination.status().message().rfind("tls: handshake as server failed: ", 0), 0u)
      << j.destination.status().message();
  EXPECT_EQ(j.source.status().message().rfind("tls: handshake as client failed: ", 0), 0u)
      << j.source.status().message();
}

TEST(SessionConnect, AMalformedPskFileIsAClearError) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("short", std::string(62, 'a'));
  auto l = Listen();
  ASSERT_TRUE(l);
  auto r = ConnectSession(At(*l), 1, kTimeout, &tls);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("must hold at least 32 bytes as hex"), std::string::npos)
      << r.status().message();
}

// --- Strangers and bad preambles, written by hand ----------------------------

struct RawPreamble {
  uint32_t magic = 0x314A4D47;  // "GMJ1"
  uint16_t version = 1;
  uint16_t kind = 1;
  uint32_t streams = 1;
  uint32_t index = 0;
  uint64_t session_id = 0;
  std::array<std::byte, 16> secret{};
  std::array<std::byte, 48> Encode() const {
    std::array<std::byte, 48> b{};
    std::memcpy(&b[0], &magic, 4);
    std::memcpy(&b[4], &version, 2);
    std::memcpy(&b[6], &kind, 2);
    std::memcpy(&b[8], &streams, 4);
    std::memcpy(&b[12], &index, 4);
    std::memcpy(&b[16], &session_id, 8);
    std::memcpy(&b[24], secret.data(), 16);
    return b;
  }
};

// The insecure join token: XXH3-128 of secret || session id || index, low half first.
std::array<std::byte, 16> InsecureToken(const std::array<std::byte, 16>& secret, uint64_t session, uint32_t index) {
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

std::unique_ptr<Stream> Dial(const TcpListener& l) {
  auto c = ConnectTcp(At(l), kTimeout);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// AcceptSession with a short timeout on its own thread; the result must come
// within kBound. `unblock` runs after the wait either way, so a destination that
// ignores its timeout fails the test instead of hanging it.
Result<NetSession> AcceptBounded(TcpListener& l, std::chrono::milliseconds timeout, const TlsConfig* tls,
                                 const std::function<void()>& unblock, std::chrono::milliseconds* took = nullptr,
                                 std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10)) {
  const auto start = std::chrono::steady_clock::now();
  auto f = std::async(std::launch::async, [&] { return AcceptSession(l, timeout, tls, handshake_timeout); });
  const bool ready = f.wait_for(kBound) == std::future_status::ready;
  if (took) *took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_TRUE(ready) << "AcceptSession outlived its " << timeout.count() << " ms timeout by " << kBound.count() << " s";
  unblock();
  return f.get();
}

TEST(SessionConnect, ASilentStrangerIsRefusedWithinTheTimeout) {
  auto l = Listen();
  ASSERT_TRUE(l);
  auto stranger = Dial(*l);
  ASSERT_TRUE(stranger);
  std::chrono::milliseconds took{};
  auto r = AcceptBounded(*l, 300ms, nullptr, [&] { stranger->Close(); }, &took);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_NE(r.status().message().find("session join: read preamble"), std::string::npos) << r.status().message();
  EXPECT_LT(took, 3000ms);
}

TEST(SessionConnect, ASilentStrangerIsRefusedWithinTheTimeoutWithTls) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("psk", std::string(64, 'c'));
  auto l = Listen();
  ASSERT_TRUE(l);
  auto stranger = Dial(*l);
  ASSERT_TRUE(stranger);
  std::chrono::milliseconds took{};
  auto r = AcceptBounded(*l, 300ms, &tls, [&] { stranger->Close(); }, &took);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "tls: handshake as server failed: no answer within 300 ms");
  EXPECT_LT(took, 3000ms);
}

// A receiver waits long for its source (--accept-timeout), but once a connection
// has arrived it gets only the handshake timeout to say who it is.
TEST(SessionConnect, ASilentStrangerHoldsTheReceiverOnlyForTheHandshakeTimeout) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("psk", std::string(64, 'c'));
  for (const TlsConfig* t : std::vector<const TlsConfig*>{nullptr, &tls}) {
    SCOPED_TRACE(t ? "tls" : "insecure");
    auto l = Listen();
    ASSERT_TRUE(l);
    auto stranger = Dial(*l);
    ASSERT_TRUE(stranger);
    std::chrono::milliseconds took{};
    auto r = AcceptBounded(*l, 60s, t, [&] { stranger->Close(); }, &took, 300ms);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("300 ms"), std::string::npos) << r.status().message();
    EXPECT_LT(took, 5000ms) << "the stranger held the receiver past its handshake timeout";
  }
}

// A listener that accepts the connection and never answers: the source's join
// ends within its timeout instead of waiting forever for the acknowledgement.
TEST(SessionConnect, AReceiverThatNeverAcknowledgesFailsTheJoinWithinTheTimeout) {
  auto l = Listen();
  ASSERT_TRUE(l);
  std::unique_ptr<Stream> held;
  std::thread acceptor([&] {
    auto c = l->Accept(kTimeout, "silent receiver");
    if (c.ok()) held = std::move(c).value();
  });
  const auto start = std::chrono::steady_clock::now();
  auto f = std::async(std::launch::async, [&] { return ConnectSession(At(*l), 1, 500ms, nullptr); });
  const bool ready = f.wait_for(kBound) == std::future_status::ready;
  acceptor.join();
  if (!ready && held) held->Close();
  ASSERT_TRUE(ready) << "ConnectSession waited past its timeout for an acknowledgement";
  auto r = f.get();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("did not accept the control connection"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("nothing within 500 ms"), std::string::npos) << r.status().message();
  if (held) held->Close();
}

TEST(SessionConnect, AStrangerSendingGarbageIsRefused) {
  auto l = Listen();
  ASSERT_TRUE(l);
  auto stranger = Dial(*l);
  ASSERT_TRUE(stranger);
  std::string junk = "GET / HTTP/1.1\r\nHost: example\r\n\r\n0123456789abcdef";
  junk.resize(48, 'x');
  ASSERT_TRUE(stranger->WriteAll(std::as_bytes(std::span(junk))).ok());
  auto r = AcceptBounded(*l, kTimeout, nullptr, [&] { stranger->Close(); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(r.status().message(), "session join: bad preamble magic 0x20544547 (not a gpumigrate peer?)");
}

TEST(SessionConnect, AStrangerSendingGarbageIsRefusedWithTls) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("psk", std::string(64, 'c'));
  auto l = Listen();
  ASSERT_TRUE(l);
  auto stranger = Dial(*l);
  ASSERT_TRUE(stranger);
  auto junk = Bytes(200, 7);
  ASSERT_TRUE(stranger->WriteAll(junk).ok());
  auto r = AcceptBounded(*l, kTimeout, &tls, [&] { stranger->Close(); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message().rfind("tls: handshake as server failed: ", 0), 0u) << r.status().message();
}

TEST(SessionConnect, APreambleOfAnotherVersionIsRefusedNamingIt) {
  auto l = Listen();
  ASSERT_TRUE(l);
  auto peer = Dial(*l);
  ASSERT_TRUE(peer);
  RawPreamble p;
  p.version = 2;
  ASSERT_TRUE(peer->WriteAll(p.Encode()).ok());
  auto r = AcceptBounded(*l, kTimeout, nullptr, [&] { peer->Close(); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(r.status().message(), "session join: preamble version 2 is not supported (this build speaks 1)");
}

TEST(SessionConnect, NonZeroReservedBytesAreRefused) {
  auto l = Listen();
  ASSERT_TRUE(l);
  auto peer = Dial(*l);
  ASSERT_TRUE(peer);
  auto b = RawPreamble{}.Encode();
  b[47] = std::byte{1};
  ASSERT_TRUE(peer->WriteAll(b).ok());
  auto r = AcceptBounded(*l, kTimeout, nullptr, [&] { peer->Close(); });
  EXPECT_EQ(r.status().message(), "session join: reserved preamble bytes are not zero");
}

TEST(SessionConnect, AFirstConnectionThatIsNotControlIsRefused) {
  auto l = Listen();
  ASSERT_TRUE(l);
  auto peer = Dial(*l);
  ASSERT_TRUE(peer);
  RawPreamble p;
  p.kind = 2;
  ASSERT_TRUE(peer->WriteAll(p.Encode()).ok());
  auto r = AcceptBounded(*l, kTimeout, nullptr, [&] { peer->Close(); });
  EXPECT_EQ(r.status().message(), "session join: the first connection is not a control connection");
}

// A scripted source: control by hand, then the data connections the test wants.
struct Scripted {
  std::unique_ptr<Stream> control;
  RawPreamble ctl;
  std::vector<std::unique_ptr<Stream>> data;

  bool Open(const TcpListener& l, uint32_t streams) {
    control = Dial(l);
    if (!control) return false;
    ctl.streams = streams;
    ctl.session_id = 0x5e55105e55105e55ULL;
    for (size_t i = 0; i < 16; ++i) ctl.secret[i] = static_cast<std::byte>(i + 1);
    if (!control->WriteAll(ctl.Encode()).ok()) return false;
    std::array<std::byte, 4> ack;
    return control->ReadExact(ack).ok() && std::memcmp(ack.data(), "GMOK", 4) == 0;
  }
  // A data connection with the given fields.
  bool Data(const TcpListener& l, uint64_t session, uint32_t index, std::array<std::byte, 16> token) {
    auto d = Dial(l);
    if (!d) return false;
    RawPreamble p;
    p.kind = 2;
    p.session_id = session;
    p.index = index;
    p.secret = token;
    bool ok = d->WriteAll(p.Encode()).ok();
    data.push_back(std::move(d));
    return ok;
  }
  bool GoodData(const TcpListener& l, uint32_t index) {
    return Data(l, ctl.session_id, index, InsecureToken(ctl.secret, ctl.session_id, index));
  }
  void CloseAll() {
    if (control) control->Close();
    for (auto& d : data) d->Close();
  }
};

TEST(SessionConnect, AStrayDataConnectionOfAnotherSessionIsDroppedAndTheJoinGoesOn) {
  auto l = Listen();
  ASSERT_TRUE(l);
  Scripted src;
  auto dst = std::async(std::launch::async, [&] { return AcceptSession(*l, kTimeout, nullptr); });
  ASSERT_TRUE(src.Open(*l, 2));
  ASSERT_TRUE(src.GoodData(*l, 1));  // out of order: the destination orders by index
  ASSERT_TRUE(src.Data(*l, src.ctl.session_id + 1, 0, {}));  // another session's
  ASSERT_TRUE(src.GoodData(*l, 0));
  ASSERT_EQ(dst.wait_for(kBound), std::future_status::ready);
  auto r = dst.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->session_id, src.ctl.session_id);
  ASSERT_EQ(r->data.size(), 2u);
  // data[i] is the connection that said index i: src.data[0] said 1, src.data[2] said 0.
  std::byte one[1] = {std::byte{7}}, got[1];
  ASSERT_TRUE(src.data[2]->WriteAll(one).ok());
  ASSERT_TRUE(r->data[0]->ReadExact(got).ok());
  EXPECT_EQ(got[0], std::byte{7});
  one[0] = std::byte{8};
  ASSERT_TRUE(src.data[0]->WriteAll(one).ok());
  ASSERT_TRUE(r->data[1]->ReadExact(got).ok());
  EXPECT_EQ(got[0], std::byte{8});
  src.CloseAll();
}

TEST(SessionConnect, ADataConnectionWithABadTokenFailsTheJoin) {
  auto l = Listen();
  ASSERT_TRUE(l);
  Scripted src;
  auto dst = std::async(std::launch::async, [&] { return AcceptSession(*l, kTimeout, nullptr); });
  ASSERT_TRUE(src.Open(*l, 1));
  auto token = InsecureToken(src.ctl.secret, src.ctl.session_id, 0);
  token[0] ^= std::byte{1};
  ASSERT_TRUE(src.Data(*l, src.ctl.session_id, 0, token));
  ASSERT_EQ(dst.wait_for(kBound), std::future_status::ready);
  auto r = dst.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(r.status().message(), "session join: data stream 0 did not authenticate");
  src.CloseAll();
}

TEST(SessionConnect, ASilentDataConnectionIsRefusedWithinTheTimeout) {
  auto l = Listen();
  ASSERT_TRUE(l);
  Scripted src;
  std::chrono::milliseconds took{};
  std::unique_ptr<Stream> silent;
  std::thread script([&] {
    ASSERT_TRUE(src.Open(*l, 1));
    silent = Dial(*l);
  });
  auto r = AcceptBounded(*l, 300ms, nullptr, [&] {
    script.join();
    if (silent) silent->Close();
    src.CloseAll();
  }, &took);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_NE(r.status().message().find("session join: read preamble"), std::string::npos) << r.status().message();
  EXPECT_LT(took, 3000ms);
}

}  // namespace
}  // namespace gpumigrate

namespace gpumigrate {
namespace {

// Resumable pre-copy: a later connection of the same session, proven by the
// first join's ticket.
struct Resumed {
  Result<NetSession> source = Internal("not run");
  Result<NetSession> destination = Internal("not run");
};

Resumed Resume(TcpListener& l, const ResumeTicket& offered, const ResumeTicket& awaited, uint32_t streams,
               const TlsConfig* tls, std::vector<std::string>* refused = nullptr,
               std::chrono::milliseconds wait = kTimeout) {
  Resumed r;
  auto dst = std::async(std::launch::async,
                        [&] { return AcceptSession(l, wait, tls, kTimeout, &awaited, refused); });
  r.source = ConnectSession(At(l), streams, kTimeout, tls, &offered);
  if (!r.source.ok()) {
    // The receiver goes on waiting for the real source; let it give up.
    EXPECT_EQ(dst.wait_for(wait + kBound), std::future_status::ready);
  } else {
    EXPECT_EQ(dst.wait_for(kBound), std::future_status::ready);
  }
  r.destination = dst.get();
  return r;
}

void ExpectResumes(const TlsConfig* tls) {
  auto l = Listen();
  ASSERT_TRUE(l);
  Joined j;
  {
    auto src = std::async(std::launch::async, [&] { return ConnectSession(At(*l), 2, kTimeout, tls); });
    j.destination = AcceptSession(*l, kTimeout, tls);
    j.source = src.get();
  }
  ASSERT_TRUE(j.source.ok() && j.destination.ok()) << j.source.status().ToString() << j.destination.status().ToString();
  EXPECT_EQ(j.source->resume.session_id, j.source->session_id);
  EXPECT_EQ(j.source->resume.secret, j.destination->resume.secret) << "both sides keep the same ticket";
  EXPECT_NE(j.source->resume.secret, (std::array<std::byte, 32>{}));
  Resumed r = Resume(*l, j.source->resume, j.destination->resume, 2, tls);
  ASSERT_TRUE(r.source.ok()) << r.source.status().ToString();
  ASSERT_TRUE(r.destination.ok()) << r.destination.status().ToString();
  EXPECT_EQ(r.source->session_id, j.source->session_id);
  EXPECT_EQ(r.destination->session_id, j.source->session_id);
  EXPECT_EQ(r.destination->resume.secret, j.destination->resume.secret) << "a second break resumes with the same ticket";
  if (tls) {
    ASSERT_TRUE(r.source->aes_key && r.destination->aes_key);
    EXPECT_EQ(*r.source->aes_key, *r.destination->aes_key);
    EXPECT_NE(*r.source->aes_key, *j.source->aes_key) << "the new connection has its own data key";
  }
  ExpectStreamsCarryBytes(*r.source, *r.destination);
}

TEST(SessionResume, TheSourceOfTheSessionResumesInsecure) { ExpectResumes(nullptr); }

TEST(SessionResume, TheSourceOfTheSessionResumesWithTls) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("psk", std::string(64, 'c'));
  ExpectResumes(&tls);
}

// A peer holding the PSK (so its TLS handshake succeeds) but not this session's
// ticket cannot take the session over; the receiver refuses it, names why, and
// goes on waiting for the real source.
TEST(SessionResume, AStrangerWithoutTheTicketIsRefusedAndTheWaitGoesOn) {
  TempDir dir;
  TlsConfig tls;
  tls.psk_file = dir.Write("psk", std::string(64, 'd'));
  auto l = Listen();
  ASSERT_TRUE(l);
  ResumeTicket real{0x1234, {}};
  for (size_t i = 0; i < 32; ++i) real.secret[i] = static_cast<std::byte>(i * 3 + 1);
  ResumeTicket forged = real;
  forged.secret[5] ^= std::byte{1};
  std::vector<std::string> refused;
  auto dst = std::async(std::launch::async, [&] { return AcceptSession(*l, 6000ms, &tls, kTimeout, &real, &refused); });
  auto stranger = ConnectSession(At(*l), 1, kTimeout, &tls, &forged);
  EXPECT_EQ(stranger.status().code(), StatusCode::kFailedPrecondition) << stranger.status().ToString();
  EXPECT_NE(stranger.status().message().find("refused to resume session 0000000000001234"), std::string::npos)
      << stranger.status().message();
  ResumeTicket other = real;
  other.session_id = 0x9999;
  auto wrong_session = ConnectSession(At(*l), 1, kTimeout, &tls, &other);
  EXPECT_EQ(wrong_session.status().code(), StatusCode::kFailedPrecondition);
  auto fresh = ConnectSession(At(*l), 1, kTimeout, &tls);  // a new migration while the session waits
  EXPECT_FALSE(fresh.ok());
  auto source = ConnectSession(At(*l), 1, kTimeout, &tls, &real);
  ASSERT_EQ(dst.wait_for(kBound), std::future_status::ready);
  auto got = dst.get();
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(refused.size(), 3u);
  EXPECT_EQ(refused[0], "a resumption whose proof is wrong");
  EXPECT_EQ(refused[1], "a resumption of session 0000000000009999, not 0000000000001234");
  EXPECT_EQ(refused[2], "a new session's join while a resumption was awaited");
}

TEST(SessionResume, AReceiverThatHoldsNoSessionRefusesAResumption) {
  auto l = Listen();
  ASSERT_TRUE(l);
  ResumeTicket t{0x77, {}};
  auto dst = std::async(std::launch::async, [&] { return AcceptSession(*l, kTimeout, nullptr); });
  auto src = ConnectSession(At(*l), 1, kTimeout, nullptr, &t);
  EXPECT_EQ(src.status().code(), StatusCode::kFailedPrecondition) << src.status().ToString();
  auto got = dst.get();
  EXPECT_EQ(got.status().message(),
            "session join: a resumption of session 0000000000000077, which this receiver does not hold");
}

TEST(SessionResume, NoResumptionWithinTheWindowIsADeadline) {
  auto l = Listen();
  ASSERT_TRUE(l);
  ResumeTicket t{0x42, {}};
  const auto t0 = std::chrono::steady_clock::now();
  auto got = AcceptSession(*l, 300ms, nullptr, kTimeout, &t);
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(got.status().message(), "session join: session 0000000000000042 was not resumed within 300 ms");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

// A receive told to stop (SIGTERM: an agent cancelling it) while it awaits a
// resumption stops awaiting it, rather than holding the VM's slot at the
// target for the whole resume window (seen in CI: an evacuation's re-plan
// collided with a receive still waiting after the source had aborted).
TEST(SessionResume, ACancelEndsTheWaitForAResumption) {
  auto l = Listen();
  ASSERT_TRUE(l);
  std::atomic<bool> cancel{false};
  l->SetCancel(&cancel);
  ResumeTicket t{0x42, {}};
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    cancel = true;
  });
  auto got = AcceptSession(*l, 60s, nullptr, kTimeout, &t);  // without the cancel: a 60 s deadline
  stopper.join();
  EXPECT_EQ(got.status().code(), StatusCode::kAborted) << got.status().message();
  EXPECT_NE(got.status().message().find("cancelled while waiting for a connection"), std::string::npos)
      << got.status().message();
}

}  // namespace
}  // namespace gpumigrate
