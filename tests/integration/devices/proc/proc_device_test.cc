// The proc device's lifecycle against the real shim in this process: pausing at
// a write-section boundary, what happens when gpumigrate goes away at each point,
// release, clear errors, and whole migrations compared page for page.
#include <unistd.h>

#include <gtest/gtest.h>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/proc.h"
#include "tests/integration/devices/proc/in_process_workload.h"
#include "tests/support/fake_device.h"

namespace gpumigrate::testing {
namespace {

using namespace std::chrono_literals;

// Whether the writers make progress within `within`.
bool Advances(const InProcessWorkload& w, std::chrono::milliseconds within = 2000ms) {
  uint64_t before = w.writes();
  auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (w.writes() > before) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

bool StaysStill(const InProcessWorkload& w) {
  uint64_t before = w.writes();
  std::this_thread::sleep_for(200ms);
  return w.writes() == before;
}

std::unique_ptr<ProcDevice> ConnectSelf(ProcRole role = ProcRole::kSource,
                                        ProcTracking tracking = ProcTracking::kAuto) {
  auto dev = ProcDevice::Connect(ProcSpec{getpid(), tracking, 0}, role);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  return dev.ok() ? std::move(dev).value() : nullptr;
}

TEST(ProcDevice, StopCopyPausesTheWorkloadAndRunningResumesIt) {
  InProcessWorkload w(MemKind::kAnon, 4u << 20);
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  w.StartWriters(2);
  auto dev = ConnectSelf();
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(dev->SetState(DeviceState::kPreCopy).ok());
  EXPECT_TRUE(Advances(w));
  ASSERT_TRUE(dev->SetState(DeviceState::kStopCopy).ok());
  EXPECT_TRUE(StaysStill(w));
  ASSERT_TRUE(dev->SetState(DeviceState::kRunning).ok());
  EXPECT_TRUE(Advances(w));
}

TEST(ProcDevice, EngineGoneBeforeStopLetsTheWorkloadRunOn) {
  InProcessWorkload w(MemKind::kAnon, 4u << 20);
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  w.StartWriters(1);
  auto dev = ConnectSelf();
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(dev->SetState(DeviceState::kPreCopy).ok());
  ASSERT_TRUE(dev->Tracker()->Start().ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStopCopy).ok());
  ASSERT_TRUE(StaysStill(w));
  dev.reset();  // the socket closes as if gpumigrate were killed
  EXPECT_TRUE(Advances(w)) << "the workload was left stopped";
}

TEST(ProcDevice, EngineGoneAfterStopHoldsTheWorkloadUntilResumed) {
  InProcessWorkload w(MemKind::kAnon, 4u << 20);
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  w.StartWriters(1);
  auto dev = ConnectSelf();
  ASSERT_NE(dev, nullptr);
  ASSERT_TRUE(dev->SetState(DeviceState::kPreCopy).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStopCopy).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStop).ok());
  dev.reset();
  EXPECT_TRUE(StaysStill(w)) << "in doubt, the source must not run on by itself";
  auto again = ConnectSelf();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->State(), DeviceState::kStop);
  ASSERT_TRUE(again->SetState(DeviceState::kRunning).ok());
  EXPECT_TRUE(Advances(w));
}

TEST(ProcDevice, ReleaseTellsTheWorkloadItMoved) {
  InProcessWorkload w(MemKind::kAnon, 4u << 20);
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  auto dev = ConnectSelf();
  ASSERT_NE(dev, nullptr);
  EXPECT_FALSE(dev->Release().ok()) << "release of a running source";
  ASSERT_TRUE(dev->SetState(DeviceState::kStopCopy).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStop).ok());
  ASSERT_TRUE(dev->Release().ok());
  EXPECT_EQ(gm_shim_released(), 1);
  EXPECT_EQ(gm_shim_enter(), -ESHUTDOWN);
  EXPECT_FALSE(dev->SetState(DeviceState::kRunning).ok()) << "a released source must not resume";
}

TEST(ProcDevice, ClearErrorsForTheWrongProcessOrRole) {
  auto none = ProcDevice::Connect(ProcSpec{getpid(), ProcTracking::kAuto, 0}, ProcRole::kSource);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("serves no gpumigrate shim"), std::string::npos) << none.status().message();
  auto gone = ProcDevice::Connect(ProcSpec{999999999, ProcTracking::kAuto, 0}, ProcRole::kSource);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("does not exist"), std::string::npos) << gone.status().message();

  InProcessWorkload w(MemKind::kAnon, 1u << 20);
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  auto wrong = ProcDevice::Connect(ProcSpec{getpid(), ProcTracking::kAuto, 0}, ProcRole::kDestination);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("not a destination waiting to adopt"), std::string::npos)
      << wrong.status().message();
}

FakeDevice DestinationFor(const Device& src) { return FakeDevice(src.Regions(), DeviceState::kStop); }

struct Case {
  ProcTracking tracker;
  MemKind mem;
};

class ProcMigrationTest : public ::testing::TestWithParam<Case> {};

// A whole migration with the writers running throughout pre-copy: once both sides
// are stopped, the destination's memory equals the source's, page for page.
TEST_P(ProcMigrationTest, DestinationEqualsTheSourceAtStop) {
  if (std::string why = KernelLacks(GetParam().tracker); !why.empty()) GTEST_SKIP() << why;
  InProcessWorkload w(GetParam().mem, 16u << 20);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  w.StartWriters(2);
  auto src = ConnectSelf(ProcRole::kSource, GetParam().tracker);
  ASSERT_NE(src, nullptr);
  FakeDevice dst = DestinationFor(*src);
  LocalMigrationOptions o;
  o.data_streams = 2;
  o.source.max_rounds = 4;
  o.source.switch_when_not_converging = true;
  o.source.scrub = false;  // the source is compared with the destination afterwards
  uint64_t writes_at_start = 0, writes_at_stop = 0;
  o.source.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundStart && round == 0) {
      // Tracking is armed; on two shared cores under ASan the writers may not be
      // scheduled during a short round, so give them their writes here, bounded.
      writes_at_start = w.writes();
      auto until = std::chrono::steady_clock::now() + 10s;
      while (w.writes() < writes_at_start + 500 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(1ms);
      }
    }
    if (p == Phase::kSwitchover) writes_at_stop = w.writes();
  };
  auto res = MigrateLocally(*src, dst, o);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_TRUE(res.source.verified);
  EXPECT_EQ(src->State(), DeviceState::kStop);
  EXPECT_GT(res.source.rounds.size(), 1u);
  EXPECT_GT(writes_at_stop, writes_at_start + 100) << "the writers hardly ran during pre-copy";
  ASSERT_TRUE(StaysStill(w)) << "the source must stay paused after the switchover";
  const auto& got = dst.memory(0);
  uint64_t bad = 0, first = 0;
  for (uint64_t p = 0; p < w.size() / 4096; ++p) {
    if (std::memcmp(got.data() + p * 4096, w.mem() + p * 4096, 4096) != 0 && bad++ == 0) first = p;
  }
  EXPECT_EQ(bad, 0u) << "first differing page " << first;
  ASSERT_TRUE(src->Release().ok());
}

INSTANTIATE_TEST_SUITE_P(AllTrackers, ProcMigrationTest,
                         ::testing::Values(Case{ProcTracking::kPagemapScan, MemKind::kMemfd},
                                           Case{ProcTracking::kPagemapScan, MemKind::kThp},
                                           Case{ProcTracking::kSyncWp, MemKind::kAnon},
                                           Case{ProcTracking::kHash, MemKind::kMemfd}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           std::string name(ProcTrackingName(i.param.tracker));
                           for (auto& c : name) c = c == '-' ? '_' : c;
                           return name + "_" + MemKindName(i.param.mem);
                         });

// After a completed migration the released source's memory is zeroed by its
// shim (memfd: holes punched; private memory: dropped), so the next tenant of
// that memory cannot read it; the destination keeps its copy.
TEST(ProcMigration, ACompletedMigrationZeroesTheReleasedSource) {
  for (MemKind kind : {MemKind::kMemfd, MemKind::kAnon}) {
    SCOPED_TRACE(MemKindName(kind));
    InProcessWorkload w(kind, 4u << 20);
    ASSERT_TRUE(w.ok());
    ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
    auto src = ConnectSelf();
    ASSERT_NE(src, nullptr);
    FakeDevice dst = DestinationFor(*src);
    auto res = MigrateLocally(*src, dst, LocalMigrationOptions{});
    ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
    EXPECT_TRUE(res.source.scrubbed) << res.source.scrub;
    uint64_t nonzero = 0;
    for (size_t i = 0; i < w.size(); ++i) nonzero += w.mem()[i] != std::byte{0};
    EXPECT_EQ(nonzero, 0u) << "bytes of the workload left in the released source";
    EXPECT_EQ(dst.memory(0)[0], std::byte{0x5a}) << "the destination's copy";
  }
}

// The shim stops serving mid pre-copy (the workload shut it down, or it died):
// the migration ends with a clear error and the destination discards.
TEST(ProcMigration, ShimGoneDuringPreCopyAbortsClearly) {
  InProcessWorkload w(MemKind::kAnon, 8u << 20);
  ASSERT_EQ(gm_shim_start(), 0) << gm_shim_last_error();
  w.StartWriters(1);
  auto src = ConnectSelf();
  ASSERT_NE(src, nullptr);
  FakeDevice dst = DestinationFor(*src);
  LocalMigrationOptions o;
  o.source.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundEnd && round == 0) {
      w.StopWriters();
      gm_shim_shutdown();
    }
  };
  auto res = MigrateLocally(*src, dst, o);
  ASSERT_EQ(res.source.outcome, Outcome::kAborted);
  const std::string& m = res.source.status.message();
  EXPECT_TRUE(m.find("no longer registered") != std::string::npos || m.find("closed its socket") != std::string::npos)
      << m;
  EXPECT_EQ(res.destination.outcome, Outcome::kAborted);
  EXPECT_EQ(dst.State(), DeviceState::kError);
}

}  // namespace
}  // namespace gpumigrate::testing
