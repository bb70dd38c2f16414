// Deadlines on a whole session (two in-process sides over pipes), as users meet
// them: a destination that is slow but gets work done is waited for however
// long it takes; one that is alive but stuck is given up after the peer
// timeout; one that goes silent is detected within the silence timeout, not the
// (much longer) peer timeout. Before Prepared every failure leaves the source
// running and intact.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "tests/fault/support_source_intact.h"
#include "tests/support/fake_device.h"
#include "transport/net/fault_stream.h"

namespace gpumigrate {
namespace {

using testing::FakeDevice;
using namespace std::chrono_literals;

std::vector<RegionInfo> Layout() { return {RegionInfo{0, "a", 64 << 10, 4096, RegionHint::kDynamic}}; }

struct Fakes {
  FakeDevice src{Layout(), DeviceState::kRunning};
  FakeDevice dst{Layout(), DeviceState::kStop};
  LocalMigrationOptions opt;
  Fakes() {
    for (uint64_t p = 0; p < 16; ++p) src.Touch(0, p, static_cast<uint8_t>(p + 1));
    opt.source.max_frame_payload_bytes = 4096;  // a frame per page: the destination's progress shows per page
    for (auto* o : {&opt.source.keepalive_interval, &opt.destination.keepalive_interval}) *o = 50ms;
    for (auto* o : {&opt.source.peer_silence_timeout, &opt.destination.peer_silence_timeout}) *o = 2s;
  }
};

TEST(LivenessFaults, ASlowDestinationThatGetsWorkDoneIsNotCutOff) {
  Fakes f;
  f.dst.write_delay = 150ms;  // 16 pages: 2.4 s to apply round 0, more than twice the peer timeout
  f.opt.source.scrub = false;  // compared below
  f.opt.source.peer_timeout = 1s;
  f.opt.destination.peer_timeout = 1s;
  auto res = MigrateLocally(f.src, f.dst, f.opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  ASSERT_EQ(res.destination.outcome, Outcome::kCompleted) << res.destination.status.ToString();
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0));
  EXPECT_GT(res.source.total_ms, 2000.0) << "the destination was not as slow as the test meant";
}

TEST(LivenessFaults, ADestinationAliveButStuckIsGivenUpAfterThePeerTimeout) {
  Fakes f;
  f.dst.write_delay = 6s;  // the first write hangs (its keepalives go on)
  f.opt.source.peer_timeout = 1s;
  f.opt.destination.peer_timeout = 30s;
  const auto t0 = std::chrono::steady_clock::now();
  auto res = MigrateLocally(f.src, f.dst, f.opt);
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_EQ(res.source.status.code(), StatusCode::kDeadlineExceeded) << res.source.status.ToString();
  EXPECT_NE(res.source.status.message().find("the destination is alive but made no progress"), std::string::npos)
      << res.source.status.message();
  EXPECT_NE(res.source.status.message().find("pre-copy round 0"), std::string::npos)
      << "the error should say what the destination last said it was doing: " << res.source.status.message();
  EXPECT_EQ(f.src.State(), DeviceState::kRunning);
  EXPECT_EQ(res.destination.outcome, Outcome::kAborted);
  // Bounded by the stuck write (6 s), not the destination's 30 s.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 20s);
}

struct Sim {
  SimSpec spec = *ParseSimSpec("sim:size=16MiB,hot=1MiB,kv_rate=32MiB/s,page=16KiB,step=2ms,layers=8");
  std::unique_ptr<SimDevice> src = *SimDevice::Create(spec, SimRole::kSource);
  std::unique_ptr<SimDevice> dst = *SimDevice::Create(spec, SimRole::kDestination);
  LocalMigrationOptions opt;
  FaultStream* control = nullptr;
  uint64_t weights = 0;
  Sim() {
    std::this_thread::sleep_for(10ms);
    weights = testing::WeightsHash(*src);
    opt.source.bandwidth_limit_bytes_per_s = 100e6;
    opt.source.downtime_target = 5ms;
    opt.wrap_source_end = [this](std::unique_ptr<Stream> s, int index) -> std::unique_ptr<Stream> {
      if (index != -1) return s;
      auto fs = std::make_unique<FaultStream>(std::move(s), FaultPlan{});
      control = fs.get();
      return fs;
    };
  }
  // Keepalives every 100 ms, a 60 s peer timeout on both sides, these silence timeouts.
  void Limits(std::chrono::nanoseconds source_silence, std::chrono::nanoseconds destination_silence) {
    for (auto* o : {&opt.source.peer_timeout, &opt.destination.peer_timeout}) *o = 60s;
    for (auto* o : {&opt.source.keepalive_interval, &opt.destination.keepalive_interval}) *o = 100ms;
    opt.source.peer_silence_timeout = source_silence;
    opt.destination.peer_silence_timeout = destination_silence;
  }
};

// The source stops hearing the destination (its packets vanish) but nothing is
// closed: the silence timeout ends the wait, long before the peer timeout.
TEST(LivenessFaults, ASilentDestinationIsDetectedWithinTheSilenceTimeout) {
  for (Phase at : {Phase::kRoundStart, Phase::kSwitchover}) {
    SCOPED_TRACE(std::string(PhaseName(at)));
    Sim s;
    s.Limits(1s, 10s);
    bool fired = false;
    s.opt.source.on_phase = [&](Phase p, uint32_t) {
      if (p == at && !fired) {
        fired = true;
        s.control->Deafen();
      }
    };
    const auto t0 = std::chrono::steady_clock::now();
    auto res = MigrateLocally(*s.src, *s.dst, s.opt);
    const auto took = std::chrono::steady_clock::now() - t0;
    ASSERT_TRUE(fired);
    EXPECT_EQ(res.source.outcome, Outcome::kAborted) << res.source.status.ToString();
    EXPECT_EQ(res.source.status.code(), StatusCode::kDeadlineExceeded) << res.source.status.ToString();
    EXPECT_NE(res.source.status.message().find("the destination has been silent"), std::string::npos)
        << res.source.status.message();
    EXPECT_LT(took, 15s) << "detected by the 60 s peer timeout, not the 1 s silence timeout";
    testing::ExpectSourceRunningAndIntact(*s.src, s.weights);
    // Prepared may have left before the source went deaf: then the destination,
    // prepared, stays in doubt (it never runs on its own).
    EXPECT_TRUE(res.destination.outcome == Outcome::kAborted ||
                (at == Phase::kSwitchover && res.destination.outcome == Outcome::kInDoubt))
        << res.destination.status.ToString();
    EXPECT_NE(s.dst->State(), DeviceState::kRunning);
  }
}

// The destination stops hearing the source after Prepared: in doubt, both
// stopped, found by silence rather than by the peer timeout.
TEST(LivenessFaults, ASourceSilentAfterPreparedLeavesBothInDoubtWithinTheSilenceTimeout) {
  Sim s;
  s.Limits(1s, 1s);
  s.opt.source.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kPreparedReceived) {
      s.control->Blackhole();
      s.control->Deafen();
    }
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto res = MigrateLocally(*s.src, *s.dst, s.opt);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 15s)
      << "source " << res.source.total_ms << " ms: " << res.source.status.ToString() << "; destination "
      << res.destination.total_ms << " ms: " << res.destination.status.ToString();
  EXPECT_EQ(res.source.outcome, Outcome::kInDoubt) << res.source.status.ToString();
  EXPECT_EQ(res.destination.outcome, Outcome::kInDoubt) << res.destination.status.ToString();
  // The destination's watchdog, or the source closing its streams once it is in
  // doubt itself, whichever comes first (TSan's timing shows the second).
  const std::string& why = res.destination.status.message();
  EXPECT_TRUE(why.find("the source has been silent") != std::string::npos ||
              why.find("the source closed the connection") != std::string::npos)
      << why;
  EXPECT_EQ(s.src->State(), DeviceState::kStop);
  EXPECT_EQ(s.dst->State(), DeviceState::kStop);
}

}  // namespace
}  // namespace gpumigrate
