// TCP streams over loopback only, each bounded in time.
#include "transport/net/tcp.h"

#include <cerrno>
#include <thread>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

TEST(Tcp, ParsesAddresses) {
  auto a = ParseHostPort("127.0.0.1:7000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7000);
  auto b = ParseHostPort("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_FALSE(ParseHostPort("localhost").ok());
  EXPECT_FALSE(ParseHostPort("localhost:70000").ok());
  EXPECT_FALSE(ParseHostPort("[::1]7000").ok());
  EXPECT_FALSE(ParseHostPort(":80").ok());
}

struct Pair {
  std::unique_ptr<Stream> client, server;
};

Pair Connect() {
  auto l = TcpListener::Listen({"127.0.0.1", 0});
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  Pair p;
  std::thread t([&] {
    auto c = ConnectTcp({"127.0.0.1", (*l)->port()}, 2000ms);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    p.client = std::move(c).value();
  });
  auto s = (*l)->Accept(2000ms, "server");
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  t.join();
  p.server = std::move(s).value();
  return p;
}

// Nobody listens: the refusal carries ECONNREFUSED (a resumption gives up on
// a receiver that is gone by it, not by the message's words).
TEST(Tcp, ARefusedConnectionSaysSoByItsErrno) {
  auto l = TcpListener::Listen(*ParseHostPort("127.0.0.1:0"));
  ASSERT_TRUE(l.ok()) << l.status().message();
  const HostPort to{"127.0.0.1", static_cast<uint16_t>((*l)->port())};
  l->reset();
  auto fd = ConnectTcpFd(to, 2000ms);
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().error_number(), ECONNREFUSED) << fd.status().message();
}

TEST(Tcp, CountsTheBytesThePeerAcknowledged) {
  Pair p = Connect();
  auto before = p.client->BytesDelivered();
  ASSERT_TRUE(before.has_value()) << "TCP_INFO without tcpi_bytes_acked";
  std::vector<std::byte> data(1 << 20, std::byte{5});
  ASSERT_TRUE(p.client->WriteAll(data).ok());
  std::vector<std::byte> got(data.size());
  ASSERT_TRUE(p.server->ReadExact(got).ok());
  // Read means received, and acknowledged soon after (delayed ACKs: well within a second).
  uint64_t acked = 0;
  for (int i = 0; i < 100 && acked < data.size(); ++i) {
    acked = p.client->BytesDelivered().value_or(0) - *before;
    if (acked < data.size()) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(acked, data.size());
  auto [a, b] = MakePipe("pipe");
  EXPECT_FALSE(a->BytesDelivered().has_value());  // a pipe cannot tell
}

// A reader that does not read: the peer's window fills, and what the writer
// hands the socket then waits in it unsent (the signal LinkWatch reads as "the
// link sets the pace"); once read, nothing is left unsent.
TEST(Tcp, SaysWhatWaitsInTheSocketUnsent) {
  Pair p = Connect();
  ASSERT_TRUE(p.client->BytesUnsent().has_value()) << "TCP_INFO without tcpi_notsent_bytes";
  EXPECT_EQ(*p.client->BytesUnsent(), 0u);
  std::vector<std::byte> data(32 << 20, std::byte{7});
  std::thread writer([&] { EXPECT_TRUE(p.client->WriteAll(data).ok()); });
  uint64_t unsent = 0;
  for (int i = 0; i < 200 && unsent == 0; ++i) {
    std::this_thread::sleep_for(10ms);
    unsent = p.client->BytesUnsent().value_or(0);
  }
  EXPECT_GT(unsent, 0u) << "the peer's window is full: written bytes must wait unsent";
  std::vector<std::byte> got(data.size());
  ASSERT_TRUE(p.server->ReadExact(got).ok());
  writer.join();
  for (int i = 0; i < 100 && unsent > 0; ++i) {
    unsent = p.client->BytesUnsent().value_or(1);
    if (unsent > 0) std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(unsent, 0u);
  auto [a, b] = MakePipe("pipe");
  EXPECT_FALSE(a->BytesUnsent().has_value());  // a pipe cannot tell
}

TEST(Tcp, CarriesBytesBothWays) {
  Pair p = Connect();
  std::vector<std::byte> data(8 << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7);
  std::thread w([&] { EXPECT_TRUE(p.client->WriteAll(data).ok()); });
  std::vector<std::byte> got(data.size());
  ASSERT_TRUE(p.server->ReadExact(got).ok());
  w.join();
  EXPECT_EQ(got, data);
  std::byte back[3] = {std::byte{1}, std::byte{2}, std::byte{3}}, in[3];
  ASSERT_TRUE(p.server->WriteAll(back).ok());
  ASSERT_TRUE(p.client->ReadExact(in).ok());
  EXPECT_EQ(in[2], std::byte{3});
}

TEST(Tcp, PeerCloseIsEndOfStreamWithACount) {
  Pair p = Connect();
  std::byte five[5] = {};
  ASSERT_TRUE(p.client->WriteAll(five).ok());
  p.client->Close();
  std::byte ten[10];
  Status s = p.server->ReadExact(ten);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("closed after 5 of 10 bytes"), std::string::npos) << s.message();
}

TEST(Tcp, CloseWakesABlockedReader) {
  Pair p = Connect();
  std::thread closer([&] {
    std::this_thread::sleep_for(20ms);
    p.server->Close();
  });
  std::byte b[1];
  EXPECT_FALSE(p.server->ReadExact(b).ok());
  closer.join();
}

// A migration given up on a slow link: Close() would leave what waits in the
// socket to drain ahead of anything else (minutes at a collapsed rate); Reset()
// drops it. The blocked writer is woken, and the peer, once it has read what
// had already reached it, meets a reset, not the end of a stream that carried
// everything.
TEST(Tcp, AResetDropsWhatWasWrittenAndNotYetSent) {
  for (bool reset : {false, true}) {
    SCOPED_TRACE(reset ? "Reset" : "Close");
    Pair p = Connect();
    std::vector<std::byte> data(32 << 20, std::byte{7});
    Status wrote;
    std::thread writer([&] { wrote = p.client->WriteAll(data); });
    uint64_t unsent = 0;
    for (int i = 0; i < 500 && unsent == 0; ++i) {
      std::this_thread::sleep_for(10ms);
      unsent = p.client->BytesUnsent().value_or(0);
    }
    ASSERT_GT(unsent, 0u) << "the peer's window never filled";
    if (reset) {
      p.client->Reset();
    } else {
      p.client->Close();
    }
    writer.join();  // woken either way
    EXPECT_FALSE(wrote.ok());
    std::vector<std::byte> got(data.size());
    Status read = p.server->ReadExact(got);
    ASSERT_FALSE(read.ok());
    const bool was_reset = read.message().find("reset") != std::string::npos;
    EXPECT_EQ(was_reset, reset) << read.message();
  }
}

TEST(Tcp, RefusedAndTimedOutAreClearErrors) {
  // Find a free port, then close it: nobody listens there.
  uint16_t port;
  {
    auto l = TcpListener::Listen({"127.0.0.1", 0});
    ASSERT_TRUE(l.ok());
    port = (*l)->port();
  }
  auto c = ConnectTcp({"127.0.0.1", port}, 1000ms);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("Connection refused"), std::string::npos) << c.status().message();
  auto l = TcpListener::Listen({"127.0.0.1", 0});
  ASSERT_TRUE(l.ok());
  auto a = (*l)->Accept(50ms, "x");
  EXPECT_EQ(a.status().code(), StatusCode::kDeadlineExceeded);
}

TEST(Tcp, ACancelledListenerStopsWaitingForAConnection) {
  auto l = TcpListener::Listen({"127.0.0.1", 0});
  ASSERT_TRUE(l.ok());
  std::atomic<bool> cancel{false};
  (*l)->SetCancel(&cancel);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    cancel = true;
  });
  auto a = (*l)->AcceptFd(60s);  // without the cancel: a 60 s deadline
  stopper.join();
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kAborted) << a.status().message();
  // Cleared, it waits (and accepts) as before.
  cancel = false;
  auto c = ConnectTcp({"127.0.0.1", (*l)->port()}, 1000ms);
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto b = (*l)->Accept(2000ms, "x");
  EXPECT_TRUE(b.ok()) << b.status().message();
}

}  // namespace
}  // namespace gpumigrate
