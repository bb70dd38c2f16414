// Scrubbing a released source after a completed migration (Device::Scrub): when
// it is due (completed and released), when not (rolled back, in doubt, resumed,
// held, --no-scrub), and what the report says, on a scripted fake device.
#include <algorithm>

#include <gtest/gtest.h>

#include "gpumigrate/session/local_migration.h"
#include "tests/support/fake_device.h"

namespace gpumigrate {
namespace {

using testing::FakeDevice;
using namespace std::chrono_literals;

std::vector<RegionInfo> Layout() { return {RegionInfo{0, "a", 64 << 10, 4096, RegionHint::kDynamic}}; }

bool AllZero(const std::vector<std::byte>& m) {
  return std::all_of(m.begin(), m.end(), [](std::byte b) { return b == std::byte{0}; });
}

struct Fixture {
  FakeDevice src{Layout(), DeviceState::kRunning};
  FakeDevice dst{Layout(), DeviceState::kStop};
  LocalMigrationOptions opt;
  Fixture() {
    for (uint64_t p = 0; p < 16; ++p) src.Touch(0, p, static_cast<uint8_t>(p + 1));
    opt.source.peer_timeout = 10s;
    opt.destination.peer_timeout = 10s;
  }
  LocalMigrationResult Run() { return MigrateLocally(src, dst, opt); }
};

TEST(Scrub, ACompletedReleasedSourceIsZeroedAfterTheStun) {
  Fixture f;
  auto res = f.Run();
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_EQ(f.src.scrubs, 1);
  EXPECT_TRUE(AllZero(f.src.memory(0))) << "the source still holds the workload's data";
  EXPECT_FALSE(AllZero(f.dst.memory(0))) << "the destination's copy must not be touched";
  EXPECT_TRUE(res.source.scrubbed);
  EXPECT_NE(res.source.scrub.find("zeroed"), std::string::npos) << res.source.scrub;
  EXPECT_EQ(f.dst.scrubs, 0);
  // After the stun: not one of its phases.
  for (const auto& [phase, ms] : res.source.stun_breakdown_ms.Phases()) EXPECT_EQ(phase.find("scrub"), std::string::npos);
  const std::string json = ReportToJson(res.source);
  EXPECT_NE(json.find("\"scrubbed\":true"), std::string::npos) << json;
}

TEST(Scrub, NoScrubLeavesTheSourceAndSaysSo) {
  Fixture f;
  f.opt.source.scrub = false;
  auto res = f.Run();
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_EQ(f.src.scrubs, 0);
  EXPECT_EQ(f.dst.memory(0), f.src.memory(0));
  EXPECT_FALSE(res.source.scrubbed);
  EXPECT_NE(res.source.scrub.find("--no-scrub"), std::string::npos) << res.source.scrub;
  EXPECT_NE(ReportToJson(res.source).find("\"scrubbed\":false"), std::string::npos);
}

TEST(Scrub, ASourceThatRunsOnOrIsHeldIsNeverScrubbed) {
  for (SourceFate fate : {SourceFate::kResume, SourceFate::kStop}) {
    Fixture f;
    f.opt.source.fate = fate;
    auto res = f.Run();
    ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
    EXPECT_EQ(f.src.scrubs, 0) << SourceFateName(fate);
    EXPECT_TRUE(res.source.scrub.empty()) << res.source.scrub;
    EXPECT_EQ(f.dst.memory(0), f.src.memory(0));
  }
}

TEST(Scrub, ARolledBackOrInDoubtSourceIsNeverScrubbed) {
  {
    Fixture f;
    f.dst.fail_load_state = true;  // refused before Prepared: rolled back
    auto res = f.Run();
    ASSERT_EQ(res.source.outcome, Outcome::kAborted);
    EXPECT_EQ(f.src.scrubs, 0);
    EXPECT_FALSE(AllZero(f.src.memory(0)));
  }
  {
    Fixture f;
    f.dst.fail_transition_to = DeviceState::kRunning;  // after Commit: in doubt
    auto res = f.Run();
    ASSERT_EQ(res.source.outcome, Outcome::kInDoubt);
    EXPECT_EQ(f.src.scrubs, 0);
    EXPECT_FALSE(AllZero(f.src.memory(0)));
  }
}

TEST(Scrub, AScrubThatFailsIsReportedAndTheMigrationStillCompleted) {
  Fixture f;
  f.src.scrub_fails = Unimplemented("fake: this device cannot zero its memory");
  auto res = f.Run();
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_FALSE(res.source.scrubbed);
  EXPECT_NE(res.source.scrub.find("not scrubbed: fake: this device cannot zero its memory"), std::string::npos)
      << res.source.scrub;
}

}  // namespace
}  // namespace gpumigrate
