// End-to-end in-process migrations of a running sim device.
#include <gtest/gtest.h>

#include <thread>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "tests/support/device_compare.h"

namespace gpumigrate {
namespace {

using testing::ActivationsConsistent;
using testing::ActivationsMonotone;
using testing::DevicesEqual;

struct Pair {
  SimSpec spec;
  std::unique_ptr<SimDevice> src, dst;
};

Pair MakePair(const std::string& text) {
  auto spec = ParseSimSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  Pair p{spec.value(), nullptr, nullptr};
  auto s = SimDevice::Create(p.spec, SimRole::kSource);
  auto d = SimDevice::Create(p.spec, SimRole::kDestination);
  EXPECT_TRUE(s.ok() && d.ok());
  p.src = std::move(s).value();
  p.dst = std::move(d).value();
  return p;
}

TEST(SimMigration, DestinationEqualsSourceAtStop) {
  Pair p = MakePair("sim:size=48MiB,hot=2MiB,kv_rate=64MiB/s,page=16KiB,step=2ms,layers=16");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  uint64_t kernels_before = p.src->KernelsRun();
  LocalMigrationOptions opt;
  opt.source.bandwidth_limit_bytes_per_s = 200e6;  // several rounds while the workload writes
  opt.source.downtime_target = std::chrono::milliseconds(20);
  auto res = MigrateLocally(*p.src, *p.dst, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  ASSERT_EQ(res.destination.outcome, Outcome::kCompleted) << res.destination.status.ToString();
  EXPECT_TRUE(res.source.verified);
  EXPECT_TRUE(res.destination.verified);
  EXPECT_GT(p.src->KernelsRun(), kernels_before + 16) << "the workload must keep running during pre-copy";
  ASSERT_GE(res.source.rounds.size(), 3u) << "expected round 0, at least one dirty round and the final round";
  EXPECT_GT(res.source.rounds[1].dirty_bytes, 0u);
  EXPECT_TRUE(res.source.rounds.back().final);
  EXPECT_EQ(p.src->State(), DeviceState::kStop);
  EXPECT_EQ(p.dst->State(), DeviceState::kRunning);

  // The destination resumed from the source's stop point and keeps running the workload.
  SimPosition stop = p.src->Position();
  EXPECT_GE(p.dst->Position().step, stop.step);
  uint64_t dst_kernels = p.dst->KernelsRun();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_GT(p.dst->KernelsRun(), dst_kernels);
}

TEST(SimMigration, ByteForByteAndCanariesAtStop) {
  // The destination is compared before it runs a single kernel: hold Commit's
  // effect by comparing inside the destination's commit hook.
  Pair p = MakePair("sim:size=32MiB,hot=4MiB,kv_rate=128MiB/s,page=8KiB,step=1ms,layers=64");
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  LocalMigrationOptions opt;
  opt.source.bandwidth_limit_bytes_per_s = 150e6;
  opt.source.downtime_target = std::chrono::milliseconds(10);
  ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
  ::testing::AssertionResult canaries = ::testing::AssertionFailure() << "commit never reached";
  ::testing::AssertionResult monotone = ::testing::AssertionFailure() << "commit never reached";
  // Writes keep landing between the last round's sync and the stop (a slow
  // stop): only the final sync under STOP_COPY finds them.
  opt.source.on_phase = [](Phase phase, uint32_t) {
    if (phase == Phase::kSwitchover) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  };
  opt.destination.on_phase = [&](Phase phase, uint32_t) {
    if (phase != Phase::kCommitReceived) return;
    // Both devices are stopped here: the source at its stop point, the
    // destination fully applied and verified but not yet running.
    equal = DevicesEqual(*p.src, *p.dst);
    canaries = ActivationsConsistent(*p.dst, p.spec, p.src->Position());
    monotone = ActivationsMonotone(*p.dst);
  };
  auto res = MigrateLocally(*p.src, *p.dst, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_TRUE(equal);
  EXPECT_TRUE(canaries);
  EXPECT_TRUE(monotone);
  EXPECT_GT(p.src->Position().step, 2u);
}

class StreamsAndPages : public ::testing::TestWithParam<std::tuple<uint32_t, std::string, std::string>> {};

TEST_P(StreamsAndPages, EqualAtStop) {
  auto [streams, spec, codec] = GetParam();
  Pair p = MakePair(spec);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  LocalMigrationOptions opt;
  opt.data_streams = streams;
  opt.source.bandwidth_limit_bytes_per_s = 300e6;
  opt.source.downtime_target = std::chrono::milliseconds(15);
  opt.source.max_frame_payload_bytes = 96 << 10;  // many frames, so streams interleave
  opt.source.codec = *ParseCodecChoice(codec);
  ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
  opt.destination.on_phase = [&](Phase phase, uint32_t) {
    if (phase == Phase::kCommitReceived) equal = DevicesEqual(*p.src, *p.dst);
  };
  auto res = MigrateLocally(*p.src, *p.dst, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_TRUE(res.destination.verified);
  EXPECT_TRUE(equal);
  if (codec != "none") {
    EXPECT_GT(res.source.compression_ratio, 1.1) << codec;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, StreamsAndPages,
    ::testing::Values(std::make_tuple(1u, "sim:size=24MiB,hot=1MiB,kv_rate=32MiB/s,page=4KiB,step=2ms", "none"),
                      std::make_tuple(3u, "sim:size=24MiB,hot=1MiB,kv_rate=32MiB/s,page=4KiB,step=2ms", "none"),
                      std::make_tuple(4u, "sim:size=40MiB,hot=3MiB,kv_rate=256MiB/s,page=64KiB,step=1ms", "none"),
                      std::make_tuple(2u, "sim:size=20MiB,static=0,kv=0.9,hot=1MiB,kv_rate=200MiB/s,page=16KiB,step=1ms",
                                      "none"),
                      std::make_tuple(1u, "sim:size=24MiB,hot=1MiB,kv_rate=32MiB/s,page=16KiB,step=2ms", "zstd"),
                      std::make_tuple(3u, "sim:size=24MiB,hot=1MiB,kv_rate=32MiB/s,page=4KiB,step=2ms", "shuffle"),
                      std::make_tuple(3u, "sim:size=24MiB,hot=1MiB,kv_rate=32MiB/s,page=4KiB,step=2ms", "bf16"),
                      std::make_tuple(2u, "sim:size=32MiB,hot=2MiB,kv_rate=64MiB/s,page=64KiB,step=1ms", "zstd:3")));

// The destination's workers (issue 38 step 4): frames larger than the inline
// limit are opened, decoded and written by workers, out of their stream's
// order; hot pages rewritten round after round must still end as the source's.
class DestinationWorkers : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, std::string>> {};

TEST_P(DestinationWorkers, EqualAtStop) {
  auto [streams, workers, codec] = GetParam();
  Pair p = MakePair("sim:size=32MiB,hot=4MiB,kv_rate=96MiB/s,page=16KiB,step=1ms");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  LocalMigrationOptions opt;
  opt.data_streams = streams;
  opt.source.bandwidth_limit_bytes_per_s = 300e6;
  opt.source.downtime_target = std::chrono::milliseconds(15);
  opt.source.max_frame_payload_bytes = 256 << 10;  // over the inline limit: the workers' frames
  opt.source.codec = *ParseCodecChoice(codec);
  opt.destination.workers = workers;
  ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
  opt.destination.on_phase = [&](Phase phase, uint32_t) {
    if (phase == Phase::kCommitReceived) equal = DevicesEqual(*p.src, *p.dst);
  };
  auto res = MigrateLocally(*p.src, *p.dst, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  ASSERT_EQ(res.destination.outcome, Outcome::kCompleted) << res.destination.status.ToString();
  EXPECT_TRUE(res.destination.verified);
  EXPECT_TRUE(equal);
  EXPECT_GE(res.source.rounds.size(), 2u) << "hot pages must be sent again";
  ASSERT_TRUE(res.destination.destination_workers.has_value());
  EXPECT_EQ(*res.destination.destination_workers, workers);
  EXPECT_FALSE(res.source.destination_workers.has_value());
}

INSTANTIATE_TEST_SUITE_P(Variants, DestinationWorkers,
                         ::testing::Values(std::make_tuple(1u, 2u, "none"), std::make_tuple(2u, 3u, "none"),
                                           std::make_tuple(1u, 2u, "zstd"), std::make_tuple(3u, 1u, "none")));

TEST(SimMigration, NonConvergingMigrationAbortsWithDrainAndReplace) {
  // The hot set alone is rewritten far faster than the capped link can carry it.
  Pair p = MakePair("sim:size=32MiB,hot=8MiB,kv_rate=0,page=16KiB,step=1ms");
  LocalMigrationOptions opt;
  opt.source.bandwidth_limit_bytes_per_s = 40e6;
  opt.source.downtime_target = std::chrono::milliseconds(5);
  opt.source.max_stun = std::chrono::milliseconds(50);
  opt.source.max_rounds = 8;
  auto res = MigrateLocally(*p.src, *p.dst, opt);
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_NE(res.source.status.message().find("drain-and-replace"), std::string::npos) << res.source.status.ToString();
  EXPECT_LE(res.source.rounds.size(), 8u);
  EXPECT_EQ(res.destination.outcome, Outcome::kAborted);
  EXPECT_EQ(p.src->State(), DeviceState::kRunning);
  EXPECT_EQ(p.dst->State(), DeviceState::kError);
  uint64_t k = p.src->KernelsRun();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(p.src->KernelsRun(), k) << "the source workload must still be running";
}

TEST(SimMigration, NonConvergingMigrationSwitchesWithinMaxStun) {
  Pair p = MakePair("sim:size=32MiB,hot=8MiB,kv_rate=0,page=16KiB,step=1ms");
  LocalMigrationOptions opt;
  opt.source.bandwidth_limit_bytes_per_s = 40e6;
  opt.source.downtime_target = std::chrono::milliseconds(5);
  opt.source.max_stun = std::chrono::seconds(5);
  opt.source.max_rounds = 6;
  auto res = MigrateLocally(*p.src, *p.dst, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_NE(res.source.switchover_reason.find("max stun"), std::string::npos) << res.source.switchover_reason;
  EXPECT_GT(res.source.predicted_stun_ms, 5.0);
}

}  // namespace
}  // namespace gpumigrate

namespace gpumigrate {
namespace {

// A probe pre-copies for real, stops at the switchover decision and aborts on
// purpose: the source never stopped, the destination discarded everything.
TEST(SimMigration, DryRunProbeLeavesTheSourceRunning) {
  Pair p = MakePair("sim:size=24MiB,hot=1MiB,kv_rate=32MiB/s,page=16KiB,step=2ms");
  LocalMigrationOptions opt;
  opt.source.dry_run = true;
  opt.source.bandwidth_limit_bytes_per_s = 200e6;
  opt.source.downtime_target = std::chrono::milliseconds(20);
  opt.source.on_phase = [&](Phase phase, uint32_t) {
    EXPECT_NE(phase, Phase::kSwitchover) << "a probe never stops the device";
  };
  auto res = MigrateLocally(*p.src, *p.dst, opt);
  EXPECT_TRUE(res.source.status.ok()) << res.source.status.ToString();
  EXPECT_TRUE(res.source.dry_run);
  EXPECT_TRUE(res.source.would_switch);
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_GE(res.source.rounds.size(), 1u);
  EXPECT_GT(res.source.predicted_stun_ms, 0);
  EXPECT_EQ(p.src->State(), DeviceState::kRunning);
  EXPECT_EQ(p.dst->State(), DeviceState::kError);
  EXPECT_EQ(res.destination.outcome, Outcome::kAborted);
  EXPECT_NE(res.destination.status.message().find("dry run"), std::string::npos);
  uint64_t k = p.src->KernelsRun();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(p.src->KernelsRun(), k);
}

}  // namespace
}  // namespace gpumigrate

namespace gpumigrate {
namespace {

// The same session over real loopback sockets: TCP data streams on io_uring,
// with and without TLS 1.3 + AES-256-GCM.
class Loopback : public ::testing::TestWithParam<bool> {};

TEST_P(Loopback, EqualAtStopOverSockets) {
  const bool tls = GetParam();
  Pair p = MakePair("sim:size=24MiB,hot=1MiB,kv_rate=32MiB/s,page=16KiB,step=2ms");
  LocalMigrationOptions opt;
  opt.data_streams = 2;
  opt.source.bandwidth_limit_bytes_per_s = 300e6;
  opt.source.downtime_target = std::chrono::milliseconds(15);
  ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
  opt.destination.on_phase = [&](Phase phase, uint32_t) {
    if (phase == Phase::kCommitReceived) equal = DevicesEqual(*p.src, *p.dst);
  };
  std::string security;
  auto res = MigrateOverLoopback(*p.src, *p.dst, opt, tls, &security);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  ASSERT_EQ(res.destination.outcome, Outcome::kCompleted) << res.destination.status.ToString();
  EXPECT_TRUE(equal);
  EXPECT_EQ(security.find("AES-256-GCM") != std::string::npos, tls) << security;
}

INSTANTIATE_TEST_SUITE_P(Transports, Loopback, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "tls" : "tcp"; });

}  // namespace
}  // namespace gpumigrate
