// QmpClient against a scripted QEMU on a socketpair (scripted_qmp_peer.h):
// handshake, replies matched by id, QEMU's errors, timeouts, a peer that breaks
// the protocol or goes away, line framing, and the helpers' argument shapes.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

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

TEST(QmpClient, GreetingAndCapabilitiesNegotiation) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Greet(7, 2, 22);
    json caps = io.Expect("qmp_capabilities");
    if (!caps.contains("id")) io.Fail("qmp_capabilities carries no id");
    io.Return(caps, json::object());
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->version().major, 7);
  EXPECT_EQ(c->version().minor, 2);
  EXPECT_EQ(c->version().micro, 22);
  EXPECT_EQ(c->version().package, "test");
  EXPECT_EQ(c->greeting_capabilities(), json::array({"oob"}));
  EXPECT_TRUE(c->connected());
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
  ASSERT_EQ(peer.commands().size(), 1u);
}

TEST(QmpClient, NotAGreetingIsRefused) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) { io.SendLine({{"return", json::object()}}); });
  auto c = QmpClient::Adopt(peer.TakeClientFd());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(c.status().message().find("not a QMP greeting"), std::string::npos) << c.status().message();
}

TEST(QmpClient, NoGreetingTimesOutAndSaysWhy) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) { io.DrainUntilClosed(); });
  QmpOptions o;
  o.connect_timeout = kShort;
  auto t0 = std::chrono::steady_clock::now();
  auto c = QmpClient::Adopt(peer.TakeClientFd(), o);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.status().message().find("one QMP client per socket"), std::string::npos) << c.status().message();
  EXPECT_GE(took, kShort);
  EXPECT_LT(took, kShort + kSlack);
}

TEST(QmpClient, CommandReturnsItsValue) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    json q = io.Expect("query-status");
    if (q.contains("arguments")) io.Fail("query-status sent arguments");
    io.Return(q, {{"status", "running"}, {"singlestep", false}, {"running", true}});
    json m = io.Expect("migrate");
    if (m["arguments"] != json{{"uri", "unix:/tmp/x.sock"}}) io.Fail("migrate arguments: " + m.dump());
    io.Return(m, json::object());
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto r = c->Execute("query-status");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["status"], "running");
  auto m = c->Execute("migrate", {{"uri", "unix:/tmp/x.sock"}});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(*m, json::object());
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
  auto cmds = peer.commands();
  ASSERT_EQ(cmds.size(), 3u);
  EXPECT_NE(cmds[1]["id"], cmds[2]["id"]);
}

TEST(QmpClient, ErrorReplyNamesCommandClassAndDesc) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Error(io.Expect("migrate-continue"), "GenericError", "Migration not in expected state: pre-switchover");
    io.Error(io.Expect("no-such-thing"), "CommandNotFound", "The command no-such-thing has not been found");
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  Status s = c->MigrateContinue("active");
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "qmp: migrate-continue failed: QEMU error GenericError: Migration not in expected state: pre-switchover");
  EXPECT_EQ(c->last_error_class(), "GenericError");
  auto r = c->Execute("no-such-thing");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(c->last_error_class(), "CommandNotFound");
  EXPECT_TRUE(c->connected());  // QEMU's refusal is not a broken connection
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
}

TEST(QmpClient, SilentQemuTimesOutWithinBoundAndLateReplyIsDropped) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    json slow = io.Expect("query-migrate");  // not answered in time
    json next = io.Expect("query-status");
    io.Return(slow, {{"status", "late"}});  // for the timed-out command: must be dropped
    io.Return(next, {{"status", "paused"}, {"running", false}});
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  auto r = c->QueryMigrate(kShort);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.status().message(), "qmp: query-migrate failed: no reply from QEMU within 150 ms");
  EXPECT_GE(took, kShort);
  EXPECT_LT(took, kShort + kSlack);
  auto st = c->QueryStatus(kSlack);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->status, "paused");
  EXPECT_FALSE(st->running);
  EXPECT_EQ(c->stale_replies(), 1u);
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
}

TEST(QmpClient, MalformedJsonIsAnErrorAndClosesTheConnection) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Expect("query-status");
    io.Send("{\"return\": {\"status\": \r\n");
    io.DrainUntilClosed();
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto r = c->Execute("query-status", nullptr, kSlack);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("query-status failed: malformed message"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(c->connected());
  auto again = c->Execute("query-status", nullptr, kSlack);
  EXPECT_EQ(again.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(again.status().message().find("malformed"), std::string::npos) << again.status().message();
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
}

TEST(QmpClient, JsonThatIsNotAnObjectIsMalformed) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Expect("query-status");
    io.Send("[1, 2, 3]\r\n");
    io.DrainUntilClosed();
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto r = c->Execute("query-status", nullptr, kSlack);
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
}

TEST(QmpClient, PeerClosingMidCommandIsNamed) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Expect("migrate");
    io.Close();
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  Status s = c->Migrate("unix:/tmp/x.sock", kSlack);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kSlack);  // seen as closed, not as a timeout
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("qmp: migrate failed: QEMU closed the QMP socket"), std::string::npos) << s.message();
  EXPECT_FALSE(c->connected());
}

TEST(QmpClient, OversizedLineIsAnErrorNotAHang) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Expect("query-migrate");
    io.Send("{\"return\":\"" + std::string(8192, 'x'));  // and never a newline
    io.DrainUntilClosed();
  });
  QmpOptions o;
  o.max_line_bytes = 1024;
  auto c = AdoptOrDie(peer, o);
  ASSERT_NE(c, nullptr);
  auto r = c->QueryMigrate(kSlack);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("longer than 1024 bytes"), std::string::npos) << r.status().message();
}

TEST(QmpClient, LineSplitAcrossSeveralWrites) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    json q = io.Expect("query-status");
    std::string reply = json{{"return", {{"status", "running"}, {"running", true}}}, {"id", q["id"]}}.dump() + "\r\n";
    for (size_t i = 0; i < reply.size(); i += 7) {
      io.Send(reply.substr(i, 7));
      std::this_thread::sleep_for(milliseconds(2));
    }
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto st = c->QueryStatus(kSlack);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->status, "running");
  EXPECT_TRUE(st->running);
}

TEST(QmpClient, HelpersSendQemuArgumentShapes) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    json caps = io.Expect("migrate-set-capabilities");
    json want = {{"capabilities",
                  {{{"capability", "events"}, {"state", true}}, {{"capability", "x-ignore-shared"}, {"state", false}}}}};
    if (caps["arguments"] != want) io.Fail("capabilities: " + caps.dump());
    io.Return(caps, json::object());
    json params = io.Expect("migrate-set-parameters");
    if (params["arguments"] != json{{"max-bandwidth", 1073741824}}) io.Fail("parameters: " + params.dump());
    io.Return(params, json::object());
    json cont = io.Expect("migrate-continue");
    if (cont["arguments"] != json{{"state", "pre-switchover"}}) io.Fail("continue: " + cont.dump());
    io.Return(cont, json::object());
    json cancel = io.Expect("migrate_cancel");
    io.Return(cancel, json::object());
    json hmp = io.Expect("human-monitor-command");
    if (hmp["arguments"] != json{{"command-line", "info status"}}) io.Fail("hmp: " + hmp.dump());
    io.Return(hmp, "VM status: running\r\n");
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->SetMigrationCapabilities({{"events", true}, {"x-ignore-shared", false}}).ok());
  EXPECT_TRUE(c->SetMigrationParameters({{"max-bandwidth", 1073741824}}).ok());
  EXPECT_TRUE(c->MigrateContinue().ok());
  EXPECT_TRUE(c->MigrateCancel().ok());
  auto text = c->HumanMonitorCommand("info status");
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "VM status: running\r\n");
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
}

}  // namespace
}  // namespace gpumigrate
