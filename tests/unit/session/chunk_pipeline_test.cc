// The source's reading workers (engine/session/chunk_pipeline.h): results in
// submission order whatever the worker count, the same parts, hashes and
// encodings the session thread computed itself before, a device that does not
// take concurrent reads read one chunk at a time, read failures kept per chunk,
// and a pipeline cleared mid-way that carries on.
#include "engine/session/chunk_pipeline.h"

#include <atomic>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "gpumigrate/devices/dirty_tracker.h"
#include "transport/wire/frame.h"

namespace gpumigrate::session_detail {
namespace {

constexpr uint64_t kPage = 4096;

// Content is a function of (region, offset), every 5th page zero; counts the
// reads in progress at once; a read touching page `fail_page` fails.
class ScriptedDevice final : public Device {
 public:
  ScriptedDevice(uint64_t pages, bool concurrent) : concurrent_(concurrent) {
    regions_.push_back({0, "a", pages * kPage, static_cast<uint32_t>(kPage), RegionHint::kStatic});
    regions_.push_back({1, "b", pages * kPage, static_cast<uint32_t>(kPage), RegionHint::kDynamic});
  }
  static std::byte ByteAt(uint32_t region, uint64_t off) {
    const uint64_t page = off / kPage;
    if (page % 5 == 3) return std::byte{0};
    return static_cast<std::byte>((page * 31 + region * 7 + (off % 97)) % 251 + 1);
  }
  std::string Describe() const override { return "scripted"; }
  const std::vector<RegionInfo>& Regions() const override { return regions_; }
  DeviceState State() const override { return DeviceState::kRunning; }
  Status SetState(DeviceState) override { return Status::Ok(); }
  bool ConcurrentReads() const override { return concurrent_; }
  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) override {
    const int now = ++reading_;
    int seen = max_reading_.load();
    while (now > seen && !max_reading_.compare_exchange_weak(seen, now)) {
    }
    if (rendezvous.exchange(false)) {
      // The first read waits (at most 2 s) for a second one to start: with two
      // workers or more it does, whatever the scheduler does meanwhile.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      while (max_reading_.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    Status st;
    if (fail_page >= 0 && static_cast<uint64_t>(fail_page) >= offset / kPage &&
        static_cast<uint64_t>(fail_page) < (offset + out.size() + kPage - 1) / kPage) {
      st = Internal("scripted: read failed");
    } else {
      for (size_t i = 0; i < out.size(); ++i) out[i] = ByteAt(region, offset + i);
    }
    --reading_;
    return st;
  }
  Status Write(uint32_t, uint64_t, std::span<const std::byte>) override { return Status::Ok(); }
  Status WriteZeros(uint32_t, uint64_t, uint64_t) override { return Status::Ok(); }
  Result<std::vector<std::byte>> SaveState() override { return std::vector<std::byte>(); }
  Status LoadState(std::span<const std::byte>) override { return Status::Ok(); }
  PendingBytes PendingEstimate() const override { return {0}; }
  DirtyTracker* Tracker() override { return nullptr; }

  int64_t fail_page = -1;
  std::atomic<bool> rendezvous{false};
  std::atomic<int> max_reading_{0};

 private:
  std::vector<RegionInfo> regions_;
  bool concurrent_;
  std::atomic<int> reading_{0};
};

ChunkJob Job(const Device& dev, uint32_t region, uint64_t first, uint64_t pages) {
  ChunkJob j;
  j.region = region;
  j.region_id = region;
  j.first_page = first;
  j.pages = pages;
  j.offset = first * kPage;
  j.length = pages * kPage;
  j.page_size = dev.Regions()[region].page_size;
  return j;
}

// The page hashes a destination holds of region 0's first `pages` pages: as
// they are now, but for pages [from, to), which it holds as something else.
std::vector<uint64_t> HeldExcept(Device& dev, uint64_t pages, uint64_t from, uint64_t to) {
  std::vector<std::byte> buf(pages * kPage);
  EXPECT_TRUE(dev.Read(0, 0, buf).ok());
  PageClassifier now;
  now.Classify(buf, kPage);
  std::vector<uint64_t> held = now.hashes();
  for (uint64_t k = from; k < to; ++k) held[k] ^= 1;
  return held;
}

// What the session thread computed itself before the pipeline: the classifier's runs and hashes.
void ExpectPrepared(const Chunk& c) {
  ASSERT_TRUE(c.read.ok()) << c.read.message();
  ASSERT_EQ(c.raw.size(), c.job.length);
  for (size_t i = 0; i < c.raw.size(); ++i) {
    ASSERT_EQ(c.raw[i], ScriptedDevice::ByteAt(c.job.region_id, c.job.offset + i)) << "byte " << i;
  }
  PageClassifier ref;
  ref.Classify(c.raw, c.job.page_size);
  EXPECT_EQ(c.hashes, ref.hashes());
  ASSERT_EQ(c.parts.size(), ref.runs().size());
  for (size_t k = 0; k < c.parts.size(); ++k) {
    EXPECT_EQ(c.parts[k].first_page, ref.runs()[k].first_page);
    EXPECT_EQ(c.parts[k].pages, ref.runs()[k].pages);
    EXPECT_EQ(c.parts[k].zero, ref.runs()[k].zero);
  }
}

class ChunkPipelineWorkers : public ::testing::TestWithParam<uint32_t> {};

TEST_P(ChunkPipelineWorkers, ResultsComeBackInOrderAsTheSessionThreadWouldHaveThem) {
  ScriptedDevice dev(400, true);
  dev.rendezvous = GetParam() > 1;
  ChunkPipeline pipe(dev, GetParam());
  EXPECT_EQ(pipe.workers(), GetParam());
  std::vector<ChunkJob> jobs;
  for (uint32_t region = 0; region < 2; ++region) {
    for (uint64_t p = 0; p < 400; p += 13) jobs.push_back(Job(dev, region, p, std::min<uint64_t>(13, 400 - p)));
  }
  size_t next = 0, got = 0;
  while (got < jobs.size()) {
    while (next < jobs.size() && pipe.in_flight() < pipe.depth()) pipe.Submit(jobs[next++]);
    EXPECT_LE(pipe.in_flight(), pipe.depth());  // memory bounded by the depth, not the device
    Chunk& c = pipe.Front();
    EXPECT_EQ(c.job.region, jobs[got].region);
    EXPECT_EQ(c.job.first_page, jobs[got].first_page);
    ExpectPrepared(c);
    pipe.PopFront();
    ++got;
  }
  if (GetParam() > 1) {
    EXPECT_GT(dev.max_reading_.load(), 1);  // the reads did overlap
  } else {
    EXPECT_EQ(dev.max_reading_.load(), 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, ChunkPipelineWorkers, ::testing::Values(1u, 2u, 4u));

TEST(ChunkPipeline, ADeviceWithoutConcurrentReadsIsReadOneChunkAtATime) {
  ScriptedDevice dev(200, false);
  ChunkPipeline pipe(dev, 4);
  for (uint64_t p = 0; p < 200; p += 8) {
    if (pipe.in_flight() == pipe.depth()) {
      ExpectPrepared(pipe.Front());
      pipe.PopFront();
    }
    pipe.Submit(Job(dev, 0, p, 8));
  }
  while (pipe.in_flight() > 0) {
    ExpectPrepared(pipe.Front());
    pipe.PopFront();
  }
  EXPECT_EQ(dev.max_reading_.load(), 1);
}

TEST(ChunkPipeline, PagesTheDestinationHoldsAreLeftOutAndCounted) {
  ScriptedDevice dev(20, true);
  ChunkPipeline pipe(dev, 2);
  // What the destination holds: pages 0-9 as they are now, 10-19 as something else.
  std::vector<uint64_t> held = HeldExcept(dev, 20, 10, 20);
  ChunkJob j = Job(dev, 0, 0, 20);
  j.held = held;
  pipe.Submit(j);
  Chunk& c = pipe.Front();
  ASSERT_TRUE(c.read.ok());
  uint64_t sent = 0;
  for (const PageRun& r : c.parts) {
    EXPECT_GE(r.first_page, 10u) << "a held page is sent again";
    sent += r.pages;
  }
  EXPECT_EQ(sent, 10u);
  EXPECT_EQ(c.same_zero, 2u);   // pages 3 and 8
  EXPECT_EQ(c.same_known, 8u);
}

TEST(ChunkPipeline, DataRunsAreEncodedByTheWorkersAndDecodeToTheirBytes) {
  ScriptedDevice dev(64, true);
  ChunkPipeline pipe(dev, 2);
  ChunkJob j = Job(dev, 1, 0, 64);
  j.codec = CodecKind::kZstd;
  j.level = 1;
  pipe.Submit(j);
  Chunk& c = pipe.Front();
  ASSERT_TRUE(c.read.ok());
  ASSERT_EQ(c.used.size(), c.parts.size());
  int encoded = 0;
  for (size_t k = 0; k < c.parts.size(); ++k) {
    const PageRun& r = c.parts[k];
    if (r.zero) {
      EXPECT_EQ(c.used[k], CodecKind::kNone);
      continue;
    }
    if (c.used[k] == CodecKind::kNone) continue;
    ++encoded;
    std::vector<std::byte> back(r.length_bytes);
    FrameDecoder decoder;
    ASSERT_TRUE(decoder.Decode(c.used[k], c.encoded[k], back).ok());
    EXPECT_EQ(0, std::memcmp(back.data(), c.raw.data() + r.offset_bytes, r.length_bytes));
  }
  EXPECT_GT(encoded, 0);  // the scripted bytes compress
}

TEST(ChunkPipeline, DataPagesAreDigestedByTheWorkersForTheContentOffer) {
  ScriptedDevice dev(20, true);
  ChunkPipeline pipe(dev, 2);
  ChunkJob plain = Job(dev, 0, 0, 20);
  pipe.Submit(plain);
  EXPECT_TRUE(pipe.Front().digests.empty()) << "a job not offered is not hashed";
  pipe.PopFront();
  // Pages 10-19 held already: only the data pages of 0-9 are sent, so only they are hashed.
  std::vector<uint64_t> held = HeldExcept(dev, 20, 0, 10);
  ChunkJob j = Job(dev, 0, 0, 20);
  j.held = held;
  j.digest = true;
  pipe.Submit(j);
  Chunk& c = pipe.Front();
  ASSERT_TRUE(c.read.ok());
  ASSERT_EQ(c.digests.size(), 20u * 32);
  int hashed = 0;
  for (const PageRun& r : c.parts) {
    if (r.zero) continue;
    for (uint64_t k = r.first_page; k < r.first_page + r.pages; ++k) {
      const ContentDigest want = Sha256(std::span<const std::byte>(c.raw).subspan(k * kPage, kPage));
      EXPECT_EQ(0, std::memcmp(c.digests.data() + k * 32, want.data(), 32)) << "page " << k;
      ++hashed;
    }
  }
  EXPECT_EQ(hashed, 8);  // pages 0-9 but the zero pages 3 and 8
  EXPECT_GE(c.digest_ms, 0.0);
}

TEST(ChunkPipeline, AReadFailureIsKeptWithItsChunkAndTheOthersGoOn) {
  ScriptedDevice dev(40, true);
  dev.fail_page = 12;
  ChunkPipeline pipe(dev, 2);
  for (uint64_t p = 0; p < 40; p += 10) pipe.Submit(Job(dev, 0, p, 10));
  for (uint64_t p = 0; p < 40; p += 10) {
    Chunk& c = pipe.Front();
    if (p == 10) {
      EXPECT_FALSE(c.read.ok());
      EXPECT_NE(c.read.message().find("read failed"), std::string::npos);
    } else {
      ExpectPrepared(c);
    }
    pipe.PopFront();
  }
}

TEST(ChunkPipeline, ClearedMidWayItDropsWhatIsInFlightAndCarriesOn) {
  ScriptedDevice dev(100, true);
  ChunkPipeline pipe(dev, 2);
  for (uint64_t p = 0; p < 4 * 10; p += 10) pipe.Submit(Job(dev, 0, p, 10));
  pipe.Clear();
  EXPECT_EQ(pipe.in_flight(), 0u);
  pipe.Submit(Job(dev, 1, 50, 10));
  Chunk& c = pipe.Front();
  EXPECT_EQ(c.job.first_page, 50u);
  ExpectPrepared(c);
  pipe.PopFront();
}

// Scattered dirty pages (one-page runs) go many to a worker at once, beside at
// most depth() large chunks; a small chunk never reuses a large one's buffers,
// and results still come back in submission order.
TEST(ChunkPipeline, SmallChunksRunDeepAndKeepToSmallBuffers) {
  ScriptedDevice dev(4096, true);
  ChunkPipeline pipe(dev, 2);
  const size_t small_depth = ChunkPipeline::kSmallPerWorker * 2;
  std::vector<ChunkJob> jobs;  // a large run, then many single pages, then large ones again
  for (uint64_t p = 0; p < 3; ++p) jobs.push_back(Job(dev, 0, p * 256, 256));  // 1 MiB each
  for (uint64_t p = 0; p < 3 * small_depth; ++p) jobs.push_back(Job(dev, 1, p * 3, 1));
  for (uint64_t p = 0; p < 4; ++p) jobs.push_back(Job(dev, 0, 1024 + p * 256, 256));
  size_t next = 0, popped = 0, max_small = 0, max_large = 0;
  while (popped < jobs.size()) {
    while (next < jobs.size() && pipe.HasRoom(jobs[next].length)) pipe.Submit(jobs[next++]);
    size_t small = 0, large = 0;
    for (const auto& c : pipe.chunks()) (c->job.length <= ChunkPipeline::kSmallChunkBytes ? small : large)++;
    max_small = std::max(max_small, small);
    max_large = std::max(max_large, large);
    Chunk& c = pipe.Front();
    EXPECT_EQ(c.job.offset, jobs[popped].offset);
    EXPECT_EQ(c.job.region_id, jobs[popped].region_id);
    ExpectPrepared(c);
    if (c.job.length <= ChunkPipeline::kSmallChunkBytes) {
      EXPECT_LE(c.raw.capacity(), ChunkPipeline::kSmallChunkBytes) << "a small chunk holds a large one's buffer";
    }
    pipe.PopFront();
    ++popped;
  }
  EXPECT_EQ(max_small, small_depth) << "single pages run deep";
  EXPECT_LE(max_large, pipe.depth());
  EXPECT_GE(max_large, 2u);
}

TEST(ChunkPipeline, WorkersDefaultToTheCoresAndAtMostEight) {
  EXPECT_EQ(SourceWorkers(3), 3u);
  const uint32_t automatic = SourceWorkers(0);
  EXPECT_GE(automatic, 1u);
  EXPECT_LE(automatic, 8u);
}

}  // namespace
}  // namespace gpumigrate::session_detail
