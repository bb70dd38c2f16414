// Liveness (engine/session/liveness.h) and the Mailbox's progress rule, on a fake
// clock moved by the test: a peer whose progress moves is waited for past any
// per-reply deadline; one that is alive but stuck is given up after the
// progress timeout, naming what it said it was doing; silence and a blocked
// control write fail the session and close its streams; keepalives carry the
// progress and the step. Every wait is bounded in real time.
#include "engine/session/liveness.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

wire::v1::Envelope Keepalive(uint64_t progress, const char* activity) {
  wire::v1::Envelope env;
  env.mutable_keepalive()->set_progress(progress);
  env.mutable_keepalive()->set_activity(activity);
  return env;
}

// Waits (real time, bounded) until pred() holds.
template <typename P>
bool Eventually(P pred, std::chrono::milliseconds limit = 5s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

TEST(MailboxLiveness, APeerWhoseProgressMovesIsWaitedForPastTheDeadline) {
  FakeClock clock;
  Mailbox box(clock);
  box.EnableLiveness(10s, "the destination");
  const auto deadline = clock.Now() + 10s;
  auto waiter = std::async(std::launch::async, [&] { return box.Next(deadline, nullptr, "Prepared"); });
  // 30 s of fake time, the peer's progress moving every 5 s: never 10 s without.
  for (int i = 1; i <= 6; ++i) {
    clock.Advance(5s);
    box.Heard(Keepalive(static_cast<uint64_t>(i), "verifying"));
    ASSERT_EQ(waiter.wait_for(50ms), std::future_status::timeout) << "cut off a peer that gets work done, at " << i;
  }
  box.Post(wire::MakeAbort("done", "test"));
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(waiter.get().ok());
}

TEST(MailboxLiveness, APeerAliveButStuckIsGivenUpAfterTheProgressTimeoutNamingWhatItDid) {
  FakeClock clock;
  Mailbox box(clock);
  box.EnableLiveness(10s, "the destination");
  box.Heard(Keepalive(7, "device: STOP -> RUNNING"));
  const auto deadline = clock.Now() + 1s;  // read here: the waiter may start after the clock moves
  auto waiter = std::async(std::launch::async, [&] { return box.Next(deadline, nullptr, "Running"); });
  for (int i = 0; i < 4; ++i) {
    clock.Advance(2s);
    box.Heard(Keepalive(7, "device: STOP -> RUNNING"));  // alive, same progress
  }
  ASSERT_EQ(waiter.wait_for(100ms), std::future_status::timeout) << "gave up at 8 s, before the 10 s progress timeout";
  clock.Advance(3s);
  box.Heard(Keepalive(7, "device: STOP -> RUNNING"));
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  auto r = waiter.get();
  ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("waiting for Running"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("no progress for 11.0 s"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("device: STOP -> RUNNING"), std::string::npos) << r.status().message();
}

TEST(MailboxLiveness, AProtocolMessageAndAppliedDataCountAsProgress) {
  FakeClock clock;
  Mailbox box(clock);
  box.EnableLiveness(10s, "the source");
  const auto deadline = clock.Now();
  auto waiter = std::async(std::launch::async, [&] {
    return box.WaitFor([] { return false; }, deadline, nullptr, "the round's frames");
  });
  clock.Advance(8s);
  box.PeerProgressed();  // a frame applied
  clock.Advance(8s);
  box.Heard(wire::MakeRoundEnd(0, {1}));
  clock.Advance(8s);
  ASSERT_EQ(waiter.wait_for(100ms), std::future_status::timeout);
  clock.Advance(3s);
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(waiter.get().code(), StatusCode::kDeadlineExceeded);
}

TEST(MailboxLiveness, AHardDeadlineHoldsEvenWithLiveness) {
  FakeClock clock;
  Mailbox box(clock);
  box.EnableLiveness(60s, "the source");
  const auto deadline = clock.Now() + 5s;
  auto waiter = std::async(std::launch::async, [&] {
    return box.Next(deadline, nullptr, "the source to close", /*hard_deadline=*/true);
  });
  clock.Advance(6s);
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(waiter.get().status().code(), StatusCode::kDeadlineExceeded);
}

TEST(MailboxLiveness, WithoutLivenessTheDeadlineIsPerReply) {
  FakeClock clock;
  Mailbox box(clock);
  EXPECT_FALSE(box.SilentFor().has_value());
  const auto deadline = clock.Now() + 5s;
  auto waiter = std::async(std::launch::async, [&] { return box.Next(deadline, nullptr, "Ready"); });
  box.Heard(Keepalive(1, "x"));  // ignored for deadlines: this peer never said it sends them
  clock.Advance(6s);
  ASSERT_EQ(waiter.wait_for(5s), std::future_status::ready);
  EXPECT_EQ(waiter.get().status().message(), "timed out waiting for Ready");
}

TEST(ControlReaderLiveness, KeepalivesAreHeardButNeverQueued) {
  FakeClock clock;
  Mailbox box(clock);
  auto [a, b] = MakePipe("control");
  ControlReader reader(b.get(), &box, nullptr);
  ASSERT_TRUE(wire::SendEnvelope(*a, Keepalive(3, "round 0")).ok());
  ASSERT_TRUE(wire::SendEnvelope(*a, wire::MakeRoundEnd(0, {1})).ok());
  auto env = box.Next(clock.Now() + 1s, nullptr, "RoundEnd", true);
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_TRUE(env->has_round_end()) << "a keepalive reached the session: " << wire::EnvelopeKind(*env);
  a->Close();
  b->Close();
}

struct Side {
  FakeClock clock;
  Mailbox box{clock};
  std::pair<std::unique_ptr<Stream>, std::unique_ptr<Stream>> pipe = MakePipe("control", 1 << 10);
  ControlWriter writer{pipe.first.get(), clock};
  std::atomic<uint64_t> work{0};
  std::atomic<int> dead{0};
  Liveness::Options opt;
  std::unique_ptr<Liveness> live;
  void Start() {
    live = std::make_unique<Liveness>(writer, box, clock, opt, [this] { return work.load(); }, [this] {
      ++dead;
      pipe.first->Close();
    });
  }
  ~Side() {
    if (live) live->StopQuietly();
    pipe.first->Close();
    pipe.second->Close();
  }
};

TEST(Liveness, KeepalivesCarryTheProgressAndTheStepOnlyOnceThePeerSpeaksThem) {
  Side s;
  s.opt.interval = 1s;
  s.Start();
  s.live->Doing("pre-copy round 0");
  std::this_thread::sleep_for(100ms);
  // Nothing before PeerSpeaksKeepalive: an old peer would refuse the message.
  std::byte probe[1];
  auto early = std::async(std::launch::async, [&] { return s.pipe.second->ReadExact(probe); });
  EXPECT_EQ(early.wait_for(150ms), std::future_status::timeout) << "a keepalive went to a peer that never asked";
  s.work = 1000;
  s.live->PeerSpeaksKeepalive();
  ASSERT_EQ(early.wait_for(5s), std::future_status::ready);
  ASSERT_TRUE(early.get().ok());
  // The first byte of the length prefix was read above; read the rest of the envelope by hand.
  std::byte rest[3];
  ASSERT_TRUE(s.pipe.second->ReadExact(rest).ok());
  const uint32_t n = std::to_integer<uint32_t>(probe[0]) | std::to_integer<uint32_t>(rest[0]) << 8 |
                     std::to_integer<uint32_t>(rest[1]) << 16 | std::to_integer<uint32_t>(rest[2]) << 24;
  std::string body(n, '\0');
  ASSERT_TRUE(s.pipe.second->ReadExact(std::as_writable_bytes(std::span(body))).ok());
  wire::v1::Envelope first;
  ASSERT_TRUE(first.ParseFromString(body));
  ASSERT_TRUE(first.has_keepalive());
  EXPECT_EQ(first.keepalive().progress(), 1001u) << "work done plus one step entered";
  EXPECT_EQ(first.keepalive().activity(), "pre-copy round 0");
  // The next one only after the interval (fake time), with the new progress.
  s.work = 5000;
  s.live->Doing("final round");
  // Move the fake clock until the next one comes (the keepalive thread reads the
  // clock after its send, so one step may not be enough).
  auto next = std::async(std::launch::async, [&] { return wire::RecvEnvelope(*s.pipe.second); });
  for (int i = 0; i < 250 && next.wait_for(20ms) != std::future_status::ready; ++i) s.clock.Advance(1s);
  if (next.wait_for(0s) != std::future_status::ready) s.pipe.second->Close();  // ends the read: no hang
  auto second = next.get();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_TRUE(second->has_keepalive());
  EXPECT_EQ(second->keepalive().progress(), 5002u);
  EXPECT_EQ(second->keepalive().activity(), "final round");
  EXPECT_EQ(s.dead.load(), 0);
}

TEST(Liveness, APeerSilentForTheSilenceTimeoutFailsTheSessionAndClosesItsStreams) {
  Side s;
  s.opt.interval = 1h;  // ours do not matter here
  s.opt.silence = 10s;
  s.opt.peer = "the destination";
  s.Start();
  s.live->PeerSpeaksKeepalive();
  std::thread drain([&] {  // the peer's end reads whatever we send
    while (wire::RecvEnvelope(*s.pipe.second).ok()) {
    }
  });
  s.clock.Advance(9s);
  s.box.Heard(Keepalive(1, "round 0"));
  s.clock.Advance(9s);
  std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(s.box.failure().ok()) << "a peer heard 9 s ago is not dead: " << s.box.failure().ToString();
  s.clock.Advance(2s);
  ASSERT_TRUE(Eventually([&] { return s.dead.load() == 1; })) << "silence was not detected";
  EXPECT_EQ(s.box.failure().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.box.failure().message().find("the destination has been silent for 11.0 s"), std::string::npos)
      << s.box.failure().message();
  s.pipe.second->Close();
  drain.join();
}

TEST(Liveness, SilenceIsNotJudgedBeforeThePeerSaidItSendsKeepalives) {
  Side s;
  s.opt.silence = 1s;
  s.Start();
  s.clock.Advance(1h);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(s.dead.load(), 0);
  EXPECT_TRUE(s.box.failure().ok());
}

TEST(Liveness, AControlWriteBlockedForTheSilenceTimeoutFailsTheSession) {
  Side s;  // a 1 KiB pipe nobody reads: the write below blocks
  s.opt.silence = 10s;
  s.opt.peer = "the source";
  s.Start();
  wire::v1::Envelope big = wire::MakeAbort(std::string(64 << 10, 'x'), "test");
  auto send = std::async(std::launch::async, [&] { return s.writer.Send(big); });
  ASSERT_EQ(send.wait_for(100ms), std::future_status::timeout);
  std::string what;
  ASSERT_TRUE(Eventually([&] { return s.writer.Blocked(&what) >= Clock::Duration(0) && !what.empty(); }));
  EXPECT_EQ(what, "Abort");
  s.clock.Advance(9s);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(s.dead.load(), 0);
  s.clock.Advance(2s);
  ASSERT_EQ(send.wait_for(5s), std::future_status::ready) << "the blocked write was not ended";
  EXPECT_FALSE(send.get().ok());
  EXPECT_EQ(s.dead.load(), 1);
  EXPECT_NE(s.box.failure().message().find("sending Abort has been blocked for 11.0 s"), std::string::npos)
      << s.box.failure().message();
  EXPECT_NE(s.box.failure().message().find("the source is not reading"), std::string::npos);
}

}  // namespace
}  // namespace gpumigrate
