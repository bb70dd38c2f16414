#include "engine/session/link_watch.h"

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

// Samples of a link that takes `rate` bytes/s, the streams busy `busy` of the time.
struct Link {
  FrameSender::LinkSample s;
  void Run(std::chrono::milliseconds dt, double rate, double busy = 1.0) {
    s.at += dt;
    s.busy += std::chrono::duration_cast<Clock::Duration>(dt * busy);
    s.written += static_cast<uint64_t>(rate * std::chrono::duration<double>(dt).count());
  }
};

TEST(LinkWatch, NoRateUntilTheRoundHasRunAWindow) {
  LinkWatch w;
  Link l;
  w.RoundStarted(l.s);
  for (int i = 0; i < 19; ++i) {
    l.Run(100ms, 25e6);
    w.Sample(l.s);
  }
  EXPECT_FALSE(w.rate());
  l.Run(100ms, 25e6);
  w.Sample(l.s);
  ASSERT_TRUE(w.rate());
  EXPECT_NEAR(*w.rate(), 25e6, 1e3);
  EXPECT_TRUE(w.busy());
  EXPECT_TRUE(w.LinkBound());
}

TEST(LinkWatch, TheRateFollowsACutWithinAWindowAndThePeakStays) {
  LinkWatch w;
  Link l;
  w.RoundStarted(l.s);
  for (int i = 0; i < 30; ++i) {
    l.Run(100ms, 25e6);
    w.Sample(l.s);
  }
  EXPECT_NEAR(w.peak(), 25e6, 1e3);
  for (int i = 0; i < 20; ++i) {
    l.Run(100ms, 250e3);
    w.Sample(l.s);
  }
  ASSERT_TRUE(w.rate());
  EXPECT_NEAR(*w.rate(), 250e3, 1e3);  // the window holds only the slow part now
  EXPECT_TRUE(w.LinkBound());
  EXPECT_NEAR(w.peak(), 25e6, 1e3);
}

TEST(LinkWatch, ALinkCutBeforeTheFirstFullWindowStillHasItsFastPartAsThePeak) {
  LinkWatch w;
  Link l;
  w.RoundStarted(l.s);
  for (int i = 0; i < 13; ++i) {  // 1.3 s at 25 MB/s, then the cut
    l.Run(100ms, 25e6);
    w.Sample(l.s);
  }
  EXPECT_FALSE(w.rate());
  EXPECT_NEAR(w.peak(), 25e6, 1e3);  // from the spans of 0.5 s and more
  l.Run(4000ms, 250e3);  // one long blocked write at the slow rate
  w.Sample(l.s);
  ASSERT_TRUE(w.rate());
  EXPECT_NEAR(*w.rate(), 250e3, 1e3);
  EXPECT_TRUE(w.LinkBound());
}

TEST(LinkWatch, SpansShorterThanHalfASecondSetNoPeak) {
  LinkWatch w;
  Link l;
  w.RoundStarted(l.s);
  for (int i = 0; i < 4; ++i) {  // a burst into empty socket buffers
    l.Run(100ms, 250e6);
    w.Sample(l.s);
  }
  EXPECT_EQ(w.peak(), 0);
}

TEST(LinkWatch, AnIdleProducerIsNotASlowLink) {
  LinkWatch w;
  Link l;
  w.RoundStarted(l.s);
  for (int i = 0; i < 30; ++i) {
    l.Run(100ms, 25e6);
    w.Sample(l.s);
  }
  for (int i = 0; i < 40; ++i) {  // zero pages: little to send, the streams mostly idle
    l.Run(100ms, 100e3, 0.2);
    w.Sample(l.s);
    if (i >= 2) {
      EXPECT_FALSE(w.LinkBound()) << i;  // a window of mostly idle streams
    }
  }
  EXPECT_FALSE(w.busy());
}

// A collapsed link behind a socket buffer of megabytes: the sender's own queue
// is empty (the socket took every frame), but the socket holds bytes the link
// has not taken all along. That window measured the link.
TEST(LinkWatch, BytesWaitingInTheSocketMakeTheWindowTheLinks) {
  LinkWatch w;
  Link l;
  w.RoundStarted(l.s);
  l.s.unsent = 0;
  for (int i = 0; i < 30; ++i) {
    l.Run(100ms, 250e3, 0.0);
    l.s.unsent = 6u << 20;
    w.Sample(l.s);
  }
  ASSERT_TRUE(w.rate());
  EXPECT_NEAR(*w.rate(), 250e3, 1e3);
  EXPECT_FALSE(w.busy());
  EXPECT_TRUE(w.backlogged());
  EXPECT_TRUE(w.LinkBound());
  // One sample of the window with nothing waiting: the producer may have been
  // behind for a while, so the window is not the link's.
  l.Run(100ms, 250e3, 0.0);
  l.s.unsent = 0;
  w.Sample(l.s);
  EXPECT_FALSE(w.backlogged());
  EXPECT_FALSE(w.LinkBound());
  for (int i = 0; i < 19; ++i) {
    l.Run(100ms, 250e3, 0.0);
    l.s.unsent = 1u << 20;
    w.Sample(l.s);
    EXPECT_FALSE(w.LinkBound()) << i;  // the empty sample is still in the window
  }
  for (int i = 0; i < 2; ++i) {
    l.Run(100ms, 250e3, 0.0);
    w.Sample(l.s);
  }
  EXPECT_TRUE(w.LinkBound());
  // A stream that cannot tell (a pipe) never counts as backlogged.
  l.s.unsent.reset();
  l.Run(100ms, 250e3, 0.0);
  w.Sample(l.s);
  EXPECT_FALSE(w.LinkBound());
}

TEST(LinkWatch, WindowsStartAfreshEachRoundAndWithANewSender) {
  LinkWatch w;
  Link l;
  w.RoundStarted(l.s);
  for (int i = 0; i < 30; ++i) {
    l.Run(100ms, 25e6);
    w.Sample(l.s);
  }
  l.Run(5000ms, 0, 0);  // the destination confirming the round: nothing sent
  w.RoundStarted(l.s);
  EXPECT_FALSE(w.rate());
  l.Run(100ms, 25e6);
  w.Sample(l.s);
  EXPECT_FALSE(w.rate());
  Link fresh;  // a resumed connection's sender counts from zero again
  fresh.s.at = l.s.at + 100ms;
  w.Sample(fresh.s);
  EXPECT_FALSE(w.rate());
  for (int i = 0; i < 20; ++i) {
    fresh.Run(100ms, 25e6);
    w.Sample(fresh.s);
  }
  ASSERT_TRUE(w.rate());
  EXPECT_NEAR(*w.rate(), 25e6, 1e3);
  EXPECT_NEAR(w.peak(), 25e6, 1e3);
}

}  // namespace
}  // namespace gpumigrate
