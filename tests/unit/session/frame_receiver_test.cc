// FrameReceiver over in-memory pipes, fed by a FrameSender: every frame applied
// once with its bytes, counted on its stream; with workers, large frames opened
// and applied by the workers within a fixed pool of buffers (backpressure when
// it is full), device state and small frames in order on their stream's thread,
// a failure named by stream and frame, and every frame received whole applied
// before Join returns. Every wait is bounded.
#include "engine/session/frame_receiver.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "engine/session/frame_sender.h"
#include "gpumigrate/common/clock.h"
#include "gpumigrate/session/session.h"

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kRxPage = 4096;
constexpr uint32_t kRxLarge = 256 << 10;  // over FrameReceiver::kInlineBytes: a worker's
constexpr uint32_t kRxSmall = 2 * kRxPage;  // a stream thread's

FrameKeys RxKeys() {
  FrameKeys keys;
  keys.aes_gcm = true;
  for (size_t i = 0; i < keys.aes_key.size(); ++i) keys.aes_key[i] = static_cast<std::byte>(i * 7);
  return keys;
}

std::vector<std::byte> RxBytes(size_t n, uint64_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 17) & 0xff);
  return v;
}

template <typename F>
bool RxEventually(F cond, std::chrono::milliseconds limit = 10000ms) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// What the receiver applied: page frames by offset, device state in order,
// the threads that applied large and small frames. Optionally held at a gate.
class RxApplied {
 public:
  Status Apply(const wire::FrameHeader& h, std::span<const std::byte> raw) {
    std::unique_lock lk(mu_);
    ++started_;
    cv_.wait(lk, [&] { return open_; });
    if (h.type == wire::FrameType::kDeviceState) {
      state_offsets_.push_back(h.offset);
      return Status::Ok();
    }
    if (fail_offset_ && h.offset == *fail_offset_) return Internal("the device refused the write");
    pages_[h.offset] = std::vector<std::byte>(raw.begin(), raw.end());
    (h.raw_length > FrameReceiver::kInlineBytes ? large_threads_ : small_threads_).insert(std::this_thread::get_id());
    return Status::Ok();
  }
  void Close() {
    std::lock_guard lk(mu_);
    open_ = false;
  }
  void Open() {
    {
      std::lock_guard lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void FailAt(uint64_t offset) { fail_offset_ = offset; }
  size_t started() {
    std::lock_guard lk(mu_);
    return started_;
  }
  std::map<uint64_t, std::vector<std::byte>> pages() {
    std::lock_guard lk(mu_);
    return pages_;
  }
  std::vector<uint64_t> state_offsets() {
    std::lock_guard lk(mu_);
    return state_offsets_;
  }
  std::set<std::thread::id> large_threads() {
    std::lock_guard lk(mu_);
    return large_threads_;
  }
  std::set<std::thread::id> small_threads() {
    std::lock_guard lk(mu_);
    return small_threads_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  size_t started_ = 0;
  std::optional<uint64_t> fail_offset_;
  std::map<uint64_t, std::vector<std::byte>> pages_;
  std::vector<uint64_t> state_offsets_;
  std::set<std::thread::id> large_threads_, small_threads_;
};

// Two data streams from a FrameSender into a FrameReceiver over pipes.
struct RxRig {
  explicit RxRig(uint32_t workers, size_t pipe_bytes = 16 << 20) {
    for (int s = 0; s < 2; ++s) {
      auto [w, r] = MakePipe("d" + std::to_string(s), pipe_bytes);
      writers.push_back(std::move(w));
      readers.push_back(std::move(r));
    }
    regions.push_back({.id = 3, .name = "weights", .size_bytes = 64 << 20, .page_size = kRxPage});
    sender = std::make_unique<FrameSender>(std::vector<Stream*>{writers[0].get(), writers[1].get()}, RxKeys(), 0,
                                           clock);
    receiver = std::make_unique<FrameReceiver>(
        std::vector<Stream*>{readers[0].get(), readers[1].get()}, RxKeys(), 1 << 20, &regions,
        [this](const wire::FrameHeader& h, std::span<const std::byte> raw) { return applied.Apply(h, raw); }, &box,
        workers);
  }
  ~RxRig() { Stop(); }
  // Frame i: pages of `len` bytes at offset i MiB.
  Status SendPages(uint32_t i, uint32_t len) {
    auto payload = RxBytes(len, i);
    sent[uint64_t{i} << 20] = payload;
    return sender->Send(wire::FrameType::kPages, 3, 0, uint64_t{i} << 20, len, payload);
  }
  void Stop() {
    receiver->StopQuietly();
    for (auto& w : writers) w->Close();
    for (auto& r : readers) r->Close();
    applied.Open();
    receiver->Join();
  }

  FakeClock clock;
  Mailbox box{clock};
  std::vector<std::unique_ptr<Stream>> writers, readers;
  std::vector<RegionInfo> regions;
  RxApplied applied;
  std::unique_ptr<FrameSender> sender;
  std::unique_ptr<FrameReceiver> receiver;
  std::map<uint64_t, std::vector<std::byte>> sent;
};

TEST(FrameReceiver, WorkersApplyLargeFramesAndStreamsTheirSmallOnesAndTheDeviceStateInOrder) {
  RxRig rig(/*workers=*/2);
  EXPECT_EQ(rig.receiver->workers(), 2u);
  EXPECT_EQ(rig.receiver->max_in_flight(), 2 * FrameReceiver::kFramesPerWorker);
  rig.receiver->Start();
  rig.sender->PinFirstStream(true);  // device state: the first stream, in order
  for (uint32_t k = 0; k < 6; ++k) {
    auto piece = RxBytes(kRxLarge, 100 + k);  // large, yet never a worker's
    ASSERT_TRUE(rig.sender->Send(wire::FrameType::kDeviceState, wire::kDeviceStateRegion, 0, uint64_t{k} * kRxLarge,
                                 kRxLarge, piece).ok());
  }
  rig.sender->PinFirstStream(false);
  for (uint32_t i = 0; i < 40; ++i) ASSERT_TRUE(rig.SendPages(i, i % 3 == 0 ? kRxSmall : kRxLarge).ok());
  ASSERT_TRUE(rig.sender->Flush().ok());
  auto counts = rig.sender->frames_per_stream();
  ASSERT_TRUE(RxEventually([&] {
    return rig.receiver->frames(0) == counts[0] && rig.receiver->frames(1) == counts[1];
  })) << rig.receiver->frames(0) << "/" << counts[0] << " " << rig.receiver->frames(1) << "/" << counts[1] << " "
      << rig.box.failure().ToString();
  EXPECT_TRUE(rig.box.failure().ok()) << rig.box.failure().ToString();
  EXPECT_EQ(rig.applied.pages(), rig.sent);  // every frame once, opened and whole
  std::vector<uint64_t> want_state;
  for (uint64_t k = 0; k < 6; ++k) want_state.push_back(k * kRxLarge);
  EXPECT_EQ(rig.applied.state_offsets(), want_state);
  // Large frames ran on the two workers, small ones on the two streams' threads.
  auto large = rig.applied.large_threads(), small = rig.applied.small_threads();
  EXPECT_LE(large.size(), 2u);
  EXPECT_LE(small.size(), 2u);
  for (auto t : large) EXPECT_EQ(small.count(t), 0u) << "a worker applied a small frame, or a stream a large one";
  EXPECT_LE(rig.receiver->most_in_flight(), rig.receiver->max_in_flight());
  uint64_t wire_bytes = 0;
  for (auto b : rig.sender->bytes_per_stream()) wire_bytes += b;
  EXPECT_EQ(rig.receiver->bytes_received(), wire_bytes);
}

TEST(FrameReceiver, WithoutWorkersEachStreamAppliesItsOwnFrames) {
  RxRig rig(/*workers=*/0);
  EXPECT_EQ(rig.receiver->max_in_flight(), 0u);
  rig.receiver->Start();
  for (uint32_t i = 0; i < 12; ++i) ASSERT_TRUE(rig.SendPages(i, i % 4 < 2 ? kRxLarge : kRxSmall).ok());
  ASSERT_TRUE(rig.sender->Flush().ok());
  ASSERT_TRUE(RxEventually([&] { return rig.receiver->frames_total() == 12; })) << rig.box.failure().ToString();
  EXPECT_EQ(rig.applied.pages(), rig.sent);
  // Frames alternate streams, two large then two small: each stream's thread
  // applied both its large and its small ones.
  EXPECT_EQ(rig.applied.large_threads(), rig.applied.small_threads());
}

TEST(FrameReceiver, AFullPoolHoldsTheStreamsBackUntilAWorkerFrees) {
  // Small pipes: what the receiver does not take stays with the sender.
  RxRig rig(/*workers=*/1, /*pipe_bytes=*/kRxLarge + 4096);
  rig.applied.Close();
  rig.receiver->Start();
  std::thread sending([&] {
    for (uint32_t i = 0; i < 16; ++i) EXPECT_TRUE(rig.SendPages(i, kRxLarge).ok());
    EXPECT_TRUE(rig.sender->Flush().ok());
  });
  // The one worker holds a frame at the gate; the pool's other buffer is full
  // and both streams wait for room: nothing more is read.
  ASSERT_TRUE(RxEventually([&] { return rig.receiver->most_in_flight() == rig.receiver->max_in_flight(); }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(rig.applied.started(), 1u);
  EXPECT_EQ(rig.receiver->frames_total(), 0u);
  EXPECT_LT(rig.receiver->bytes_received(), 6ull * kRxLarge) << "the receiver read on past its pool";
  rig.applied.Open();
  sending.join();
  ASSERT_TRUE(RxEventually([&] { return rig.receiver->frames_total() == 16; })) << rig.box.failure().ToString();
  EXPECT_EQ(rig.applied.pages(), rig.sent);
  EXPECT_EQ(rig.receiver->most_in_flight(), 2u);
}

TEST(FrameReceiver, AWorkersFailureNamesItsStreamAndFrame) {
  RxRig rig(/*workers=*/2);
  rig.applied.FailAt(uint64_t{5} << 20);  // frame 5: stream 1's third frame (round-robin)
  rig.receiver->Start();
  for (uint32_t i = 0; i < 8; ++i) ASSERT_TRUE(rig.SendPages(i, kRxLarge).ok());
  ASSERT_TRUE(rig.sender->Flush().ok());
  ASSERT_TRUE(RxEventually([&] { return !rig.box.failure().ok(); }));
  const std::string why = rig.box.failure().ToString();
  EXPECT_NE(why.find("data stream 1, frame 2"), std::string::npos) << why;
  EXPECT_NE(why.find("the device refused the write"), std::string::npos) << why;
  // Stream 1's frames after the failed one are applied, but its count stops
  // before it: a count means "these first frames are on the device".
  ASSERT_TRUE(RxEventually([&] { return rig.applied.pages().size() == 7; }));
  ASSERT_TRUE(RxEventually([&] { return rig.receiver->frames(0) == 4 && rig.receiver->frames(1) == 2; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(rig.receiver->frames(1), 2u) << "frames 0 and 1 of stream 1; frame 2 failed";
}

TEST(FrameReceiver, AFrameAWorkerFinishesEarlyIsCountedOnlyAfterThoseBeforeIt) {
  RxRig rig(/*workers=*/2);
  rig.applied.FailAt(0);  // stream 0's frame 0 fails; its frames 1-3 are applied after it or beside it
  rig.receiver->Start();
  for (uint32_t i = 0; i < 8; ++i) ASSERT_TRUE(rig.SendPages(i, kRxLarge).ok());
  ASSERT_TRUE(rig.sender->Flush().ok());
  ASSERT_TRUE(RxEventually([&] { return rig.applied.pages().size() == 7 && rig.receiver->frames(1) == 4; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(rig.receiver->frames(0), 0u) << "frame 0 never arrived on the device: nothing after it counts";
  EXPECT_NE(rig.box.failure().ToString().find("data stream 0, frame 0"), std::string::npos)
      << rig.box.failure().ToString();
}

TEST(FrameReceiver, JoinAppliesEveryFrameReceivedWholeBeforeItReturns) {
  RxRig rig(/*workers=*/2);
  rig.applied.Close();
  rig.receiver->Start();
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(rig.SendPages(i, kRxLarge).ok());
  ASSERT_TRUE(rig.sender->Flush().ok());
  ASSERT_TRUE(RxEventually([&] { return rig.receiver->bytes_received() == rig.sender->bytes_sent(); }));
  // The link breaks while the workers hold all four: a resumption tells the
  // source how many frames of each stream were applied, so they must all be.
  rig.receiver->StopQuietly();
  for (auto& w : rig.writers) w->Close();
  std::thread opener([&] {
    std::this_thread::sleep_for(50ms);
    rig.applied.Open();
  });
  rig.receiver->Join();
  opener.join();
  EXPECT_EQ(rig.receiver->frames(0), 2u);
  EXPECT_EQ(rig.receiver->frames(1), 2u);
  EXPECT_EQ(rig.applied.pages(), rig.sent);
}

TEST(FrameReceiver, DefaultWorkersAreTheCoresTheStreamsLeave) {
  EXPECT_EQ(DefaultDestinationWorkers(2, 2), 0u);
  EXPECT_EQ(DefaultDestinationWorkers(1, 4), 0u);
  EXPECT_EQ(DefaultDestinationWorkers(2, 1), 1u);
  EXPECT_EQ(DefaultDestinationWorkers(16, 4), 8u);
  EXPECT_EQ(DefaultDestinationWorkers(8, 4), 4u);
  EXPECT_EQ(DefaultDestinationWorkers(0, 0), 0u);
}

}  // namespace
}  // namespace gpumigrate
