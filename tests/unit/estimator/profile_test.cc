// The dry run's measurements with a fake clock and a scripted device: W(t) is
// known exactly.
#include <gtest/gtest.h>

#include "gpumigrate/estimator/estimator.h"
#include "tests/support/fake_device.h"

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;
using testing::FakeDevice;

// A dry run of `sample` syncing every 10 ms, `pages` sampled per region.
SampleOptions SyncEvery10ms(std::chrono::nanoseconds sample, uint32_t pages) {
  SampleOptions opt;
  opt.sample = sample;
  opt.interval = 10ms;
  opt.pages_sampled_per_region = pages;
  return opt;
}

TEST(ProfileDevice, MeasuresTheWorkingSetCurveExactly) {
  FakeDevice dev({RegionInfo{0, "static", 64 * 4096, 4096, RegionHint::kStatic},
                  RegionInfo{1, "dynamic", 64 * 4096, 4096, RegionHint::kDynamic}},
                 DeviceState::kRunning);
  for (uint64_t p = 0; p < 32; ++p) dev.Touch(0, p, 1);  // half the static region holds data
  // Every 10 ms interval: one page of a 4-page hot set, and one new appended page.
  dev.on_sync = [&](int i) {
    dev.Touch(1, static_cast<uint64_t>(i) % 4, 7);
    dev.Touch(1, 8 + static_cast<uint64_t>(i), 9);
  };
  FakeClock clock;
  auto prof = ProfileDevice(dev, SyncEvery10ms(160ms, 64), clock);
  ASSERT_TRUE(prof.ok()) << prof.status().ToString();
  EXPECT_EQ(prof->syncs, 16u);
  EXPECT_DOUBLE_EQ(prof->sample_s, 0.16);
  EXPECT_DOUBLE_EQ(prof->regions[0].nonzero_fraction, 0.5);
  EXPECT_EQ(prof->device_state_bytes, 3u);

  const WorkingSetCurve& stat = prof->regions[0].dirty;
  const WorkingSetCurve& dyn = prof->regions[1].dirty;
  ASSERT_EQ(dyn.window_s.size(), 5u);  // windows of 1, 2, 4, 8 and 16 syncs
  for (size_t j = 0; j < 5; ++j) {
    double n = static_cast<double>(1u << j);
    EXPECT_DOUBLE_EQ(dyn.window_s[j], 0.01 * n);
    double pages = std::min(4.0, n) + n;  // distinct hot pages + appended pages
    EXPECT_DOUBLE_EQ(dyn.low_bytes[j], pages * 4096) << "window " << j;
    EXPECT_DOUBLE_EQ(dyn.high_bytes[j], pages * 4096) << "window " << j;
    EXPECT_DOUBLE_EQ(stat.mid_bytes[j], 0);
  }
  EXPECT_EQ(dev.State(), DeviceState::kRunning) << "a dry run only observes";
}

// A workload writing in bursts: 4 new pages in each of the first 4 syncs of
// every 20. Windows of 16 syncs laid end to end ([0,16), [16,32)) each hold a
// whole burst; one placed a quarter further ([4,20)) falls in the pause. The
// sample holds only two such windows, so they are placed at four offsets and
// the pause is seen.
TEST(ProfileDevice, LongWindowsArePlacedAtSeveralOffsetsAndSeeAPause) {
  FakeDevice dev({RegionInfo{0, "kv", 256 * 4096, 4096, RegionHint::kDynamic}}, DeviceState::kRunning);
  uint64_t next_page = 0;
  dev.on_sync = [&](int i) {
    if (i % 20 < 4) {
      for (int k = 0; k < 4; ++k) dev.Touch(0, next_page++, 1);
    }
  };
  FakeClock clock;
  auto prof = ProfileDevice(dev, SyncEvery10ms(320ms, 16), clock);
  ASSERT_TRUE(prof.ok()) << prof.status().ToString();
  const WorkingSetCurve& c = prof->regions[0].dirty;
  ASSERT_EQ(c.window_s.size(), 6u);  // 1 to 32 syncs
  EXPECT_DOUBLE_EQ(c.window_s[4], 0.16);
  EXPECT_DOUBLE_EQ(c.high_bytes[4], 16 * 4096.0) << "a window on a burst";
  EXPECT_DOUBLE_EQ(c.low_bytes[4], 0) << "the window placed in the pause";
  // Windows of 4 syncs: the sample holds 8, laid end to end only: [0,4) and
  // [20,24) are bursts, [4,8) ... pauses.
  EXPECT_DOUBLE_EQ(c.high_bytes[2], 16 * 4096.0);
  EXPECT_DOUBLE_EQ(c.low_bytes[2], 0);
  EXPECT_DOUBLE_EQ(c.mid_bytes[2], 0);
}

// What one sync of every region costs: the switchover's final sync costs as much.
TEST(ProfileDevice, TimesTheDirtySyncs) {
  FakeDevice dev({RegionInfo{0, "a", 16 * 4096, 4096, RegionHint::kDynamic}}, DeviceState::kRunning);
  FakeClock clock;
  dev.on_sync = [&](int i) { clock.Advance(std::chrono::microseconds(i % 2 == 0 ? 3000 : 5000)); };
  auto prof = ProfileDevice(dev, SyncEvery10ms(100ms, 16), clock);
  ASSERT_TRUE(prof.ok()) << prof.status().ToString();
  EXPECT_DOUBLE_EQ(prof->sync_ms, 4.0);
}

TEST(ProfileDevice, RefusesADeviceThatIsNotRunningAndABadWindow) {
  FakeDevice stopped({RegionInfo{0, "a", 4096, 4096, RegionHint::kStatic}}, DeviceState::kStop);
  FakeClock clock;
  EXPECT_EQ(ProfileDevice(stopped, SampleOptions{}, clock).status().code(), StatusCode::kFailedPrecondition);
  FakeDevice running({RegionInfo{0, "a", 4096, 4096, RegionHint::kStatic}}, DeviceState::kRunning);
  SampleOptions bad;
  bad.sample = 5ms;
  bad.interval = 10ms;
  EXPECT_EQ(ProfileDevice(running, bad, clock).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpumigrate
