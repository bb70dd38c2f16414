// Whole migrations of a fake VFIO device through the session: pre-copy while
// the device's memory is written, byte-identical destination, a stream moved
// in bounded chunks, and every fault ending with the source RUNNING.
#include <atomic>
#include <functional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "engine/devices/vfio/vfio_device.h"
#include "gpumigrate/session/local_migration.h"
#include "tests/support/vfio/counting_kernel.h"
#include "tests/support/vfio/vfio_test_util.h"

namespace gpumigrate::vfio {
namespace {

using fake::CountingKernel;
using fake::FakeHost;
using fake::FakeVfioConfig;

constexpr uint64_t kAll = VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P | VFIO_MIGRATION_PRE_COPY;

FakeVfioConfig Config(uint64_t flags, size_t memory, uint32_t initial) {
  FakeVfioConfig c;
  c.migration_flags = flags;
  c.memory_bytes = memory;
  c.max_read_bytes = 48 << 10;
  c.initial_state = initial;
  return c;
}

void Fill(fake::FakeVfioDevice& d, size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(bytes);
  for (auto& b : v) b = std::byte(rng() & 0xff);
  ASSERT_TRUE(d.WriteMemory(0, v));
}

struct Pair {
  FakeHost src, dst;
  CountingKernel dst_kernel{dst.kernel};
  LocalMigrationOptions opt;
  LocalMigrationResult res;

  Pair(uint64_t flags, size_t memory)
      : src(Config(flags, memory, kStateRunning)), dst(Config(flags, memory, kStateRunning)) {
    Fill(*src.dev, memory, 1);
    opt.source.downtime_target = std::chrono::milliseconds(500);
  }
  // `armed` runs once both devices are open (a fault meant for the migration,
  // not for opening).
  void Migrate(const std::function<void()>& armed = nullptr) {
    auto s = VfioDevice::Open({{src.path}}, DeviceRole::kSource, src.kernel);
    auto d = VfioDevice::Open({{dst.path}}, DeviceRole::kDestination, dst_kernel);
    ASSERT_TRUE(s.ok() && d.ok());
    if (armed) armed();
    res = MigrateLocally(**s, **d, opt);
  }
  void ExpectAbortedWithSourceRunning(std::string_view why) {
    EXPECT_EQ(res.source.outcome, Outcome::kAborted);
    EXPECT_NE(res.source.status.message().find(why), std::string::npos) << res.source.status.ToString();
    // A device's own error is not a broken connection (kUnavailable would read as one).
    EXPECT_EQ(res.source.status.message().find("closed the connection"), std::string::npos)
        << res.source.status.ToString();
    EXPECT_EQ(src.dev->state(), kStateRunning) << "the source runs on";
    EXPECT_NE(dst.dev->state(), kStateRunning) << "the destination never runs";
    EXPECT_EQ(src.kernel.OpenFds(), 0u);
  }
};

TEST(VfioMigration, PreCopyWhileMemoryIsWrittenEndsByteIdentical) {
  Pair r(kAll, 4 << 20);
  r.opt.data_streams = 3;
  r.opt.source.max_frame_payload_bytes = 32 << 10;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> writes{0};
  std::thread writer([&] {
    std::mt19937 rng(7);
    std::vector<std::byte> v(300);
    while (!stop) {
      for (auto& b : v) b = std::byte(rng() & 0xff);
      if (r.src.dev->WriteMemory(rng() % ((4 << 20) - v.size()), v)) ++writes;
    }
  });
  uint64_t in_precopy = 0;
  r.opt.source.on_phase = [&](Phase p, uint32_t) {
    // Deterministic writes while the device is in PRE_COPY, on top of the thread's.
    if (p == Phase::kRoundEnd && r.src.dev->state() == kStatePreCopy) {
      std::vector<std::byte> v(5000, std::byte{0xee});
      in_precopy += r.src.dev->WriteMemory(12345, v);
    }
  };
  r.Migrate();
  stop = true;
  writer.join();
  ASSERT_EQ(r.res.source.outcome, Outcome::kCompleted) << r.res.source.status.ToString();
  ASSERT_EQ(r.res.destination.outcome, Outcome::kCompleted) << r.res.destination.status.ToString();
  EXPECT_GE(in_precopy, 1u);
  EXPECT_GT(writes.load(), 0u);
  EXPECT_GE(r.res.source.rounds.size(), 2u);
  EXPECT_EQ(r.src.dev->state(), kStateStop);
  EXPECT_EQ(r.dst.dev->state(), kStateRunning);
  EXPECT_TRUE(r.dst.dev->Memory() == r.src.dev->Memory()) << "destination differs from the source at stop";
  // Its memory is the driver's to clear: the report says it was not scrubbed, and why.
  EXPECT_FALSE(r.res.source.scrubbed);
  EXPECT_NE(r.res.source.scrub.find("not reachable through the migration uAPI"), std::string::npos)
      << r.res.source.scrub;
}

TEST(VfioMigration, AStreamLargerThanAFrameMovesInBoundedWrites) {
  Pair r(kAll, 8 << 20);
  r.opt.data_streams = 2;
  r.opt.source.max_frame_payload_bytes = 16 << 10;
  r.Migrate();
  ASSERT_EQ(r.res.source.outcome, Outcome::kCompleted) << r.res.source.status.ToString();
  EXPECT_TRUE(r.dst.dev->Memory() == r.src.dev->Memory());
  EXPECT_LE(r.dst_kernel.max_write.load(), size_t{16} << 10) << "the destination wrote more than a frame at once";
  EXPECT_GE(r.dst_kernel.writes.load(), (size_t{8} << 20) / (16 << 10)) << "the stream arrived in frame-sized writes";
}

// Without PRE_COPY (and no memory regions) nothing moves before the stun, so
// the rule has no bandwidth sample: such a device migrates stop-and-copy.
TEST(VfioMigration, StopAndCopyDeviceWithoutPreCopy) {
  Pair r(VFIO_MIGRATION_STOP_COPY, 1 << 20);
  r.opt.source.stop_and_copy = true;
  r.Migrate();
  ASSERT_EQ(r.res.source.outcome, Outcome::kCompleted) << r.res.source.status.ToString();
  EXPECT_TRUE(r.dst.dev->Memory() == r.src.dev->Memory());
}

// The rule would switch over after the first round (a small device, a generous
// target), but the device hands its initial data over slowly: the switchover
// waits until all of it has been sent, as QEMU's switchover-ack does.
TEST(VfioMigration, TheSwitchoverWaitsForTheDevicesInitialData) {
  Pair r(kAll, 1 << 20);
  const uint64_t initial = 256 * (sizeof(fake::FakeRecord) + 4096);
  r.src.dev->faults.precopy_bytes_per_info = 200 << 10;
  r.Migrate();
  ASSERT_EQ(r.res.source.outcome, Outcome::kCompleted) << r.res.source.status.ToString();
  EXPECT_TRUE(r.dst.dev->Memory() == r.src.dev->Memory());
  EXPECT_GE(r.res.source.rounds.size(), initial / (200 << 10)) << "switched before the initial data was sent";
  EXPECT_NE(r.res.source.switchover_reason.find("converged"), std::string::npos) << r.res.source.switchover_reason;
}

TEST(VfioMigration, ADeviceThatUnderstatesItsPreCopySizeStillArrivesWhole) {
  Pair r(kAll, 1 << 20);
  r.src.dev->faults.lie_precopy_sizes = true;
  r.Migrate();
  ASSERT_EQ(r.res.source.outcome, Outcome::kCompleted) << r.res.source.status.ToString();
  EXPECT_TRUE(r.dst.dev->Memory() == r.src.dev->Memory());
}

TEST(VfioMigration, ReadErrorInPreCopyAbortsWithTheSourceRunning) {
  Pair r(kAll, 1 << 20);
  r.src.dev->faults.read_error_after_bytes = 100000;
  r.Migrate();
  r.ExpectAbortedWithSourceRunning("read of the migration data fd in PRE_COPY failed");
}

TEST(VfioMigration, ReadErrorInTheStunAbortsWithTheSourceRunning) {
  Pair r(VFIO_MIGRATION_STOP_COPY, 1 << 20);
  r.opt.source.stop_and_copy = true;
  r.src.dev->faults.read_error_after_bytes = 100000;
  r.Migrate();
  r.ExpectAbortedWithSourceRunning("read of the migration data fd in STOP_COPY failed");
}

TEST(VfioMigration, DestinationRefusingTheStreamAbortsBothSides) {
  Pair r(kAll, 1 << 20);
  r.dst.dev->faults.refuse_resume_stream = true;
  r.Migrate();
  r.ExpectAbortedWithSourceRunning("EINVAL");
  EXPECT_EQ(r.res.destination.outcome, Outcome::kAborted);
  EXPECT_EQ(r.dst.dev->state(), kStateStop) << "the destination discarded what it received";
  EXPECT_GE(r.dst.dev->resets(), 1) << "discarding is a reset, not just a return to STOP";
  EXPECT_EQ(r.src.dev->resets(), 0);
  EXPECT_NE(r.res.source.resolution.find("memory intact"), std::string::npos) << r.res.source.resolution;
}

TEST(VfioMigration, SourceArcIntoErrorIsResetAndRunsOn) {
  Pair r(kAll, 1 << 20);
  r.src.dev->faults.error_on_next_arc = true;  // RUNNING -> PRE_COPY
  r.Migrate();
  r.ExpectAbortedWithSourceRunning("SET MIG_DEVICE_STATE RUNNING -> PRE_COPY failed");
  EXPECT_EQ(r.src.dev->resets(), 1);
  // Out of ERROR only a reset leads, and a reset device starts from scratch: the
  // report must not claim the source kept its state.
  EXPECT_EQ(r.res.source.resolution.find("memory intact"), std::string::npos) << r.res.source.resolution;
  EXPECT_NE(r.res.source.resolution.find("was reset (VFIO_DEVICE_RESET)"), std::string::npos)
      << r.res.source.resolution;
}

TEST(VfioMigration, SourceArcThatFailsWithoutErrorReturnsToRunningIntact) {
  Pair r(kAll, 1 << 20);
  r.src.dev->faults.fail_next_arc = true;  // RUNNING -> PRE_COPY fails; the device stays RUNNING
  r.Migrate();
  r.ExpectAbortedWithSourceRunning("RUNNING -> PRE_COPY failed");
  EXPECT_EQ(r.src.dev->resets(), 0) << "no reset when the device can simply go back";
  EXPECT_NE(r.res.source.resolution.find("memory intact"), std::string::npos) << r.res.source.resolution;
}

// After Commit the destination may hold the only verified copy: a failed
// STOP -> RUNNING must not reset it unless the driver itself lost it.
TEST(VfioMigration, DestinationStartFailingAfterCommitKeepsTheVerifiedState) {
  Pair r(kAll, 1 << 20);
  r.opt.destination.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kCommitReceived) r.dst.dev->faults.fail_next_arc = true;
  };
  r.Migrate();
  EXPECT_EQ(r.res.destination.outcome, Outcome::kInDoubt) << r.res.destination.status.ToString();
  EXPECT_EQ(r.dst.dev->resets(), 0) << "the verified state was not thrown away";
  EXPECT_EQ(r.dst.dev->state(), kStateStop);
  EXPECT_TRUE(r.dst.dev->Memory() == r.src.dev->Memory()) << "the destination still holds the whole state";
  EXPECT_NE(r.res.destination.resolution.find("holds the complete, verified state"), std::string::npos)
      << r.res.destination.resolution;
}

TEST(VfioMigration, DestinationFallingIntoErrorAfterCommitSaysItsStateIsLost) {
  Pair r(kAll, 1 << 20);
  r.opt.destination.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kCommitReceived) r.dst.dev->faults.error_on_next_arc = true;
  };
  r.Migrate();
  EXPECT_EQ(r.res.destination.outcome, Outcome::kInDoubt) << r.res.destination.status.ToString();
  EXPECT_EQ(r.res.destination.resolution.find("holds the complete, verified state"), std::string::npos)
      << r.res.destination.resolution;
  EXPECT_NE(r.res.destination.resolution.find("is lost; resume the source"), std::string::npos)
      << r.res.destination.resolution;
}

TEST(VfioMigration, DestinationArcIntoErrorAbortsWithTheSourceRunning) {
  Pair r(kAll, 1 << 20);
  r.Migrate([&] { r.dst.dev->faults.error_on_next_arc = true; });  // STOP -> RESUMING
  r.ExpectAbortedWithSourceRunning("STOP -> RESUMING");
}

// An incremental checkpoint continues an earlier session; a streaming device's
// state is one stream per saving session, and a restore would play both parts
// into one RESUMING session: refused before anything moves.
TEST(VfioMigration, AContinuationOfAStreamingDeviceIsRefused) {
  Pair r(kAll, 1 << 20);
  r.opt.source.session_id = 42;
  SessionContinuation c;
  c.first_round = 3;
  c.frames_per_stream = {10};
  r.opt.source.continuation = c;
  r.opt.data_streams = 1;
  r.opt.destination.peer_timeout = std::chrono::seconds(2);  // the source refuses before its Hello
  r.Migrate();
  EXPECT_EQ(r.res.source.outcome, Outcome::kAborted);
  EXPECT_NE(r.res.source.status.message().find("cannot continue from an earlier checkpoint"), std::string::npos)
      << r.res.source.status.ToString();
  EXPECT_EQ(r.src.dev->state(), kStateRunning);
}

}  // namespace
}  // namespace gpumigrate::vfio
