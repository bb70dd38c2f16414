// Abort a migration at each phase and check docs/design.md's outcome rules: before
// Prepared the source is RUNNING with its memory intact and the destination
// discards; after Prepared the outcome is in doubt with both sides stopped.
#include <gtest/gtest.h>

#include <thread>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "tests/fault/support_source_intact.h"
#include "transport/net/fault_stream.h"

namespace gpumigrate {
namespace {

using testing::ExpectSourceRunningAndIntact;
using testing::WeightsHash;
using namespace std::chrono_literals;

constexpr const char* kSpec = "sim:size=16MiB,hot=1MiB,kv_rate=32MiB/s,page=16KiB,step=2ms,layers=8";

struct Faulty {
  SimSpec spec = *ParseSimSpec(kSpec);
  std::unique_ptr<SimDevice> src = *SimDevice::Create(spec, SimRole::kSource);
  std::unique_ptr<SimDevice> dst = *SimDevice::Create(spec, SimRole::kDestination);
  LocalMigrationOptions opt;
  SessionStreams src_streams, dst_streams;
  uint64_t weights = 0;
  Faulty() {
    std::this_thread::sleep_for(10ms);
    weights = WeightsHash(*src);
    opt.source.bandwidth_limit_bytes_per_s = 100e6;  // a few rounds
    opt.source.downtime_target = 5ms;
    opt.source.peer_timeout = 10s;
    opt.destination.peer_timeout = 10s;
    opt.on_streams = [this](const SessionStreams& s, const SessionStreams& d) {
      src_streams = s;
      dst_streams = d;
    };
  }
  // Cuts a data stream of the source at byte `at`.
  void CutDataAt(uint64_t at) {
    opt.wrap_source_end = [at](std::unique_ptr<Stream> s, int index) -> std::unique_ptr<Stream> {
      if (index != 0) return s;
      return std::make_unique<FaultStream>(std::move(s), FaultPlan{.cut_at_byte = at});
    };
  }
  // A partition of the control channel from `phase` on: the source's messages
  // are accepted and never delivered; nothing is closed. Short timeouts end it.
  void PartitionControlAt(Phase phase) {
    opt.wrap_source_end = [this](std::unique_ptr<Stream> s, int index) -> std::unique_ptr<Stream> {
      if (index != -1) return s;
      auto fs = std::make_unique<FaultStream>(std::move(s), FaultPlan{});
      control_ = fs.get();
      return fs;
    };
    opt.source.on_phase = [this, phase](Phase p, uint32_t) {
      if (p == phase) control_->Blackhole();
    };
    opt.source.peer_timeout = 500ms;
    opt.destination.peer_timeout = 1s;
  }
  FaultStream* control_ = nullptr;

  void ExpectAborted(const LocalMigrationResult& res) {
    EXPECT_EQ(res.source.outcome, Outcome::kAborted);
    EXPECT_FALSE(res.source.status.ok());
    EXPECT_NE(res.source.failed_phase.step, Step::kNone);
    EXPECT_EQ(res.destination.outcome, Outcome::kAborted);
    EXPECT_EQ(dst->State(), DeviceState::kError) << "the destination must discard";
    ExpectSourceRunningAndIntact(*src, weights);
  }
};

TEST(AbortPhases, BeforeRoundZero) {
  Faulty f;
  f.CutDataAt(0);
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
  EXPECT_EQ(StepName(res.source.failed_phase), "pre-copy round 0");
  EXPECT_NE(res.source.status.message().find("cut at byte 0"), std::string::npos) << res.source.status.message();
}

TEST(AbortPhases, ControlChannelLostBeforeRoundZero) {
  Faulty f;
  f.opt.source.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundStart && round == 0) f.src_streams.control->Close();
  };
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
}

TEST(AbortPhases, MidRound) {
  Faulty f;
  f.CutDataAt(3 << 20);
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
  EXPECT_EQ(StepName(res.source.failed_phase), "pre-copy round 0");
  EXPECT_GT(res.source.bytes_sent, 2u << 20);
}

TEST(AbortPhases, MidFrame) {
  Faulty f;
  f.CutDataAt(48 + 1000);  // inside the first frame's payload
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
  EXPECT_NE(res.destination.status.message().find("data stream 0, frame 0"), std::string::npos)
      << res.destination.status.message();
}

TEST(AbortPhases, MidLaterRound) {
  Faulty f;
  f.opt.source.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundStart && round == 1) f.src_streams.data[0]->Close();
  };
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
}

TEST(AbortPhases, DuringFinalCopyWhileStopped) {
  Faulty f;
  f.opt.source.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kSwitchover) f.src_streams.data[0]->Close();
  };
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
  EXPECT_TRUE(IsSwitchoverStep(res.source.failed_phase.step)) << StepName(res.source.failed_phase);
}

TEST(AbortPhases, AtSwitchoverBeforePrepared) {
  Faulty f;
  // A partition while the device is stopped: Prepare never arrives, no reply comes.
  f.PartitionControlAt(Phase::kSwitchover);
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
  EXPECT_EQ(StepName(res.source.failed_phase), "switchover: prepare");
  EXPECT_NE(res.source.status.message().find("timed out waiting for Prepared"), std::string::npos)
      << res.source.status.message();
}

// The connection is cut right after Prepare: depending on whether Prepared was
// already on its way, the source aborts (and runs) or is in doubt (and stays
// stopped). Either way there is never a split brain: the destination never runs.
TEST(AbortPhases, CutAfterPrepareNeverSplitsTheBrain) {
  for (int i = 0; i < 3; ++i) {
    Faulty f;
    f.opt.source.on_phase = [&](Phase p, uint32_t) {
      if (p == Phase::kPrepareSent) f.src_streams.control->Close();
    };
    auto res = MigrateLocally(*f.src, *f.dst, f.opt);
    EXPECT_NE(f.dst->State(), DeviceState::kRunning);
    EXPECT_NE(res.destination.outcome, Outcome::kCompleted);
    if (res.source.outcome == Outcome::kAborted) {
      EXPECT_EQ(StepName(res.source.failed_phase), "switchover: prepare");
      ExpectSourceRunningAndIntact(*f.src, f.weights);
    } else {
      ASSERT_EQ(res.source.outcome, Outcome::kInDoubt);
      EXPECT_EQ(f.src->State(), DeviceState::kStop);
      auto check = f.src->SelfCheck();
      EXPECT_TRUE(check.ok()) << check.status().ToString();
    }
  }
}

TEST(AbortPhases, DestinationLostBeforeAnsweringPrepare) {
  Faulty f;
  f.opt.destination.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kPrepareReceived) f.dst_streams.control->Close();
  };
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
}

TEST(AbortPhases, CancelledByTheUser) {
  Faulty f;
  std::atomic<bool> cancel{false};
  f.opt.source.cancel = &cancel;
  f.opt.source.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundStart && round == 1) cancel = true;
  };
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  f.ExpectAborted(res);
  EXPECT_NE(res.source.status.message().find("cancelled by the user"), std::string::npos);
}

TEST(AbortPhases, BetweenCommitAndRunningIsInDoubtWithBothStopped) {
  Faulty f;
  // A partition right after Prepared: Commit never arrives, nothing is closed.
  f.PartitionControlAt(Phase::kPreparedReceived);
  auto res = MigrateLocally(*f.src, *f.dst, f.opt);
  EXPECT_EQ(res.source.outcome, Outcome::kInDoubt) << res.source.status.ToString();
  EXPECT_EQ(res.source.status.code(), StatusCode::kInDoubt);
  EXPECT_NE(res.source.resolution.find("resume the source"), std::string::npos);
  EXPECT_EQ(res.destination.outcome, Outcome::kInDoubt) << res.destination.status.ToString();
  // Both stopped: nobody runs the workload.
  EXPECT_EQ(f.src->State(), DeviceState::kStop);
  EXPECT_EQ(f.dst->State(), DeviceState::kStop);
  uint64_t ks = f.src->KernelsRun(), kd = f.dst->KernelsRun();
  std::this_thread::sleep_for(30ms);
  EXPECT_EQ(f.src->KernelsRun(), ks);
  EXPECT_EQ(f.dst->KernelsRun(), kd);
  // The source's state is intact: it passes its own check, and an operator can resume it.
  auto check = f.src->SelfCheck();
  EXPECT_TRUE(check.ok()) << check.status().ToString();
  // The destination, too, holds the complete verified state (it could be confirmed instead).
  auto dcheck = f.dst->SelfCheck();
  EXPECT_TRUE(dcheck.ok()) << dcheck.status().ToString();
  ASSERT_TRUE(f.src->SetState(DeviceState::kRunning).ok());
  ExpectSourceRunningAndIntact(*f.src, f.weights);
}

}  // namespace
}  // namespace gpumigrate
