// QmpClient over a UNIX socket path: Connect(), and Reconnect() after QEMU
// closed the connection.
#include <gtest/gtest.h>

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpumigrate/qemu/qmp.h"
#include "tests/unit/qemu/scripted_qmp_peer.h"

namespace gpumigrate {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using testing::AdoptOrDie;
using testing::FakeQemuIo;
using testing::kShort;
using testing::kSlack;
using testing::ScriptedQmpPeer;

// A QEMU that listens on a UNIX socket path, serving one client after another.
class ListeningPeer {
 public:
  ListeningPeer() {
    char dir[] = "/tmp/gm-qmp-test-XXXXXX";
    if (mkdtemp(dir)) dir_ = dir;
    path_ = dir_ + "/qmp.sock";
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.data(), path_.size());
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd_, 4) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~ListeningPeer() {
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& path() const { return path_; }
  bool ok() const { return fd_ >= 0; }
  // Runs `scripts[i]` on the i-th accepted connection, in a thread.
  void Serve(std::vector<ScriptedQmpPeer::Script> scripts) {
    thread_ = std::thread([this, scripts = std::move(scripts)] {
      for (const auto& script : scripts) {
        int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (conn < 0) return;
        FakeQemuIo io(conn, &record_);
        script(io);
      }
    });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::string> failures() {
    std::lock_guard<std::mutex> lock(record_.mu);
    return record_.failures;
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
  testing::PeerRecord record_;
  std::thread thread_;
};

TEST(QmpClient, ReconnectOpensThePathAgainAndRenegotiates) {
  ListeningPeer peer;
  ASSERT_TRUE(peer.ok());
  peer.Serve({[](FakeQemuIo& io) {
                io.Handshake();
                io.Event("STOP", json::object());
                io.Expect("query-status");
                io.Close();  // QEMU restarted under us
              },
              [](FakeQemuIo& io) {
                io.Greet(8, 0, 1);
                io.Return(io.Expect("qmp_capabilities"), json::object());
                io.Return(io.Expect("query-status"), {{"status", "running"}, {"running", true}});
              }});
  auto c = QmpClient::Connect(peer.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->version().major, 7);
  auto first = (*c)->QueryStatus(kSlack);
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(first.status().message().find("QEMU closed the QMP socket " + peer.path()), std::string::npos)
      << first.status().message();
  Status r = (*c)->Reconnect();
  ASSERT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ((*c)->version().major, 8);
  auto second = (*c)->QueryStatus(kSlack);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_TRUE(second->running);
  ASSERT_EQ((*c)->queued_events().size(), 1u);  // received before the reconnect: kept
  EXPECT_EQ((*c)->queued_events()[0].name, "STOP");
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
}

TEST(QmpClient, ConnectToAMissingSocketFailsWithinTheConnectTimeout) {
  QmpOptions o;
  o.connect_timeout = kShort;
  auto t0 = std::chrono::steady_clock::now();
  auto c = QmpClient::Connect("/tmp/gm-qmp-test-no-such-dir/qmp.sock", o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kShort + kSlack);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("connect to /tmp/gm-qmp-test-no-such-dir/qmp.sock failed"), std::string::npos)
      << c.status().message();
}

TEST(QmpClient, ReconnectNeedsAPath) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) { io.Handshake(); });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->Reconnect().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gpumigrate
