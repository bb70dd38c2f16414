// Resumable pre-copy (issue 16): a connection that breaks before the switchover
// is replaced by a new one of the same session, and pre-copy goes on from what
// the destination had applied, not from zero. Two in-process sides over pipes;
// each "connection" is a fresh set of pipes handed to both sides by the
// reconnect/reaccept callbacks, as the TCP transport does between processes.
#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/session/session.h"
#include "tests/support/fake_device.h"
#include "transport/net/fault_stream.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate {
namespace {

using testing::FakeDevice;
using namespace std::chrono_literals;

constexpr uint64_t kPages = 256;
constexpr uint64_t kPage = 4096;

std::vector<RegionInfo> Layout() { return {RegionInfo{0, "a", kPages * kPage, kPage, RegionHint::kDynamic}}; }

// One connection: the source's ends wrapped in FaultStreams.
struct Link {
  std::vector<std::unique_ptr<Stream>> owned;
  SessionStreams src, dst;
  FaultStream* control = nullptr;
  std::vector<FaultStream*> data;
  uint64_t BytesWritten() const {
    uint64_t n = 0;
    for (auto* d : data) n += d->bytes_written();
    return n;
  }
};

class Connections {
 public:
  explicit Connections(uint32_t streams) : streams_(streams) {}

  // The first connection: `plan` applies to data stream 0.
  Link& First(FaultPlan data0 = {}) {
    std::lock_guard lk(mu_);
    return Make(data0);
  }
  Reconnect SourceSide() {
    return [this](std::chrono::nanoseconds) -> Result<Reconnected> {
      std::lock_guard lk(mu_);
      ++attempts_;
      if (!reachable_) return Unavailable("test: the receiver cannot be reached");
      Link& l = Make({});
      pending_.push_back(&l);
      cv_.notify_all();
      return Reconnected{l.src, std::nullopt};
    };
  }
  Reconnect DestinationSide() {
    return [this](std::chrono::nanoseconds window) -> Result<Reconnected> {
      std::unique_lock lk(mu_);
      if (!cv_.wait_for(lk, window, [&] { return !pending_.empty(); })) {
        return Status(StatusCode::kDeadlineExceeded, "test: no resumption arrived");
      }
      Link* l = pending_.front();
      pending_.pop_front();
      return Reconnected{l->dst, std::nullopt};
    };
  }
  Link& link(size_t i) { return *links_.at(i); }
  size_t count() {
    std::lock_guard lk(mu_);
    return links_.size();
  }
  void set_reachable(bool r) {
    std::lock_guard lk(mu_);
    reachable_ = r;
  }
  int attempts() {
    std::lock_guard lk(mu_);
    return attempts_;
  }

 private:
  Link& Make(FaultPlan data0) {
    auto l = std::make_unique<Link>();
    for (int i = -1; i < static_cast<int>(streams_); ++i) {
      // Small pipes: what is in flight when a connection breaks stays small, as on a socket.
      auto [a, b] = MakePipe(i < 0 ? std::string("control") : fmt::format("data{}", i), 16 << 10);
      auto fs = std::make_unique<FaultStream>(std::move(a), i == 0 ? data0 : FaultPlan{});
      if (i < 0) {
        l->control = fs.get();
        l->src.control = fs.get();
        l->dst.control = b.get();
      } else {
        l->data.push_back(fs.get());
        l->src.data.push_back(fs.get());
        l->dst.data.push_back(b.get());
      }
      l->owned.push_back(std::move(fs));
      l->owned.push_back(std::move(b));
    }
    links_.push_back(std::move(l));
    return *links_.back();
  }

  const uint32_t streams_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Link>> links_;
  std::deque<Link*> pending_;
  bool reachable_ = true;
  int attempts_ = 0;
};

struct Fakes {
  FakeDevice src{Layout(), DeviceState::kRunning};
  FakeDevice dst{Layout(), DeviceState::kStop};
  SourceOptions so;
  DestinationOptions dopt;
  Fakes() {
    for (uint64_t p = 0; p < kPages; ++p) src.Touch(0, p, static_cast<uint8_t>(p % 250 + 1));
    dst.write_delay = 1ms;  // round 0 takes about a quarter of a second: a break lands inside it
    so.max_frame_payload_bytes = kPage;  // a frame per page
    so.scrub = false;                    // the source's memory is compared below
    so.downtime_target = 1ms;
    so.switchover_fixed_cost = 0ms;
    so.switch_when_not_converging = true;
    so.max_rounds = 4;
    for (auto* o : {&so.keepalive_interval, &dopt.keepalive_interval}) *o = 50ms;
    for (auto* o : {&so.peer_silence_timeout, &dopt.peer_silence_timeout}) *o = 2s;
    so.resume_window = dopt.resume_window = 5s;
  }
};

struct Outcomes {
  MigrationReport source, destination;
};

Outcomes Migrate(Fakes& f, Link& first) {
  Outcomes r;
  std::thread d([&] { r.destination = RunDestination(f.dst, first.dst, f.dopt); });
  r.source = RunSource(f.src, first.src, f.so);
  d.join();
  return r;
}

uint64_t BaselineBytes() {
  Fakes f;
  Connections c(2);
  Link& l = c.First();
  auto r = Migrate(f, l);
  EXPECT_EQ(r.source.outcome, Outcome::kCompleted) << r.source.status.ToString();
  return r.source.bytes_sent;
}

TEST(Resume, ABreakInRoundZeroCarriesOnAndSendsLessThanARestart) {
  const uint64_t baseline = BaselineBytes();
  Fakes f;
  Connections c(2);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  // Data stream 0 breaks about halfway through its share of round 0.
  Link& first = c.First(FaultPlan{.cut_at_byte = kPages / 4 * kPage});
  auto r = Migrate(f, first);
  ASSERT_EQ(r.source.outcome, Outcome::kCompleted) << r.source.status.ToString();
  ASSERT_EQ(r.destination.outcome, Outcome::kCompleted) << r.destination.status.ToString();
  EXPECT_TRUE(r.source.verified);
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0)) << "byte for byte";
  ASSERT_EQ(r.source.resumptions.size(), 1u);
  ASSERT_EQ(r.destination.resumptions.size(), 1u);
  const auto& x = r.source.resumptions[0];
  EXPECT_EQ(x.round, 0u);
  EXPECT_GT(x.saved_bytes, kPages / 8 * kPage) << "the pages the destination had applied are kept";
  // Round 0 had queued every page (the sender's queues hold more than this
  // device) when the stream broke: each page is either kept or sent again.
  EXPECT_EQ(x.saved_bytes + x.resent_bytes, kPages * kPage);
  // A restart would send a whole migration after the break; the resumption
  // sends only what the destination had not applied, and the rounds after.
  const uint64_t after_break = c.link(1).BytesWritten();
  EXPECT_LT(after_break, baseline) << "after the break: " << after_break << " bytes; a whole migration: " << baseline;
  EXPECT_LT(after_break, baseline - x.saved_bytes / 2);
  EXPECT_EQ(c.count(), 2u);
}

// The same break with destination workers (issue 38 step 4): frames over the
// inline limit are applied by workers, out of their stream's order; the
// counts a resumption reports must still be each stream's first frames, all
// of them applied, so what the source keeps is really there.
TEST(Resume, ABreakWithDestinationWorkersKeepsOnlyWhatTheyApplied) {
  Fakes f;
  Connections c(2);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  f.dopt.workers = 2;
  f.so.max_frame_payload_bytes = 32 * kPage;  // 128 KiB frames: the workers'
  Link& first = c.First(FaultPlan{.cut_at_byte = kPages / 4 * kPage + 4096});
  auto r = Migrate(f, first);
  ASSERT_EQ(r.source.outcome, Outcome::kCompleted) << r.source.status.ToString();
  ASSERT_EQ(r.destination.outcome, Outcome::kCompleted) << r.destination.status.ToString();
  EXPECT_TRUE(r.source.verified);
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0)) << "byte for byte";
  ASSERT_TRUE(r.destination.destination_workers.has_value());
  EXPECT_EQ(*r.destination.destination_workers, 2u);
  ASSERT_EQ(r.source.resumptions.size(), 1u);
  const auto& x = r.source.resumptions[0];
  EXPECT_EQ(x.round, 0u);
  EXPECT_GT(x.saved_bytes, 0u) << "frames applied before the break are kept";
  // Pages not yet queued at the break went on as usual: neither kept nor resent.
  EXPECT_LE(x.saved_bytes + x.resent_bytes, kPages * kPage);
}

// A frame of the broken link that a destination worker applies only after
// the break, and that fails on the device, ends the migration there: a device
// error is never resumed, though its report came after the link's.
TEST(Resume, ADeviceFailureWhileTheBrokenLinksFramesAreAppliedIsNotResumed) {
  Fakes f;
  Connections c(2);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  f.so.resume_window = f.dopt.resume_window = 2s;
  f.dopt.workers = 2;
  f.so.max_frame_payload_bytes = 32 * kPage;  // 128 KiB frames: the workers'
  // Each page 60 ms: a worker holds a frame for about 1.9 s, past the second
  // the destination gives a broken link to say Abort before it resumes.
  f.dst.write_delay = 60ms;
  f.dopt.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kReconnecting) f.dst.fail_writes = true;  // the frames still held now fail
  };
  // Stream 0 carries frame 0 whole, then breaks on its next frame: its thread
  // sees the end at once (it is not waiting for a buffer) while a worker still
  // writes frame 0's pages.
  Link& first = c.First(FaultPlan{.cut_at_byte = 140 << 10});
  auto r = Migrate(f, first);
  EXPECT_EQ(r.destination.outcome, Outcome::kAborted) << r.destination.status.ToString();
  EXPECT_NE(r.destination.status.message().find("applying a frame received before the link broke"),
            std::string::npos)
      << r.destination.status.message();
  EXPECT_NE(r.destination.status.message().find("out of device memory"), std::string::npos)
      << r.destination.status.message();
  EXPECT_TRUE(r.destination.resumptions.empty()) << r.destination.resumptions.size();
  EXPECT_NE(r.source.outcome, Outcome::kCompleted);
  EXPECT_EQ(f.src.State(), DeviceState::kRunning) << "the source keeps running";
}

// Content-addressed pre-copy across a break: the destination's content store
// holds the first half of the pages; data stream 0 breaks in round 0 while
// pages are offered by digest. The answers of the broken connection may be
// lost with it, so its digest runs go again: the VM still arrives byte for byte.
TEST(Resume, ABreakWhilePagesAreOfferedByDigestCarriesOnWhole) {
  Fakes f;
  const std::string store = ::testing::TempDir() + "gm-resume-store-" + std::to_string(::getpid());
  std::filesystem::remove_all(store);
  std::filesystem::create_directories(store);
  {
    std::ofstream out(store + "/half.raw", std::ios::binary);
    out.write(reinterpret_cast<const char*>(f.src.memory(0).data()), kPages / 2 * kPage);
  }
  Connections c(2);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  f.dopt.content_store_dir = store;
  Link& first = c.First(FaultPlan{.cut_at_byte = kPages / 8 * kPage});
  auto r = Migrate(f, first);
  std::filesystem::remove_all(store);
  ASSERT_EQ(r.source.outcome, Outcome::kCompleted) << r.source.status.ToString();
  ASSERT_EQ(r.destination.outcome, Outcome::kCompleted) << r.destination.status.ToString();
  EXPECT_TRUE(r.source.verified);
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0)) << "byte for byte";
  ASSERT_EQ(r.source.resumptions.size(), 1u);
  EXPECT_GT(r.source.offered_pages, 0u);
  EXPECT_GT(r.destination.dedup_pages, 0u) << "the store filled pages";
}

TEST(Resume, ABreakInADirtyRoundCarriesOnWithWhatWasDirtied) {
  Fakes f;
  Connections c(2);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  f.src.on_sync = [&](int k) {
    if (k < 3) {
      for (uint64_t p = 0; p < 16; ++p) f.src.Touch(0, p * 7, static_cast<uint8_t>(200 + k));
    }
  };
  Link& first = c.First();
  bool cut = false;
  f.so.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundStart && round == 1 && !cut) {
      cut = true;
      first.control->Cut();
    }
  };
  auto r = Migrate(f, first);
  ASSERT_TRUE(cut);
  ASSERT_EQ(r.source.outcome, Outcome::kCompleted) << r.source.status.ToString();
  ASSERT_EQ(r.destination.outcome, Outcome::kCompleted) << r.destination.status.ToString();
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0)) << "byte for byte";
  ASSERT_EQ(r.source.resumptions.size(), 1u);
  EXPECT_EQ(r.source.resumptions[0].round, 1u);
  EXPECT_GE(r.source.resumptions[0].saved_bytes, kPages * kPage) << "round 0 was confirmed whole";
  // Round 1 was lost, so the rounds go on from 2.
  bool saw_round1 = false;
  for (const auto& rr : r.source.rounds) saw_round1 |= !rr.final && rr.round == 1;
  EXPECT_FALSE(saw_round1);
}

TEST(Resume, AReceiverThatCannotBeReachedRollsBackWithTheSourceIntact) {
  Fakes f;
  Connections c(1);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  f.dopt.resume_window = 1s;
  c.set_reachable(false);
  Link& first = c.First(FaultPlan{.cut_at_byte = kPages / 4 * kPage});
  const auto before = f.src.memory(0);
  auto r = Migrate(f, first);
  EXPECT_EQ(r.source.outcome, Outcome::kAborted);
  EXPECT_NE(r.source.status.message().find("resuming over a new connection failed"), std::string::npos)
      << r.source.status.message();
  EXPECT_NE(r.source.status.message().find("cannot be reached"), std::string::npos) << r.source.status.message();
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
  EXPECT_EQ(f.src.memory(0), before);
  EXPECT_EQ(r.destination.outcome, Outcome::kAborted);
  EXPECT_NE(r.destination.status.message().find("did not resume"), std::string::npos)
      << r.destination.status.message();
  EXPECT_EQ(f.dst.State(), DeviceState::kError) << "the destination discards after its window";
  EXPECT_EQ(c.attempts(), 1);
}

// An Abort is a decision, not a fault: neither side tries to resume it.
TEST(Resume, AnAbortIsNotResumed) {
  Fakes f;
  Connections c(1);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  f.dst.fail_writes = true;  // the destination aborts in round 0
  Link& first = c.First();
  auto r = Migrate(f, first);
  EXPECT_EQ(r.source.outcome, Outcome::kAborted);
  EXPECT_NE(r.source.status.message().find("out of device memory"), std::string::npos) << r.source.status.message();
  EXPECT_TRUE(r.source.resumptions.empty());
  EXPECT_EQ(c.attempts(), 0);
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
}

// Without the capability on both sides a broken connection ends the migration,
// as before resumption existed.
TEST(Resume, APeerThatCannotResumeRollsBackAtOnce) {
  Fakes f;
  Connections c(1);
  f.so.reconnect = c.SourceSide();  // the destination has no reaccept: it does not list `resume`
  Link& first = c.First(FaultPlan{.cut_at_byte = kPages / 4 * kPage});
  auto r = Migrate(f, first);
  EXPECT_EQ(r.source.outcome, Outcome::kAborted);
  EXPECT_EQ(c.attempts(), 0);
  EXPECT_EQ(r.destination.outcome, Outcome::kAborted);
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
}

// After STOP_COPY nothing resumes: rolled back before Prepared.
TEST(Resume, ABreakDuringTheSwitchoverIsNotResumed) {
  Fakes f;
  Connections c(1);
  f.so.reconnect = c.SourceSide();
  f.dopt.reaccept = c.DestinationSide();
  f.dopt.resume_window = 1s;
  Link& first = c.First();
  f.so.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kSwitchover) first.control->Cut();
  };
  const auto before = f.src.memory(0);
  auto r = Migrate(f, first);
  EXPECT_EQ(r.source.outcome, Outcome::kAborted) << r.source.status.ToString();
  EXPECT_TRUE(r.source.resumptions.empty());
  EXPECT_EQ(c.attempts(), 0);
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
  EXPECT_EQ(f.src.memory(0), before);
  EXPECT_NE(r.destination.outcome, Outcome::kCompleted);
}

// What a resumption keeps depends on which rounds the destination confirmed: a
// RoundApplied of another round (a duplicate, a confused peer) must not pass for
// the one awaited.
TEST(Resume, AConfirmationOfAnotherRoundIsRefused) {
  Fakes f;
  auto [src_ctl, dst_ctl] = MakePipe("control", 1 << 20);
  auto [src_data, dst_data] = MakePipe("data0", 4 << 20);
  SessionStreams s;
  s.control = src_ctl.get();
  s.data.push_back(src_data.get());
  std::thread peer([&, &dst_ctl = dst_ctl] {
    namespace v1 = wire::v1;
    auto hello = wire::RecvEnvelope(*dst_ctl);
    ASSERT_TRUE(hello.ok());
    ASSERT_TRUE(wire::SendEnvelope(*dst_ctl, wire::MakeHello("test-peer", {})).ok());
    auto manifest = wire::RecvEnvelope(*dst_ctl);
    ASSERT_TRUE(manifest.ok() && manifest->has_manifest());
    v1::Envelope ready;
    ready.mutable_ready();
    ASSERT_TRUE(wire::SendEnvelope(*dst_ctl, ready).ok());
    auto end = wire::RecvEnvelope(*dst_ctl);
    ASSERT_TRUE(end.ok() && end->has_round_end()) << end.status().ToString();
    v1::Envelope applied;
    applied.mutable_round_applied()->set_round(end->round_end().round() + 5);
    ASSERT_TRUE(wire::SendEnvelope(*dst_ctl, applied).ok());
    while (wire::RecvEnvelope(*dst_ctl).ok()) {
    }
  });
  auto r = RunSource(f.src, s, f.so);
  dst_ctl->Close();
  peer.join();
  EXPECT_EQ(r.outcome, Outcome::kAborted);
  EXPECT_NE(r.status.message().find("RoundApplied for round 5 while round 0 was awaited"), std::string::npos)
      << r.status.message();
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
}

}  // namespace
}  // namespace gpumigrate
