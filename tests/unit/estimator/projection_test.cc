// Projection to a target host and to a larger GPU VM (gpumigrate/estimator/projection.h),
// on hand-computed cases.
#include <cmath>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/estimator/projection.h"
#include "gpumigrate/session/session.h"

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;
constexpr double kG = 1e9;

StageRates Uniform(double r) {
  StageRates s;
  s.copy = s.hash = s.aes_gcm = s.tcp = r;
  s.zstd_compress = s.zstd_decompress = s.shuffle_compress = s.shuffle_decompress = r;
  s.bf16_compress = s.bf16_decompress = r;
  return s;
}

TargetSpec Target(uint32_t cores, uint32_t streams, StageRates r) {
  TargetSpec t;
  t.cores = cores;
  t.streams = streams;
  t.per_core = r;
  return t;
}

double LimitOf(const PipelineBound& b, const std::string& name) {
  for (const auto& l : b.limits) {
    if (l.name == name) return l.raw_bytes_per_s;
  }
  ADD_FAILURE() << "no limit " << name;
  return 0;
}

TEST(TargetPipeline, SumsEachThreadGroupsStages) {
  // The engine as built, on 4 cores at 1 GB/s per stage: 4 workers (one per
  // core) read + hash = 2 ns/B: 2 GB/s. The session thread copies each frame:
  // 1 ns/B on one core. Sending: seal + send = 2 ns/B on min(8 streams, 4 cores).
  // Destination: receive + open + hash + write = 4 ns/B on 4 threads: 1 GB/s.
  // The source's cores carry 2 + 1 + 2 = 5 ns/B: 0.8 GB/s, the bound.
  auto b = TargetPipeline(Target(4, 8, Uniform(kG)), CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NEAR(LimitOf(*b, "source workers"), 2 * kG, 1);
  EXPECT_NEAR(LimitOf(*b, "source session thread"), 1 * kG, 1);
  EXPECT_NEAR(LimitOf(*b, "source send"), 2 * kG, 1);
  EXPECT_NEAR(LimitOf(*b, "destination CPU"), 1 * kG, 1);
  EXPECT_NEAR(LimitOf(*b, "source CPU"), 0.8 * kG, 1);
  EXPECT_EQ(b->binds, "source CPU");
  EXPECT_NEAR(b->raw_bytes_per_s, 0.8 * kG, 1);
  // One worker (migrate --threads 1): 0.5 GB/s, the workers bind.
  TargetSpec one_worker = Target(4, 8, Uniform(kG));
  one_worker.source_workers = 1;
  b = TargetPipeline(one_worker, CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->binds, "source workers");
  EXPECT_NEAR(b->raw_bytes_per_s, 0.5 * kG, 1);
  // Without destination workers (receive --threads 0) receiving threads are
  // min(streams, cores): one stream uses one core however many there are.
  TargetSpec inline_dst = Target(64, 1, Uniform(kG));
  inline_dst.destination_workers = 0;
  auto one = TargetPipeline(inline_dst, CodecKind::kNone, 1.0);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->binds, "destination CPU");
  EXPECT_NEAR(one->raw_bytes_per_s, 0.25 * kG, 1);
  // With the engine's default there, DefaultDestinationWorkers(64, 1) = 8:
  // the stream's thread only receives (1 ns/B: 1 GB/s), 8 workers open, hash
  // and write (3 ns/B: 2.67 GB/s), and the one sending thread (seal + send,
  // 2 ns/B: 0.5 GB/s) binds.
  EXPECT_EQ(DestinationWorkersOf(Target(64, 1, Uniform(kG))), 8u);
  one = TargetPipeline(Target(64, 1, Uniform(kG)), CodecKind::kNone, 1.0);
  ASSERT_TRUE(one.ok());
  EXPECT_NEAR(LimitOf(*one, "destination receive"), 1 * kG, 1);
  EXPECT_NEAR(LimitOf(*one, "destination workers"), 8.0 / 3 * kG, 1);
  EXPECT_NEAR(LimitOf(*one, "destination CPU"), 16 * kG, 1);
  EXPECT_EQ(one->binds, "source send");
  EXPECT_NEAR(one->raw_bytes_per_s, 0.5 * kG, 1);
}

TEST(TargetPipeline, WorkersFollowTheEnginesDefaultForTheCores) {
  // 32 cores: the engine runs DefaultSourceWorkers(32) = 8 workers there, not 32.
  EXPECT_EQ(DefaultSourceWorkers(32), 8u);
  EXPECT_EQ(DefaultSourceWorkers(2), 2u);
  EXPECT_EQ(DefaultSourceWorkers(0), 1u);
  StageRates r = Uniform(100 * kG);
  r.zstd_compress = 0.5 * kG;  // compressing binds the workers: 8 x 0.5 GB/s (the rest is nearly free)
  auto b = TargetPipeline(Target(32, 32, r), CodecKind::kZstd, 2.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->binds, "source workers");
  EXPECT_NEAR(b->raw_bytes_per_s, 8 / (1 / (100 * kG) + 1 / (100 * kG) + 1 / (0.5 * kG)), 1e3);
  bool named = false;
  for (const auto& l : b->limits) named |= l.detail.find("8 reading threads on 32 cores") != std::string::npos;
  EXPECT_TRUE(named);
  // A device read slower than memcpy (the sim's generated content, a GPU's DMA) is its own rate.
  TargetSpec slow = Target(2, 2, Uniform(kG));
  slow.source_workers = 1;
  slow.device_read_bytes_per_s = 0.25 * kG;  // 4 ns/B + hash 1 ns/B on one worker
  b = TargetPipeline(slow, CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->binds, "source workers");
  EXPECT_NEAR(b->raw_bytes_per_s, 0.2 * kG, 1);
}

// This host's measured per-core rates (calibrate on the 2-core VM) on a
// 32-core target at 100 Gbit: the pipeline as built is bound by the link.
TEST(TargetPipeline, AManyCoreTargetIsBoundByTheLink) {
  StageRates r = Uniform(kG);
  r.copy = 12.7 * kG;
  r.hash = 11.3 * kG;
  r.aes_gcm = 3.5 * kG;
  r.tcp = 2.66 * kG;
  TargetSpec t = Target(32, 32, r);
  t.link_bytes_per_s = 12.5 * kG;
  auto b = TargetPipeline(t, CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->binds, "link");
  EXPECT_NEAR(b->raw_bytes_per_s, 12.5 * kG, 1);
  // The session thread's frame copy is the next bound: one core's memcpy.
  EXPECT_NEAR(LimitOf(*b, "source session thread"), 12.7 * kG, 1e3);
}

TEST(TargetPipeline, TheSlowerSideAndTheLinkBind) {
  StageRates r = Uniform(kG);
  r.zstd_compress = 0.25 * kG;  // source: workers read 1 + hash 1 + compress 4, session copy 0.5, seal 0.5 + send 0.5
  r.zstd_decompress = 1 * kG;   // destination: (recv + open) 1 + decompress 1 + hash 1 + write 1 = 4 ns/B
  TargetSpec t = Target(7, 7, r);
  t.source_workers = 7;
  auto b = TargetPipeline(t, CodecKind::kZstd, 2.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->binds, "source CPU");  // 7 cores / 7.5 ns/B
  EXPECT_NEAR(b->raw_bytes_per_s, 7 / 7.5 * kG, 1e3);
  EXPECT_NEAR(b->wire_bytes_per_s, 7 / 15.0 * kG, 1e3);
  t.link_bytes_per_s = 0.1 * kG;  // the link carries wire bytes: 0.2 GB/s raw at ratio 2
  b = TargetPipeline(t, CodecKind::kZstd, 2.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->binds, "link");
  EXPECT_NEAR(b->raw_bytes_per_s, 0.2 * kG, 1);
  EXPECT_NEAR(b->wire_bytes_per_s, 0.1 * kG, 1);
}

TEST(TargetPipeline, SharedHostStreamsAndNic) {
  TargetSpec t = Target(2, 2, Uniform(kG));
  t.shared_host = true;  // 2 cores for (2 + 1 + 2) + 4 ns/B
  auto b = TargetPipeline(t, CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->binds, "shared CPU");
  EXPECT_NEAR(b->raw_bytes_per_s, 2 / 9.0 * kG, 1);
  // Integrity tags only: the tag costs a hash per wire byte on each side, no AES.
  t.encrypted = false;
  t.per_core.aes_gcm = 0;
  t.per_core.hash = 0.5 * kG;  // workers 1 + 2, session 1, send 2 + 1; destination 1 + 2 + 2 + 1
  b = TargetPipeline(t, CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NEAR(b->raw_bytes_per_s, 2 / 13.0 * kG, 1);
  t = Target(64, 4, Uniform(100 * kG));
  t.per_stream_bytes_per_s = 1 * kG;
  t.link_bytes_per_s = 12.5 * kG;
  t.nic_bytes_per_s = 6 * kG;
  b = TargetPipeline(t, CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->binds, "streams");
  EXPECT_NEAR(b->raw_bytes_per_s, 4 * kG, 1);
  t.per_stream_bytes_per_s = 0;
  b = TargetPipeline(t, CodecKind::kNone, 1.0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->binds, "NIC");
}

TEST(TargetPipeline, UnmeasuredStagesAndNoCoresAreErrors) {
  StageRates r = Uniform(kG);
  r.aes_gcm = 0;
  auto b = TargetPipeline(Target(4, 4, r), CodecKind::kNone, 1.0);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("AES-GCM"), std::string::npos) << b.status().message();
  TargetSpec plain = Target(4, 4, r);
  plain.encrypted = false;  // integrity tags only: AES is not a stage
  EXPECT_TRUE(TargetPipeline(plain, CodecKind::kNone, 1.0).ok());
  EXPECT_FALSE(TargetPipeline(Target(0, 4, Uniform(kG)), CodecKind::kNone, 1.0).ok());
  EXPECT_FALSE(TargetPipeline(Target(4, 0, Uniform(kG)), CodecKind::kNone, 1.0).ok());
}

WorkingSetCurve Linear(double rate) {
  WorkingSetCurve c;
  c.window_s = {0.5, 1.0};
  c.low_bytes = c.mid_bytes = c.high_bytes = {rate / 2, rate};
  return c;
}

// One "GPU" of 1 GB: 700 MB of weights never written, a 300 MB KV cache
// written at 50 MB/s.
DeviceProfile OneGpu() {
  DeviceProfile p;
  p.device = "sim:test";
  p.device_state_bytes = 1000;
  RegionProfile w;
  w.info = RegionInfo{0, "weights", 700'000'000, 65536, RegionHint::kStatic};
  RegionProfile kv;
  kv.info = RegionInfo{1, "kv", 300'000'000, 65536, RegionHint::kDynamic};
  kv.dirty = Linear(50e6);
  p.regions = {w, kv};
  return p;
}

TEST(ProjectWorkload, PerGpuScalesRatesByGpuCountNotBySize) {
  WorkloadProjection w;
  w.mode = WorkloadProjection::Mode::kPerGpu;
  w.gpus = 8;
  w.bytes_per_gpu = 80'000'000'000;
  std::vector<std::string> why;
  auto p = ProjectWorkload(OneGpu(), w, &why);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->regions[0].info.size_bytes, 8ull * 56'000'000'000);
  EXPECT_EQ(p->regions[1].info.size_bytes, 8ull * 24'000'000'000);
  // 8 GPUs write 8 x 50 MB/s, not 640 x.
  EXPECT_DOUBLE_EQ(p->regions[1].dirty.Eval(1.0, WorkingSetCurve::Bound::kMid, 1e15), 400e6);
  EXPECT_EQ(p->device_state_bytes, 8000u);
  EXPECT_FALSE(why.empty());
  // The old mode scales the rate with the size.
  w.mode = WorkloadProjection::Mode::kScale;
  auto s = ProjectWorkload(OneGpu(), w, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_NEAR(s->regions[1].dirty.Eval(1.0, WorkingSetCurve::Bound::kMid, 1e15), 640 * 50e6, 1);
}

TEST(ProjectWorkload, ExplicitFiguresReplaceTheMeasuredWorkload) {
  WorkloadProjection w;
  w.mode = WorkloadProjection::Mode::kExplicit;
  w.gpus = 4;
  w.bytes_per_gpu = 10'000'000'000;
  w.static_fraction = 0.75;
  w.kv_rate_per_gpu = 200e6;
  auto p = ProjectWorkload(OneGpu(), w, nullptr);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->regions.size(), 2u);
  EXPECT_EQ(p->regions[0].info.size_bytes, 30'000'000'000u);
  EXPECT_DOUBLE_EQ(p->regions[0].dirty.Eval(5.0, WorkingSetCurve::Bound::kHigh, 1e15), 0);
  EXPECT_EQ(p->regions[1].info.size_bytes, 10'000'000'000u);
  EXPECT_DOUBLE_EQ(p->regions[1].dirty.Eval(2.0, WorkingSetCurve::Bound::kMid, 1e15), 1.6e9);
  w.static_fraction = 1.5;
  EXPECT_FALSE(ProjectWorkload(OneGpu(), w, nullptr).ok());
  w.static_fraction = 0.5;
  w.gpus = 0;
  EXPECT_FALSE(ProjectWorkload(OneGpu(), w, nullptr).ok());
}

Calibration Cal() {
  Calibration c;
  c.fixed_cost_ms = 5;
  c.inprocess_bytes_per_s = c.inprocess_low_bytes_per_s = c.inprocess_high_bytes_per_s = 0.5 * kG;
  return c;
}

EstimateOptions ProjectedOptions(uint32_t gpus, double link) {
  EstimateOptions o;
  o.project = true;
  o.workload.mode = WorkloadProjection::Mode::kPerGpu;
  o.workload.gpus = gpus;
  o.workload.bytes_per_gpu = 80'000'000'000;
  o.link_bytes_per_s = link;
  o.link_text = "test";
  o.target = Target(32, 8, Uniform(4 * kG));
  return o;
}

TEST(EstimateFromProfile, TargetSetsTheBandwidthNotThisHost) {
  const double link = 12.5 * kG;  // 100 Gbit
  auto e = EstimateFromProfile(OneGpu(), ProjectedOptions(8, link), Cal());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_TRUE(e->pipeline.has_value());
  // The session thread's frame copy at 4 GB/s binds, below the 12.5 GB/s link
  // (8 workers: read + hash at 0.5 ns/B, 16 GB/s).
  EXPECT_EQ(e->pipeline->binds, "source session thread");
  EXPECT_NEAR(e->params.bandwidth_mid, 4 * kG, 1e3);
  EXPECT_GT(e->params.bandwidth_mid, Cal().inprocess_bytes_per_s);
  // More GPUs, same link: a longer migration (the stun need not grow: where a
  // round ends below the target is the switchover rule's, not the size's).
  auto one = EstimateFromProfile(OneGpu(), ProjectedOptions(1, link), Cal());
  ASSERT_TRUE(one.ok());
  EXPECT_GT(e->prediction.mid.total_ms, 7 * one->prediction.mid.total_ms);
}

// `estimate --codec zstd` without --link on a device with an all-zero region (the
// sim's free memory): that region has no measured codec speed, so its effective ratio
// (min(ratio, speed / bandwidth)) is 0, and dividing by it made
// every round, the stun and the total NaN (printed as null, decision
// cannot-converge). A region with nothing sampled sends at ratio 1.
TEST(EstimateFromProfile, ACompressingCodecOnAnUnsampledRegionStaysFinite) {
  DeviceProfile p = OneGpu();
  p.regions[0].codecs.zstd_ratio = 2.0;
  p.regions[0].codecs.zstd_bytes_per_s = 4 * kG;
  RegionProfile free;
  free.info = RegionInfo{2, "free", 100'000'000, 65536, RegionHint::kDynamic};
  free.nonzero_fraction = 0;  // nothing sampled: no measured codec speed, an effective ratio of 0
  p.regions.push_back(free);
  EstimateOptions o;
  o.codec.mode = CodecChoice::Mode::kZstd;
  auto e = EstimateFromProfile(p, o, Cal());
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_DOUBLE_EQ(e->modelled.regions[2].compression_ratio, 1.0);
  EXPECT_DOUBLE_EQ(e->modelled.regions[0].compression_ratio, 2.0);
  EXPECT_TRUE(std::isfinite(e->prediction.mid.stun_ms));
  EXPECT_TRUE(std::isfinite(e->prediction.mid.total_ms));
  EXPECT_EQ(e->prediction.decision, EstimateDecision::kLiveMigrate) << e->prediction.explanation;
}

TEST(ProjectTable, OneCellPerGpuCountAndLinkWithStopAndCopyBeside) {
  auto t = ProjectTable(OneGpu(), ProjectedOptions(1, 0), Cal(), {1, 2, 8}, {"5Gbit", "400Gbit"});
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->cells.size(), 6u);
  EXPECT_EQ(t->cells[0].gpus, 1u);
  EXPECT_EQ(t->cells[1].link, "400Gbit");
  EXPECT_EQ(t->cells[5].gpus, 8u);
  for (const auto& c : t->cells) {
    EXPECT_GT(c.stop_and_copy_stun_ms, c.estimate.prediction.mid.stun_ms) << c.gpus << " " << c.link;
  }
  // At 5 Gbit the link binds; at 400 Gbit the source's session thread does.
  EXPECT_EQ(t->cells[0].estimate.pipeline->binds, "link");
  EXPECT_EQ(t->cells[1].estimate.pipeline->binds, "source session thread");
  EXPECT_FALSE(ProjectTable(OneGpu(), EstimateOptions{}, Cal(), {1}, {"25Gbit"}).ok());
  EXPECT_NE(ProjectionTableToJson(*t).find("published by VMware"), std::string::npos);
}

TEST(HostProfile, SavesLoadsAndNamesWhatIsWrong) {
  const auto dir = std::filesystem::temp_directory_path() / ("gm-hp-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  HostProfile p;
  p.host = "h";
  p.cores = 96;
  p.per_core = Uniform(3 * kG);
  p.per_core.tcp = 1.5 * kG;
  const std::string path = (dir / "p.json").string();
  ASSERT_TRUE(SaveHostProfile(p, path).ok());
  auto back = LoadHostProfile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->cores, 96u);
  EXPECT_DOUBLE_EQ(back->per_core.tcp, 1.5 * kG);
  EXPECT_DOUBLE_EQ(back->per_core.shuffle_decompress, 3 * kG);
  EXPECT_DOUBLE_EQ(back->per_core.bf16_compress, 3 * kG);
  auto expect_bad = [&](const std::string& text, const std::string& names) {
    std::ofstream(path) << text;
    auto r = LoadHostProfile(path);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(names), std::string::npos) << r.status().message();
  };
  expect_bad("not json", "not a JSON object");
  expect_bad(R"({"version": 2, "cores": 4})", "version 2");
  std::string j = HostProfileToJson(p);
  expect_bad(j.replace(j.find("\"aes_gcm\""), 9, "\"aes_gXm\""), "aes_gcm is missing");
  expect_bad(R"({"version": 1, "cores": 4, "per_core_bytes_per_s": {"copy": -1}})", "copy must be > 0");
  EXPECT_FALSE(LoadHostProfile((dir / "absent.json").string()).ok());

  // A profile from before the bf16 codec loads; a pipeline that needs bf16 then names the stage.
  std::string old = HostProfileToJson(p);
  for (const char* k : {"bf16_compress", "bf16_decompress"}) {
    const size_t at = old.find(fmt::format("\"{}\"", k));
    ASSERT_NE(at, std::string::npos) << k;
    old.replace(at + 1, 4, "gone");
  }
  std::ofstream(path) << old;
  auto before = LoadHostProfile(path);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_EQ(before->per_core.bf16_compress, 0);
  EXPECT_DOUBLE_EQ(before->per_core.shuffle_compress, 3 * kG);
  TargetSpec t = Target(8, 2, before->per_core);
  EXPECT_TRUE(TargetPipeline(t, CodecKind::kShuffleZstd, 1.4).ok());
  auto needs_bf16 = TargetPipeline(t, CodecKind::kBf16, 1.5);
  ASSERT_FALSE(needs_bf16.ok());
  EXPECT_NE(needs_bf16.status().message().find("'bf16 compress' has no measured per-core rate"), std::string::npos)
      << needs_bf16.status().message();
  std::filesystem::remove_all(dir);
}

TEST(TargetPipeline, Bf16UsesItsOwnStageRates) {
  StageRates r = Uniform(kG);
  r.bf16_compress = 0.5 * kG;  // the only slow stage: it binds the session thread
  auto b = TargetPipeline(Target(64, 8, r), CodecKind::kBf16, 1.5);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  bool named = false;
  for (const auto& l : b->limits) named |= l.detail.find("costliest: bf16 compress") != std::string::npos;
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace gpumigrate
