// FrameSender over in-memory streams: numbering, headers, tags, counters,
// backpressure, the first write error and Flush. Every wait is bounded.
#include "engine/session/frame_sender.h"

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "gpumigrate/common/clock.h"

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kKey = 0x0123456789abcdefULL;

FrameKeys IntegrityKeys() {
  FrameKeys k;
  k.integrity_key = kKey;
  return k;
}

// AES-256-GCM frames under a key of bytes 0, 1, 2, ...
FrameKeys AesKeys() {
  FrameKeys keys;
  keys.aes_gcm = true;
  for (size_t i = 0; i < keys.aes_key.size(); ++i) keys.aes_key[i] = static_cast<std::byte>(i);
  return keys;
}

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return v;
}

// Polls `cond` for up to `limit` of real time.
template <typename F>
bool Eventually(F cond, std::chrono::milliseconds limit = 5000ms) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

struct ReadFrame {
  wire::FrameHeader header;
  wire::HeaderBytes header_bytes;
  std::vector<std::byte> payload;
  wire::Tag tag;
};

ReadFrame ReadOne(Stream& s) {
  ReadFrame f;
  EXPECT_TRUE(s.ReadExact(f.header_bytes).ok());
  auto h = wire::DecodeHeader(f.header_bytes);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  if (!h.ok()) return f;
  f.header = *h;
  f.payload.resize(f.header.payload_length);
  EXPECT_TRUE(s.ReadExact(f.payload).ok());
  EXPECT_TRUE(s.ReadExact(f.tag).ok());
  return f;
}

// A stream whose writes wait until the test opens the gate; counts what was written.
class GateStream final : public Stream {
 public:
  std::string Name() const override { return "gate"; }
  Status WriteAll(std::span<const std::byte> data) override {
    std::unique_lock lk(mu_);
    ++writes_started_;
    cv_.notify_all();
    cv_.wait(lk, [&] { return open_ || closed_; });
    if (closed_) return Unavailable("gate: write failed: stream closed");
    bytes_ += data.size();
    ++writes_done_;
    return Status::Ok();
  }
  Status ReadExact(std::span<std::byte>) override { return Unavailable("gate: not readable"); }
  void Close() override {
    std::lock_guard lk(mu_);
    closed_ = true;
    cv_.notify_all();
  }
  void Open() {
    std::lock_guard lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  int writes_started() {
    std::lock_guard lk(mu_);
    return writes_started_;
  }
  int writes_done() {
    std::lock_guard lk(mu_);
    return writes_done_;
  }
  uint64_t bytes() {
    std::lock_guard lk(mu_);
    return bytes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false, closed_ = false;
  int writes_started_ = 0, writes_done_ = 0;
  uint64_t bytes_ = 0;
};

// A stream that accepts writes until its `fail_at`-th (0-based), which fails.
class FailingStream final : public Stream {
 public:
  explicit FailingStream(int fail_at) : fail_at_(fail_at) {}
  std::string Name() const override { return "failing"; }
  Status WriteAll(std::span<const std::byte>) override {
    if (writes_++ == fail_at_) return Unavailable("failing: write failed: connection reset");
    return Status::Ok();
  }
  Status ReadExact(std::span<std::byte>) override { return Unavailable("failing: not readable"); }
  void Close() override {}

 private:
  const int fail_at_;
  std::atomic<int> writes_{0};
};

TEST(FrameSender, NumbersFramesPerStreamRoundRobinWithDecodableHeadersAndValidTags) {
  auto [w0, r0] = MakePipe("d0");
  auto [w1, r1] = MakePipe("d1");
  FakeClock clock;
  FrameSender sender({w0.get(), w1.get()}, IntegrityKeys(), 0, clock);
  std::vector<std::vector<std::byte>> payloads;
  for (int i = 0; i < 5; ++i) payloads.push_back(Bytes(100 + 10 * i, static_cast<uint8_t>(i)));
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(sender
                    .Send(wire::FrameType::kPages, /*region=*/7, /*round=*/2, /*offset=*/4096u * i,
                          /*raw_length=*/4096, payloads[i], /*codec_flags=*/static_cast<uint8_t>(i))
                    .ok());
  }
  ASSERT_TRUE(sender.Flush().ok());

  // Frame i went to stream i % 2 as that stream's (i / 2)-th frame.
  auto protector = MakeFrameProtector(IntegrityKeys());
  Stream* readers[2] = {r0.get(), r1.get()};
  uint64_t expect_bytes[2] = {0, 0};
  for (int i = 0; i < 5; ++i) {
    ReadFrame f = ReadOne(*readers[i % 2]);
    EXPECT_EQ(f.header.type, wire::FrameType::kPages);
    EXPECT_EQ(f.header.codec_flags, i);
    EXPECT_EQ(f.header.stream_id, static_cast<uint32_t>(i % 2));
    EXPECT_EQ(f.header.sequence, static_cast<uint64_t>(i / 2));
    EXPECT_EQ(f.header.region, 7u);
    EXPECT_EQ(f.header.round, 2u);
    EXPECT_EQ(f.header.offset, 4096u * i);
    EXPECT_EQ(f.header.raw_length, 4096u);
    EXPECT_EQ(f.header.payload_length, payloads[i].size());
    EXPECT_EQ(f.payload, payloads[i]);  // integrity only: the payload is in the clear
    EXPECT_EQ(f.tag, wire::ComputeTag(kKey, f.header_bytes, payloads[i]));
    EXPECT_TRUE(protector->Open(f.header_bytes, f.header.stream_id, f.header.sequence, f.payload, f.tag).ok());
    // The tag covers the payload: a flipped byte no longer verifies.
    f.payload[0] ^= std::byte{1};
    EXPECT_FALSE(protector->Open(f.header_bytes, f.header.stream_id, f.header.sequence, f.payload, f.tag).ok());
    expect_bytes[i % 2] += wire::kFrameHeaderBytes + payloads[i].size() + wire::kFrameTagBytes;
  }
  EXPECT_EQ(sender.frames_per_stream(), (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(sender.bytes_per_stream(), (std::vector<uint64_t>{expect_bytes[0], expect_bytes[1]}));
  EXPECT_EQ(sender.bytes_sent(), expect_bytes[0] + expect_bytes[1]);
}

TEST(FrameSender, AesGcmFramesOpenWithTheSameKeyOnly) {
  auto [w, r] = MakePipe("d0");
  FakeClock clock;
  const FrameKeys keys = AesKeys();
  FrameSender sender({w.get()}, keys, 0, clock);
  auto payload = Bytes(300, 9);
  ASSERT_TRUE(sender.Send(wire::FrameType::kDeviceState, wire::kDeviceStateRegion, 0, 0, 300, payload).ok());
  ASSERT_TRUE(sender.Flush().ok());
  ReadFrame f = ReadOne(*r);
  EXPECT_EQ(f.header.type, wire::FrameType::kDeviceState);
  EXPECT_NE(f.payload, payload) << "AES-GCM encrypts the payload";
  auto good = f.payload;
  ASSERT_TRUE(MakeFrameProtector(keys)->Open(f.header_bytes, 0, 0, good, f.tag).ok());
  EXPECT_EQ(good, payload);
  FrameKeys other = keys;
  other.aes_key[0] = std::byte{0xff};
  auto bad = f.payload;
  EXPECT_FALSE(MakeFrameProtector(other)->Open(f.header_bytes, 0, 0, bad, f.tag).ok());
}

// Written frames' buffers are reused: a small frame after a large one, and a
// large one after small ones, still carry exactly their own bytes and tags.
TEST(FrameSender, ReusedBuffersCarryOnlyTheirOwnFrame) {
  auto [w, r] = MakePipe("d0", 8 << 20);
  FakeClock clock;
  const FrameKeys keys = AesKeys();
  FrameSender sender({w.get()}, keys, 0, clock);
  const std::vector<size_t> sizes = {1 << 20, 7, 1 << 20, 3, 4096, (1 << 20) - 1, 0, 65536};
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto payload = Bytes(sizes[i], static_cast<uint8_t>(i + 1));
    ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, i * 4096, static_cast<uint32_t>(sizes[i]), payload).ok());
    ASSERT_TRUE(sender.Flush().ok());  // written: its buffer goes back for the next frame
    ReadFrame f = ReadOne(*r);
    EXPECT_EQ(f.header.payload_length, sizes[i]);
    EXPECT_EQ(f.header.sequence, i);
    ASSERT_TRUE(MakeFrameProtector(keys)->Open(f.header_bytes, 0, i, f.payload, f.tag).ok()) << i;
    EXPECT_EQ(f.payload, payload) << "frame " << i;
  }
}

// Small frames that queue up while their stream is busy leave in one write
// (a final round of single pages); a large frame leaves alone.
TEST(FrameSender, SmallFramesQueuedTogetherLeaveInOneWrite) {
  GateStream gate;
  FakeClock clock;
  FrameSender sender({&gate}, IntegrityKeys(), 0, clock);
  const auto page = Bytes(4096, 2);
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 4096, page).ok());
  ASSERT_TRUE(Eventually([&] { return gate.writes_started() == 1; }));  // held in its write
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 4096, page).ok());
  const auto big = Bytes(1 << 20, 3);
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 1 << 20, big).ok());
  gate.Open();
  ASSERT_TRUE(sender.Flush().ok());
  const uint64_t small = wire::kFrameHeaderBytes + 4096 + wire::kFrameTagBytes;
  EXPECT_EQ(gate.bytes(), 21 * small + wire::kFrameHeaderBytes + (1 << 20) + wire::kFrameTagBytes);
  EXPECT_EQ(gate.writes_done(), 3) << "the first page, the 20 queued behind it, the megabyte";
}

// What a batched write carries is every frame, in order, each sealed for its sequence.
TEST(FrameSender, BatchedFramesArriveInOrderAndOpen) {
  auto [w, r] = MakePipe("d0", 8 << 20);
  FakeClock clock;
  const FrameKeys keys = AesKeys();
  FrameSender sender({w.get()}, keys, 0, clock);
  std::vector<std::vector<std::byte>> sent;
  for (int i = 0; i < 200; ++i) {
    sent.push_back(Bytes(1 + (i * 331) % 9000, static_cast<uint8_t>(i)));
    ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, static_cast<uint32_t>(sent.back().size()),
                            sent.back()).ok());
  }
  ASSERT_TRUE(sender.Flush().ok());
  for (size_t i = 0; i < sent.size(); ++i) {
    ReadFrame f = ReadOne(*r);
    ASSERT_EQ(f.header.sequence, i);
    ASSERT_TRUE(MakeFrameProtector(keys)->Open(f.header_bytes, 0, i, f.payload, f.tag).ok()) << i;
    ASSERT_EQ(f.payload, sent[i]) << i;
  }
}

TEST(FrameSender, SendBlocksOnceTheLaneBudgetIsQueued) {
  GateStream gate;
  FakeClock clock;
  FrameSender sender({&gate}, IntegrityKeys(), 0, clock);
  // 1 MiB payloads: each frame is 1 MiB + 64 bytes, so three fit in the 4 MiB
  // budget and the fourth does not (4 MiB + 256 > kLaneBudgetBytes).
  static_assert(FrameSender::kLaneBudgetBytes == 4 << 20);
  const auto payload = Bytes(1 << 20, 1);
  std::atomic<int> sent{0};
  std::thread sending([&] {
    for (int i = 0; i < 5; ++i) {
      EXPECT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 1 << 20, payload).ok());
      ++sent;
    }
  });
  // The first frame is stuck in its write and still counts against the budget.
  EXPECT_TRUE(Eventually([&] { return sent.load() >= 3 && gate.writes_started() == 1; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(sent.load(), 3) << "the fourth Send must wait for room in the lane";
  EXPECT_EQ(gate.writes_done(), 0);
  gate.Open();  // whatever happened above, so the sending thread can finish
  sending.join();
  EXPECT_EQ(sent.load(), 5);
  ASSERT_TRUE(sender.Flush().ok());
  EXPECT_EQ(gate.writes_done(), 5);
  EXPECT_EQ(gate.bytes(), 5 * ((1u << 20) + wire::kFrameHeaderBytes + wire::kFrameTagBytes));
  EXPECT_EQ(sender.bytes_sent(), gate.bytes());
}

TEST(FrameSender, FlushWaitsUntilEveryFrameIsWritten) {
  GateStream gate;
  FakeClock clock;
  FrameSender sender({&gate}, IntegrityKeys(), 0, clock);
  const auto payload = Bytes(1000, 2);
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 1000, payload).ok());
  // The lane has taken the frame off its queue and is stuck writing it: an empty
  // queue is not "everything written".
  EXPECT_TRUE(Eventually([&] { return gate.writes_started() == 1; }));
  auto flushed = std::async(std::launch::async, [&] { return sender.Flush(); });
  EXPECT_EQ(flushed.wait_for(50ms), std::future_status::timeout) << "Flush returned with a frame unwritten";
  gate.Open();
  ASSERT_EQ(flushed.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(flushed.get().ok());
  EXPECT_EQ(gate.writes_done(), 1);
  // More frames after a Flush: the next Flush waits for them too.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 1000, payload).ok());
  ASSERT_TRUE(sender.Flush().ok());
  // Every byte of the four frames is written (small frames may share a write).
  EXPECT_EQ(gate.bytes(), 4 * (wire::kFrameHeaderBytes + 1000 + wire::kFrameTagBytes));
}

// A Send or Flush waiting on a stuck stream calls the wait hook (on its own
// thread, repeatedly), and an error from the hook ends the wait: the session
// judges a collapsed link while one frame takes seconds to leave.
TEST(FrameSender, AWaitingSendOrFlushCallsTheWaitHookAndStopsOnItsError) {
  GateStream gate;
  FakeClock clock;
  FrameSender sender({&gate}, IntegrityKeys(), 0, clock);
  std::atomic<int> calls{0};
  std::atomic<bool> give_up{false};
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> other_thread{false};
  sender.SetWaitHook([&]() -> Status {
    if (std::this_thread::get_id() != caller) other_thread = true;
    ++calls;
    return give_up ? Aborted("the link is too slow") : Status::Ok();
  });
  const auto payload = Bytes(1 << 20, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 1 << 20, payload).ok());
  EXPECT_EQ(calls.load(), 0) << "no wait, no call";
  // The fourth does not fit: Send waits, calling the hook every kWaitHookPeriod.
  auto fourth = std::async(std::launch::async, [&] {
    return sender.Send(wire::FrameType::kPages, 0, 0, 0, 1 << 20, payload);
  });
  EXPECT_EQ(fourth.wait_for(350ms), std::future_status::timeout);
  EXPECT_GE(calls.load(), 2);
  give_up = true;
  ASSERT_EQ(fourth.wait_for(5s), std::future_status::ready);
  Status st = fourth.get();
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("the link is too slow"), std::string::npos) << st.ToString();
  EXPECT_TRUE(other_thread.load()) << "the hook runs on the thread that waits (here the async one)";
  // Flush waits on the same stuck stream and ends on the hook's error too.
  Status flushed = sender.Flush();
  EXPECT_EQ(flushed.code(), StatusCode::kAborted) << flushed.ToString();
  give_up = false;
  gate.Open();
  EXPECT_TRUE(sender.Flush().ok());
  EXPECT_EQ(gate.writes_done(), 3) << "the frame whose Send failed was never queued";
}

TEST(FrameSender, TheFirstWriteErrorNamesStreamAndFrameAndSticks) {
  FailingStream ok_stream(/*fail_at=*/-1);
  FailingStream bad_stream(/*fail_at=*/1);  // its second frame, sequence 1
  FakeClock clock;
  FrameSender sender({&ok_stream, &bad_stream}, IntegrityKeys(), 0, clock);
  const auto payload = Bytes(64, 3);
  // One frame a write (small frames queued together would share one).
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 64, payload).ok());
    ASSERT_TRUE(sender.Flush().ok());
  }
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 64, payload).ok());
  Status flushed = sender.Flush();
  EXPECT_EQ(flushed.code(), StatusCode::kUnavailable);
  EXPECT_EQ(flushed.message(), "data stream 1: send frame 1: failing: write failed: connection reset");
  Status later = sender.Send(wire::FrameType::kPages, 0, 0, 0, 64, payload);
  EXPECT_EQ(later.code(), StatusCode::kUnavailable);
  EXPECT_EQ(later.message(), flushed.message());
  EXPECT_EQ(sender.Flush().message(), flushed.message());
}

TEST(FrameSender, RateCapSleepsOnTheClock) {
  auto pipe = MakePipe("d0");  // no structured binding: lambdas capture these (clang 14)
  auto& w = pipe.first;
  auto& r = pipe.second;
  FakeClock clock;
  // 1000 B/s; the burst is the limiter's default (4 MiB), so 4 MiB + 1000 bytes
  // of frames take exactly one fake second.
  FrameSender sender({w.get()}, IntegrityKeys(), 1000, clock);
  const size_t frame_bytes = (4u << 20) + 1000;
  const auto payload = Bytes(frame_bytes - wire::kFrameHeaderBytes - wire::kFrameTagBytes, 4);
  std::thread reader([&] {
    std::vector<std::byte> sink(frame_bytes);
    EXPECT_TRUE(r->ReadExact(sink).ok());
  });
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 0, payload).ok());
  ASSERT_TRUE(sender.Flush().ok());
  reader.join();
  EXPECT_EQ(clock.Now().time_since_epoch(), std::chrono::nanoseconds(1s));
}

TEST(FrameSender, AFollowedRateIsReadBeforeEveryFrame) {
  auto pipe = MakePipe("d0");
  auto& w = pipe.first;
  auto& r = pipe.second;
  FakeClock clock;
  std::atomic<double> rate{0};  // unlimited at first
  FrameSender sender({w.get()}, IntegrityKeys(), 0, clock);
  sender.FollowRate(&rate);
  const size_t frame_bytes = 1 << 20;
  const auto payload = Bytes(frame_bytes - wire::kFrameHeaderBytes - wire::kFrameTagBytes, 5);
  std::thread reader([&] {
    std::vector<std::byte> sink(frame_bytes);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(r->ReadExact(sink).ok());
  });
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 0, payload).ok());
  EXPECT_EQ(clock.Now().time_since_epoch(), 0ns) << "unlimited";
  // Paced from here: the limiter turns on with no credit, so each 1 MiB frame
  // takes 1 MiB / rate; its burst (4 MiB) never comes into play.
  rate.store(1 << 20);
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 0, payload).ok());
  EXPECT_EQ(clock.Now().time_since_epoch(), std::chrono::nanoseconds(1s));
  rate.store(4 << 20);
  ASSERT_TRUE(sender.Send(wire::FrameType::kPages, 0, 0, 0, 0, payload).ok());
  EXPECT_EQ(clock.Now().time_since_epoch(), std::chrono::nanoseconds(1250ms));
  ASSERT_TRUE(sender.Flush().ok());
  reader.join();
}

}  // namespace
}  // namespace gpumigrate
