// QmpClient's events against a scripted QEMU: queued around replies, kept in
// order, waited for by name and data, and Cancel() from another thread.
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

TEST(QmpClient, EventBetweenCommandAndReplyIsQueued) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    json m = io.Expect("migrate-incoming");
    io.Event("MIGRATION", {{"status", "setup"}}, 1700000001, 250);
    io.Return(m, json::object());
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->MigrateIncoming("unix:/tmp/in.sock").ok());
  ASSERT_EQ(c->queued_events().size(), 1u);
  auto e = c->WaitEvent("MIGRATION", milliseconds(0), {{"status", "setup"}});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->data["status"], "setup");
  EXPECT_EQ(e->qemu_time, std::chrono::seconds(1700000001) + std::chrono::microseconds(250));
  EXPECT_NE(e->received, Clock::TimePoint{});
  EXPECT_TRUE(c->queued_events().empty());
  ASSERT_EQ(c->event_log().size(), 1u);  // returned, still logged
  peer.Join();
  EXPECT_EQ(peer.failures(), std::vector<std::string>{});
}

TEST(QmpClient, EventsKeepTheirOrderAndNonMatchingOnesStayQueued) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Event("MIGRATION", {{"status", "active"}}, 10);
    io.Event("STOP", json::object(), 11);
    io.Event("MIGRATION", {{"status", "pre-switchover"}}, 12);
    io.Event("RESUME", json::object(), 13);
    io.Event("MIGRATION", {{"status", "completed"}}, 14);
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto e = c->WaitEvent("MIGRATION", kSlack, {{"status", "pre-switchover"}});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->qemu_time, std::chrono::seconds(12));
  auto resume = c->WaitEvent("RESUME", kSlack);
  ASSERT_TRUE(resume.ok()) << resume.status().ToString();
  auto done = c->WaitEvent("MIGRATION", kSlack, {{"status", "completed"}});
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  auto rest = c->TakeQueuedEvents();
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].name, "MIGRATION");
  EXPECT_EQ(rest[0].data["status"], "active");
  EXPECT_EQ(rest[1].name, "STOP");
  ASSERT_EQ(c->event_log().size(), 5u);
  std::vector<std::string> names;
  for (size_t i = 0; i < c->event_log().size(); ++i) {
    names.push_back(c->event_log()[i].name);
    EXPECT_EQ(c->event_log()[i].seq, i + 1);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"MIGRATION", "STOP", "MIGRATION", "RESUME", "MIGRATION"}));
  // STOP -> RESUME in QEMU's time: 2 s.
  EXPECT_EQ(c->event_log()[3].qemu_time - c->event_log()[1].qemu_time, std::chrono::seconds(2));
}

TEST(QmpClient, WaitEventTimesOutWithinBound) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Event("STOP", json::object());
    io.DrainUntilClosed();
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  auto e = c->WaitEvent("RESUME", kShort);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(e.status().message(), "qmp: wait for event RESUME failed: none within 150 ms (1 other events queued)");
  EXPECT_GE(took, kShort);
  EXPECT_LT(took, kShort + kSlack);
  ASSERT_EQ(c->queued_events().size(), 1u);
  EXPECT_EQ(c->queued_events()[0].name, "STOP");
}

TEST(QmpClient, ReadEventsQueuesWhatArrivedWithoutACommand) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.Event("STOP", json::object());
    io.Event("RESUME", json::object());
    io.DrainUntilClosed();
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->ReadEvents(kShort).ok());
  ASSERT_EQ(c->queued_events().size(), 2u);
  EXPECT_EQ(c->queued_events()[1].name, "RESUME");
}

TEST(QmpClient, TwoObjectsInOneWrite) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    json q = io.Expect("cont");
    io.Send(json{{"event", "RESUME"}, {"data", json::object()}}.dump() + "\r\n" +
            json{{"return", json::object()}, {"id", q["id"]}}.dump() + "\r\n");
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Cont(kSlack).ok());
  ASSERT_EQ(c->queued_events().size(), 1u);
  EXPECT_EQ(c->queued_events()[0].name, "RESUME");
  EXPECT_EQ(c->queued_events()[0].qemu_time, std::chrono::microseconds(0));  // no timestamp sent
}

TEST(QmpClient, CancelFromAnotherThreadEndsTheWait) {
  ScriptedQmpPeer peer([](FakeQemuIo& io) {
    io.Handshake();
    io.DrainUntilClosed();
  });
  auto c = AdoptOrDie(peer);
  ASSERT_NE(c, nullptr);
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(50));
    c->Cancel();
  });
  auto t0 = std::chrono::steady_clock::now();
  auto r = c->Execute("query-migrate", nullptr, milliseconds(10000));
  auto took = std::chrono::steady_clock::now() - t0;
  canceller.join();
  EXPECT_EQ(r.status().code(), StatusCode::kAborted);
  EXPECT_LT(took, kSlack);
  EXPECT_EQ(c->WaitEvent("STOP", kShort).status().code(), StatusCode::kAborted);  // sticky
}

}  // namespace
}  // namespace gpumigrate
