// Mailbox and ControlReader: order, failures after the queue drains, deadlines on
// a fake clock moved by another thread, cancel, the peer's Abort, WaitFor. Every
// wait is bounded in real time: a mailbox that missed a wake-up would fail the
// test, not hang it.
#include "engine/session/mailbox.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

wire::v1::Envelope Hello() { return wire::MakeHello("test", {}); }
wire::v1::Envelope RoundEnd(uint32_t round) { return wire::MakeRoundEnd(round, {1, 2}); }
wire::v1::Envelope Abort(const char* reason) { return wire::MakeAbort(reason, "precopy"); }

TEST(Mailbox, NextReturnsQueuedMessagesInOrder) {
  FakeClock clock;
  Mailbox box(clock);
  box.Post(Hello());
  box.Post(RoundEnd(3));
  box.Post(Abort("why"));
  const auto deadline = clock.Now() + 1s;
  auto a = box.Next(deadline, nullptr, "a");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->has_hello());
  auto b = box.Next(deadline, nullptr, "b");
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b->has_round_end());
  EXPECT_EQ(b->round_end().round(), 3u);
  auto c = box.Next(deadline, nullptr, "c");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->has_abort());
  EXPECT_EQ(c->abort().reason(), "why");
}

TEST(Mailbox, AFailureComesAfterTheQueuedMessagesAndTheFirstOneWins) {
  FakeClock clock;
  Mailbox box(clock);
  box.Post(Hello());
  box.Post(RoundEnd(0));
  box.Fail(Unavailable("control: read failed: stream closed"));
  box.Fail(Internal("second failure"));
  EXPECT_EQ(box.failure().message(), "control: read failed: stream closed");
  const auto deadline = clock.Now() + 1s;
  ASSERT_TRUE(box.Next(deadline, nullptr, "hello").ok());
  ASSERT_TRUE(box.Next(deadline, nullptr, "round end").ok());
  auto third = box.Next(deadline, nullptr, "more");
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(third.status().message(), "control: read failed: stream closed");
}

TEST(Mailbox, DeadlineOnAFakeClockMovedByAnotherThread) {
  FakeClock clock;
  Mailbox box(clock);
  std::atomic<bool> advanced{false}, returned{false};
  std::thread mover([&] {
    std::this_thread::sleep_for(30ms);
    clock.Advance(2s);
    advanced = true;
    // A mailbox that never re-reads the clock would wait forever: unblock it so
    // the test fails instead of hanging.
    for (int i = 0; i < 200 && !returned.load(); ++i) std::this_thread::sleep_for(10ms);
    if (!returned.load()) box.Post(Hello());
  });
  const auto real_start = std::chrono::steady_clock::now();
  auto r = box.Next(clock.Now() + 1s, nullptr, "hello");
  returned = true;
  const auto real_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - real_start);
  mover.join();
  EXPECT_TRUE(advanced.load()) << "Next returned before the fake deadline passed";
  ASSERT_FALSE(r.ok()) << "Next only returned because the test posted a message";
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(r.status().message(), "timed out waiting for hello");
  // Seen within a poll interval or so of the Advance, far from the 2 s fallback.
  EXPECT_LT(real_ms, 1000ms);
}

TEST(Mailbox, CancelEndsTheWaitAsAborted) {
  FakeClock clock;
  Mailbox box(clock);
  std::atomic<bool> cancel{false};
  auto r = std::async(std::launch::async, [&] { return box.Next(clock.Now() + 1s, &cancel, "manifest"); });
  EXPECT_EQ(r.wait_for(30ms), std::future_status::timeout) << "Next returned with nothing to return";
  cancel = true;  // no Notify: the poll must see it
  ASSERT_EQ(r.wait_for(5s), std::future_status::ready);
  auto got = r.get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kAborted);
  EXPECT_EQ(got.status().message(), "cancelled while waiting for manifest");
}

// The session judges the link while it waits for RoundApplied: the hook is
// called between polls, its error ends the wait, and a message that came wins.
TEST(Mailbox, NextCallsItsWaitHookAndEndsOnItsError) {
  FakeClock clock;
  Mailbox box(clock);
  std::atomic<int> calls{0};
  std::atomic<bool> give_up{false};
  const std::function<Status()> hook = [&]() -> Status {
    ++calls;
    return give_up ? Aborted("link too slow") : Status::Ok();
  };
  auto r = std::async(std::launch::async,
                      [&] { return box.Next(clock.Now() + 1s, nullptr, "RoundApplied", false, &hook); });
  EXPECT_EQ(r.wait_for(300ms), std::future_status::timeout);
  EXPECT_GE(calls.load(), 1);
  give_up = true;
  ASSERT_EQ(r.wait_for(5s), std::future_status::ready);
  auto got = r.get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kAborted);
  EXPECT_EQ(got.status().message(), "link too slow");
  box.Post(RoundEnd(7));  // already there: returned, the hook not asked
  const int before = calls.load();
  auto next = box.Next(clock.Now() + 1s, nullptr, "RoundEnd", false, &hook);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->round_end().round(), 7u);
  EXPECT_EQ(calls.load(), before);
}

TEST(Mailbox, PeerAbortFindsAQueuedAbortBehindOtherMessages) {
  FakeClock clock;
  Mailbox box(clock);
  box.Post(Hello());
  box.Post(RoundEnd(1));
  box.Post(Abort("destination out of memory"));
  auto a = box.PeerAbort(clock.Now() + 1s);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->reason(), "destination out of memory");
  EXPECT_EQ(a->phase(), "precopy");
}

TEST(Mailbox, PeerAbortWaitsForALateAbort) {
  FakeClock clock;
  Mailbox box(clock);
  auto r = std::async(std::launch::async, [&] { return box.PeerAbort(clock.Now() + 1s); });
  EXPECT_EQ(r.wait_for(30ms), std::future_status::timeout);
  box.Post(Abort("late"));
  ASSERT_EQ(r.wait_for(5s), std::future_status::ready);
  auto a = r.get();
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->reason(), "late");
}

TEST(Mailbox, PeerAbortIsNulloptOnceTheReaderIsDone) {
  FakeClock clock;
  Mailbox box(clock);
  box.Post(Hello());
  auto r = std::async(std::launch::async, [&] { return box.PeerAbort(clock.Now() + 1s); });
  EXPECT_EQ(r.wait_for(30ms), std::future_status::timeout) << "no Abort, reader running, deadline ahead";
  box.ReaderDone();
  ASSERT_EQ(r.wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(r.get().has_value());
  EXPECT_TRUE(box.Next(clock.Now() + 1s, nullptr, "hello").ok()) << "PeerAbort must not consume messages";
}

TEST(Mailbox, PeerAbortIsNulloptAtTheDeadline) {
  FakeClock clock;
  Mailbox box(clock);
  auto r = std::async(std::launch::async, [&] { return box.PeerAbort(clock.Now() + 1s); });
  EXPECT_EQ(r.wait_for(30ms), std::future_status::timeout);
  clock.Advance(1s);
  ASSERT_EQ(r.wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(r.get().has_value());
}

TEST(Mailbox, WaitForReturnsWhenThePredicateHolds) {
  FakeClock clock;
  Mailbox box(clock);
  std::atomic<int> frames{0};
  auto r = std::async(std::launch::async,
                      [&] { return box.WaitFor([&] { return frames.load() >= 3; }, clock.Now() + 1s, nullptr, "frames"); });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.wait_for(10ms), std::future_status::timeout) << "returned at " << frames.load() << " frames";
    ++frames;
    box.Notify();
  }
  ASSERT_EQ(r.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(r.get().ok());
}

TEST(Mailbox, WaitForEndsOnAFailureOrTheDeadline) {
  FakeClock clock;
  Mailbox box(clock);
  auto never = [] { return false; };
  box.Fail(Corrupt("data stream 0: bad tag"));
  Status failed = box.WaitFor(never, clock.Now() + 1s, nullptr, "frames");
  EXPECT_EQ(failed.code(), StatusCode::kCorrupt);
  EXPECT_EQ(failed.message(), "data stream 0: bad tag");

  Mailbox box2(clock);
  EXPECT_TRUE(box2.WaitFor([] { return true; }, clock.Now(), nullptr, "x").ok()) << "a holding predicate wins";
  Status late = box2.WaitFor(never, clock.Now(), nullptr, "frames");
  EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.message(), "timed out waiting for frames");
}

TEST(ControlReader, PostsEnvelopesAndReportsAnAbortAtOnce) {
  FakeClock clock;
  Mailbox box(clock);
  auto [peer, local] = MakePipe("control");
  std::promise<std::string> aborted;
  {
    ControlReader reader(local.get(), &box, [&](const wire::v1::Abort& a) { aborted.set_value(a.reason()); });
    ASSERT_TRUE(wire::SendEnvelope(*peer, Hello()).ok());
    ASSERT_TRUE(wire::SendEnvelope(*peer, RoundEnd(4)).ok());
    ASSERT_TRUE(wire::SendEnvelope(*peer, Abort("peer gave up")).ok());
    auto f = aborted.get_future();
    ASSERT_EQ(f.wait_for(5s), std::future_status::ready);
    EXPECT_EQ(f.get(), "peer gave up");
    const auto deadline = clock.Now() + 1s;
    auto a = box.Next(deadline, nullptr, "hello");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_TRUE(a->has_hello());
    auto b = box.Next(deadline, nullptr, "round end");
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->round_end().round(), 4u);
    auto c = box.Next(deadline, nullptr, "abort");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->abort().reason(), "peer gave up");

    // The peer closes: the reader records why and stops.
    peer->Close();
    auto d = std::async(std::launch::async, [&] { return box.Next(clock.Now() + 1s, nullptr, "more"); });
    ASSERT_EQ(d.wait_for(5s), std::future_status::ready);
    auto got = d.get();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().ToString();
    EXPECT_FALSE(box.PeerAbort(clock.Now() + 1s).has_value()) << "the reader is done and the Abort was consumed";
    local->Close();
  }
}

TEST(ControlReader, StopQuietlyRecordsNoFailure) {
  FakeClock clock;
  Mailbox box(clock);
  auto [peer, local] = MakePipe("control");
  {
    ControlReader reader(local.get(), &box, nullptr);
    reader.StopQuietly();
    local->Close();
  }
  // The stream failed (we closed it), but a reader told to stop reports nothing.
  EXPECT_TRUE(box.failure().ok()) << box.failure().ToString();
}

// However the reader ends, stopped before its first read included, it says no
// message will come: PeerAbort must not wait out its deadline (on a fake clock,
// that is forever; the future bounds the test in real time).
TEST(ControlReader, AReaderStoppedAtOnceIsDone) {
  for (int i = 0; i < 50; ++i) {
    FakeClock clock;
    Mailbox box(clock);
    auto [peer, local] = MakePipe("control");
    {
      ControlReader reader(local.get(), &box, nullptr);
      reader.StopQuietly();
      local->Close();
    }
    auto abort = std::async(std::launch::async, [&] { return box.PeerAbort(clock.Now() + 1h); });
    if (abort.wait_for(2s) != std::future_status::ready) {
      box.Post(Abort("unblock the waiter"));  // so the future can be destroyed
      FAIL() << "PeerAbort still waiting after the reader ended (run " << i << ")";
    }
    EXPECT_FALSE(abort.get().has_value());
  }
}

}  // namespace
}  // namespace gpumigrate
