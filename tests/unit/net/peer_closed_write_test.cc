// Writing to a peer that has gone away must fail with a reason, never kill the
// process with SIGPIPE (issue 19: `migrate` died with exit 141 when the
// destination closed first). Each test sets SIGPIPE to its default action, so
// a write path that raises it kills this test's process and the test fails.
// Every write path the project has: io_uring TCP sends, TLS (OpenSSL) writes in
// both directions including close_notify, protobuf envelopes on either, and the
// shim's Unix socket.
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "transport/wire/shim_protocol.h"
#include "transport/crypto/tls.h"
#include "transport/net/tcp.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

struct FdPair {
  int client = -1, server = -1;
};

FdPair ConnectFds() {
  signal(SIGPIPE, SIG_DFL);
  auto l = TcpListener::Listen({"127.0.0.1", 0});
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  FdPair p;
  std::thread t([&] {
    auto c = ConnectTcpFd({"127.0.0.1", (*l)->port()}, 2000ms);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    p.client = *c;
  });
  auto s = (*l)->AcceptFd(2000ms);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  t.join();
  p.server = *s;
  return p;
}

// Writes until the write fails (the first write after the peer's close is
// usually accepted into the socket buffer; the RST makes a later one fail).
Status WriteUntilFailure(Stream& s) {
  std::vector<std::byte> chunk(64 << 10, std::byte{7});
  for (int i = 0; i < 2000; ++i) {
    Status st = s.WriteAll(chunk);
    if (!st.ok()) return st;
    std::this_thread::sleep_for(1ms);
  }
  return Status::Ok();
}

void ExpectPeerGone(const Status& st) {
  ASSERT_FALSE(st.ok()) << "writes to a closed peer kept succeeding";
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  const std::string& m = st.message();
  EXPECT_TRUE(m.find("Broken pipe") != std::string::npos || m.find("Connection reset") != std::string::npos) << m;
}

TEST(PeerClosedWrite, UringTcpStreamFailsWithEpipe) {
  FdPair p = ConnectFds();
  auto client = MakeUringTcpStream(p.client, "tcp client");
  ASSERT_TRUE(client.ok());
  ::close(p.server);
  ExpectPeerGone(WriteUntilFailure(**client));
}

struct TlsPair {
  std::unique_ptr<TlsStream> client, server;
  int client_fd = -1, server_fd = -1;
};

TlsPair HandshakePsk(const std::string& dir) {
  std::string psk = dir + "/psk";
  std::ofstream(psk) << std::string(64, 'a') << "\n";
  TlsConfig cfg;
  cfg.psk_file = psk;
  FdPair fds = ConnectFds();
  TlsPair p;
  p.client_fd = fds.client;
  p.server_fd = fds.server;
  std::thread t([&] {
    auto c = TlsStream::Client(fds.client, cfg, 2000ms);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (c.ok()) p.client = std::move(c).value();
  });
  auto s = TlsStream::Server(fds.server, cfg, 2000ms);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) p.server = std::move(s).value();
  t.join();
  return p;
}

class TlsPeerClosed : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gm-tls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::remove((dir_ + "/psk").c_str());
    ::rmdir(dir_.c_str());
  }
  std::string dir_;
};

TEST_F(TlsPeerClosed, ClientWriteFailsWithAReason) {
  TlsPair p = HandshakePsk(dir_);
  ASSERT_TRUE(p.client && p.server);
  // The server's process dies: its socket closes without close_notify.
  ::shutdown(p.server_fd, SHUT_RDWR);
  ExpectPeerGone(WriteUntilFailure(*p.client));
  p.client->Close();  // close_notify to a dead peer: one more write, no signal
}

TEST_F(TlsPeerClosed, ServerWriteFailsWithAReason) {
  TlsPair p = HandshakePsk(dir_);
  ASSERT_TRUE(p.client && p.server);
  ::shutdown(p.client_fd, SHUT_RDWR);
  ExpectPeerGone(WriteUntilFailure(*p.server));
  p.server->Close();
}

TEST_F(TlsPeerClosed, EnvelopeAfterThePeerClosedIsAnError) {
  TlsPair p = HandshakePsk(dir_);
  ASSERT_TRUE(p.client && p.server);
  p.server->Close();
  ::shutdown(p.server_fd, SHUT_RDWR);
  wire::v1::Envelope abort;
  abort.mutable_abort()->set_reason("test");
  abort.mutable_abort()->set_phase("test");
  Status st;
  for (int i = 0; i < 200 && st.ok(); ++i) {
    st = wire::SendEnvelope(*p.client, abort);
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(st.ok());
}

TEST(PeerClosedWrite, ShimSocketFailsWithEpipe) {
  signal(SIGPIPE, SIG_DFL);
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ::close(sv[1]);
  std::byte payload[16] = {};
  int rc = shimwire::SendMsg(sv[0], shimwire::Msg::kHello, 0, payload);
  EXPECT_EQ(rc, -EPIPE);
  ::close(sv[0]);
}

}  // namespace
}  // namespace gpumigrate
