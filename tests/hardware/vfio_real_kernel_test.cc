// The vfio: device through the real kernel, where /dev/vfio offers a device
// with VFIO migration v2 (the kernel's mtty sample, mlx5, hisi_acc, a vGPU).
// Everywhere else each test skips and says why. scripts/vfio-check runs these.
//   GPUMIGRATE_VFIO_DEVICE=/dev/vfio/devices/vfioN  the source: required, never guessed (the test changes its
//                                                  migration state and resets it)
//   GPUMIGRATE_VFIO_DEST=/dev/vfio/devices/vfioM    a second device: a whole local migration to it
// The source is only ever returned to RUNNING: nothing here leaves it stopped.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "engine/devices/vfio/kernel.h"
#include "engine/devices/vfio/vfio_device.h"
#include "gpumigrate/session/local_migration.h"

namespace gpumigrate::vfio {
namespace {

namespace fs = std::filesystem;

// The source device's path, or "" with `why` saying why there is none.
std::string FindMigratable(std::string* why) {
  if (const char* env = std::getenv("GPUMIGRATE_VFIO_DEVICE")) return env;
  if (!fs::exists("/dev/vfio")) {
    *why = "no /dev/vfio: this kernel has no VFIO (CONFIG_VFIO) or no device is bound to a VFIO driver";
    return "";
  }
  if (!fs::exists("/dev/vfio/devices")) {
    *why = "/dev/vfio has no devices/ cdevs: the kernel is older than 6.6 or lacks CONFIG_VFIO_DEVICE_CDEV";
    return "";
  }
  // Never picked by itself: the test moves the device through migration states
  // and closing it resets it, which must not happen to a device a VM is using.
  *why = "set GPUMIGRATE_VFIO_DEVICE to a migratable cdev that nothing else uses (found:";
  for (const auto& e : fs::directory_iterator("/dev/vfio/devices")) {
    why->append(" ");  // not `" " + path`: GCC 12 -O3 warns falsely (-Werror=restrict) on that operator+
    why->append(e.path().string());
  }
  *why += ")";
  return "";
}

TEST(VfioRealKernel, SourceArcsReadTheStreamAndReturnToRunning) {
  std::string why;
  const std::string path = FindMigratable(&why);
  if (path.empty()) GTEST_SKIP() << why;
  auto d = VfioDevice::Open({{path}}, DeviceRole::kSource, RealKernel());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  VfioDevice& dev = **d;
  std::vector<std::byte> buf(1 << 20);
  ASSERT_TRUE(dev.SetState(DeviceState::kPreCopy).ok());
  auto some = dev.ReadStateChunk(buf);
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  ASSERT_TRUE(dev.SetState(DeviceState::kRunning).ok()) << "rollback from PRE_COPY";
  ASSERT_TRUE(dev.SetState(DeviceState::kPreCopy).ok());
  const uint64_t estimate = dev.PendingEstimate().stop_copy_bytes;
  ASSERT_TRUE(dev.SetState(DeviceState::kStopCopy).ok());
  uint64_t total = 0;
  for (;;) {
    auto n = dev.ReadStateChunk(buf);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    if (*n == 0) break;
    total += *n;
  }
  RecordProperty("stop_copy_bytes", std::to_string(total));
  RecordProperty("estimate_bytes", std::to_string(estimate));
  EXPECT_GT(total, 0u);
  Status back = dev.SetState(DeviceState::kRunning);
  EXPECT_TRUE(back.ok()) << back.ToString();
  EXPECT_EQ(dev.State(), DeviceState::kRunning);
}

TEST(VfioRealKernel, MigratesToASecondDevice) {
  std::string why;
  const std::string src = FindMigratable(&why);
  if (src.empty()) GTEST_SKIP() << why;
  const char* dst = std::getenv("GPUMIGRATE_VFIO_DEST");
  if (!dst) GTEST_SKIP() << "set GPUMIGRATE_VFIO_DEST to a second migratable device for a whole migration";
  auto s = VfioDevice::Open({{src}}, DeviceRole::kSource, RealKernel());
  auto d = VfioDevice::Open({{dst}}, DeviceRole::kDestination, RealKernel());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  LocalMigrationOptions opt;
  opt.source.fate = SourceFate::kResume;  // leave the source device running
  auto res = MigrateLocally(**s, **d, opt);
  EXPECT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_EQ(res.destination.outcome, Outcome::kCompleted) << res.destination.status.ToString();
}

}  // namespace
}  // namespace gpumigrate::vfio
