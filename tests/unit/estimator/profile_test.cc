// The dry run's measurements with a fake clock and a scripted device: W(t) is
// known exactly.
#include <gtest/gtest.h>

#include "gpumigrate/estimator.h"
#include "tests/support/fake_device.h"

namespace gpumigrate {
namespace {

using namespace std::chrono_literals;
using testing::FakeDevice;

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
  SampleOptions opt;
  opt.sample = 160ms;
  opt.interval = 10ms;
  opt.pages_sampled_per_region = 64;
  auto prof = ProfileDevice(dev, opt, clock);
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
