// The session state machine on a scripted fake device: rounds, transitions,
// rollback and in-doubt outcomes, with exact expectations.
#include <gtest/gtest.h>

#include "gpumigrate/session/local_migration.h"
#include "tests/support/fake_device.h"

namespace gpumigrate {
namespace {

using testing::FakeDevice;
using namespace std::chrono_literals;

std::vector<RegionInfo> Layout(uint64_t b_size = 32 << 10) {
  return {RegionInfo{0, "a", 64 << 10, 4096, RegionHint::kStatic},
          RegionInfo{1, "b", b_size, 4096, RegionHint::kDynamic}};
}

struct Fixture {
  FakeDevice src{Layout(), DeviceState::kRunning};
  FakeDevice dst{Layout(), DeviceState::kStop};
  LocalMigrationOptions opt;
  Fixture() {
    for (uint64_t p = 0; p < 8; ++p) src.Touch(0, p, 1);
    for (uint64_t p = 0; p < 4; ++p) src.Touch(1, p, 2);
    // Never "converged": run exactly max_rounds pre-copy rounds, then switch.
    opt.source.downtime_target = 0ms;
    opt.source.max_rounds = 2;
    opt.source.max_stun = 10s;
    opt.source.peer_timeout = 10s;
    opt.destination.peer_timeout = 10s;
    opt.source.scrub = false;  // the source is compared with the destination afterwards (scrub_test.cc scrubs)
  }
  LocalMigrationResult Run() { return MigrateLocally(src, dst, opt); }
};

TEST(SessionStateMachine, RoundsSendExactlyTheDirtyPages) {
  Fixture f;
  f.src.on_sync = [&](int i) {
    if (i == 0) f.src.Touch(1, 5, 9);  // dirtied during round 0 -> round 1
    if (i == 1) f.src.Touch(0, 3, 7);  // dirtied during round 1 -> final round
    if (i == 2) f.src.Touch(1, 6, 4);  // found by the final sync, device stopped
  };
  auto res = f.Run();
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  ASSERT_EQ(res.destination.outcome, Outcome::kCompleted) << res.destination.status.ToString();
  EXPECT_EQ(f.src.transitions,
            (std::vector<DeviceState>{DeviceState::kPreCopy, DeviceState::kStopCopy, DeviceState::kStop}));
  EXPECT_EQ(f.dst.transitions,
            (std::vector<DeviceState>{DeviceState::kResuming, DeviceState::kStop, DeviceState::kRunning}));
  ASSERT_EQ(res.source.rounds.size(), 3u);
  EXPECT_EQ(res.source.rounds[0].pages_sent, 12u);
  EXPECT_EQ(res.source.rounds[0].zero_pages, 12u);  // 8 + 4 zero pages skipped
  EXPECT_EQ(res.source.rounds[0].dirty_bytes, (64u + 32u) << 10);
  EXPECT_EQ(res.source.rounds[1].pages_sent, 1u);
  EXPECT_EQ(res.source.rounds[1].dirty_bytes, 4096u);
  EXPECT_TRUE(res.source.rounds[2].final);
  EXPECT_EQ(res.source.rounds[2].pages_sent, 2u);
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0));
  EXPECT_EQ(f.dst.memory(1), f.src.memory(1));
  EXPECT_EQ(f.dst.loaded_state, f.src.state_blob);
  EXPECT_NE(res.source.switchover_reason.find("round limit 2"), std::string::npos) << res.source.switchover_reason;
  EXPECT_EQ(res.source.stun_breakdown_ms.size(), 6u);
}

TEST(SessionStateMachine, PageThatBecameZeroIsZeroedOnTheDestination) {
  Fixture f;
  f.src.on_sync = [&](int i) {
    if (i == 0) f.src.Touch(0, 2, 0);
  };
  auto res = f.Run();
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_EQ(res.source.rounds[1].zero_pages, 1u);
  EXPECT_EQ(res.source.rounds[1].pages_sent, 0u);
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0));
}

TEST(SessionStateMachine, FailedStopRollsTheSourceBackToRunning) {
  Fixture f;
  f.src.fail_transition_to = DeviceState::kStopCopy;
  auto res = f.Run();
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_NE(res.source.status.message().find("transition to STOP_COPY failed"), std::string::npos);
  EXPECT_EQ(StepName(res.source.failed_phase), "switchover: stop device");
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
  EXPECT_EQ(f.src.transitions, (std::vector<DeviceState>{DeviceState::kPreCopy, DeviceState::kRunning}));
  EXPECT_EQ(res.destination.outcome, Outcome::kAborted);
  EXPECT_EQ(f.dst.State(), DeviceState::kError);
}

TEST(SessionStateMachine, DestinationStateRejectedAbortsWithItsReason) {
  Fixture f;
  f.dst.fail_load_state = true;
  auto res = f.Run();
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_NE(res.source.status.message().find("blob rejected"), std::string::npos) << res.source.status.message();
  EXPECT_NE(res.source.status.message().find("destination aborted"), std::string::npos);
  // The source reached STOP (all read) before Prepare; rejected before Commit, it resumes.
  EXPECT_EQ(f.src.transitions, (std::vector<DeviceState>{DeviceState::kPreCopy, DeviceState::kStopCopy,
                                                         DeviceState::kStop, DeviceState::kRunning}));
  EXPECT_EQ(f.dst.State(), DeviceState::kError);
}

TEST(SessionStateMachine, DestinationWriteFailureAbortsAndNamesTheFrame) {
  Fixture f;
  f.dst.fail_writes = true;
  auto res = f.Run();
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_NE(res.source.status.message().find("out of device memory"), std::string::npos)
      << res.source.status.message();
  EXPECT_NE(res.destination.status.message().find("data stream 0, frame 0"), std::string::npos)
      << res.destination.status.message();
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
}

TEST(SessionStateMachine, RegionMismatchIsRefusedAtTheManifest) {
  FakeDevice src{Layout(), DeviceState::kRunning};
  FakeDevice dst{Layout(16 << 10), DeviceState::kStop};
  LocalMigrationOptions opt;
  auto res = MigrateLocally(src, dst, opt);
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_NE(res.source.status.message().find("region b does not fit"), std::string::npos)
      << res.source.status.message();
  EXPECT_EQ(src.State(), DeviceState::kRunning);
  EXPECT_TRUE(dst.transitions.empty() || dst.State() == DeviceState::kError);
}

TEST(SessionStateMachine, SourceMustBeRunning) {
  FakeDevice src{Layout(), DeviceState::kStop};
  FakeDevice dst{Layout(), DeviceState::kStop};
  LocalMigrationOptions opt;
  opt.destination.peer_timeout = 1s;
  auto res = MigrateLocally(src, dst, opt);
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_EQ(res.source.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(src.transitions.empty());
}

// The destination cannot resume after Commit: nobody resumes; the outcome is in
// doubt on both sides and the source keeps its state, stopped.
TEST(SessionStateMachine, FailureAfterCommitIsInDoubtOnBothSides) {
  Fixture f;
  f.dst.fail_transition_to = DeviceState::kRunning;
  auto res = f.Run();
  EXPECT_EQ(res.source.outcome, Outcome::kInDoubt);
  EXPECT_EQ(res.source.status.code(), StatusCode::kInDoubt);
  EXPECT_FALSE(res.source.resolution.empty());
  EXPECT_EQ(f.src.State(), DeviceState::kStop);
  EXPECT_EQ(res.destination.outcome, Outcome::kInDoubt);
  EXPECT_EQ(f.dst.State(), DeviceState::kStop);
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0));  // the source's state is intact and complete on both sides
}

}  // namespace
}  // namespace gpumigrate
