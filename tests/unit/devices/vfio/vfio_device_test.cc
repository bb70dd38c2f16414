// The vfio: device against the fake kernel: spec, open, arcs, errors that name
// the ioctl, the arc and the errno, and recovery to RUNNING on the source.
#include "engine/devices/vfio/vfio_device.h"

#include <gtest/gtest.h>

#include "gpumigrate/devices/open_device.h"
#include "tests/support/vfio/vfio_test_util.h"

namespace gpumigrate::vfio {
namespace {

using fake::FakeHost;
using fake::FakeVfioConfig;

FakeVfioConfig Config(uint64_t flags = VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P | VFIO_MIGRATION_PRE_COPY,
                      uint32_t initial = kStateRunning) {
  FakeVfioConfig c;
  c.migration_flags = flags;
  c.memory_bytes = 64 << 10;
  c.initial_state = initial;
  return c;
}

std::unique_ptr<VfioDevice> OpenOn(FakeHost& h, DeviceRole role) {
  auto d = VfioDevice::Open({{h.path}}, role, h.kernel);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

TEST(VfioSpec, ParsesAbsolutePathsOnly) {
  auto s = ParseVfioSpec("vfio:/dev/vfio/devices/vfio3");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->paths, std::vector<std::string>{"/dev/vfio/devices/vfio3"});
  EXPECT_FALSE(ParseVfioSpec("vfio:").ok());
  EXPECT_FALSE(ParseVfioSpec("vfio:vfio3").ok());
  EXPECT_FALSE(ParseVfioSpec("sim:size=1MiB").ok());
}

TEST(VfioSpec, SeveralDevicesOfOneVmInOrder) {
  auto s = ParseVfioSpec("vfio:/dev/vfio/devices/vfio3,/dev/vfio/devices/vfio1");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->paths, (std::vector<std::string>{"/dev/vfio/devices/vfio3", "/dev/vfio/devices/vfio1"}));
  EXPECT_FALSE(ParseVfioSpec("vfio:/dev/vfio/devices/vfio3,").ok());
  EXPECT_FALSE(ParseVfioSpec("vfio:/dev/vfio/devices/vfio3,vfio1").ok());
  auto twice = ParseVfioSpec("vfio:/dev/a,/dev/b,/dev/a");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("/dev/a is named twice"), std::string::npos) << twice.status().message();
}

TEST(VfioDevice, TheDestinationSaysHowManyDevicesItResumes) {
  FakeHost h(Config());
  auto src = OpenOn(h, DeviceRole::kSource);
  ASSERT_NE(src, nullptr);
  EXPECT_EQ(src->SetupNote(), "vfio devices=1");
  EXPECT_TRUE(src->SetPeerSetupNote("vfio devices=1").ok());
  EXPECT_TRUE(src->SetPeerSetupNote("").ok()) << "a destination from before several devices";
  Status two = src->SetPeerSetupNote("vfio devices=2");
  EXPECT_NE(two.message().find("the destination resumes 2 VFIO device(s), this source migrates 1"),
            std::string::npos)
      << two.message();
  EXPECT_FALSE(src->SetPeerSetupNote("vfio devices=x").ok());
  EXPECT_FALSE(src->SetPeerSetupNote("qemu tcp:1.2.3.4:5").ok());
}

TEST(VfioSpec, OpenDeviceNamesEverySpecAndOpensVfioThroughTheRealKernel) {
  auto bad = OpenDevice("gpu:0", true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("vfio:PATH"), std::string::npos) << bad.status().message();
  auto missing = OpenDevice("vfio:/nonexistent/vfio9", true);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("open failed"), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("ENOENT"), std::string::npos) << missing.status().message();
}

TEST(VfioDevice, OpenBindsTheCdevToAnIommufd) {
  fake::FakeKernel k;
  auto dev = fake::FakeVfioDevice::Create(Config());
  k.Add("/dev/vfio/devices/vfio0", [dev] { return dev->OpenFile(); });
  auto d = VfioDevice::Open({{"/dev/vfio/devices/vfio0"}}, DeviceRole::kSource, k);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("open /dev/iommu"), std::string::npos) << d.status().message();
  EXPECT_EQ(k.OpenFds(), 0u);
  FakeHost h(Config());
  auto ok = OpenOn(h, DeviceRole::kSource);
  EXPECT_EQ(h.kernel.OpenFds(), 2u) << "the device fd and the iommufd it is bound to";
  ok.reset();
  EXPECT_EQ(h.kernel.OpenFds(), 0u);
}

TEST(VfioDevice, OpenProbesMigrationAndState) {
  FakeHost none(Config(0));
  auto d = VfioDevice::Open({{none.path}}, DeviceRole::kSource, none.kernel);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kUnimplemented) << d.status().ToString();
  EXPECT_EQ(none.kernel.OpenFds(), 0u) << "the fd is closed on failure";

  FakeHost stopped(Config(VFIO_MIGRATION_STOP_COPY, kStateStop));
  auto s = VfioDevice::Open({{stopped.path}}, DeviceRole::kSource, stopped.kernel);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("a source must be RUNNING"), std::string::npos);

  FakeHost dst(Config());
  auto d2 = OpenOn(dst, DeviceRole::kDestination);
  ASSERT_NE(d2, nullptr);
  EXPECT_EQ(d2->State(), DeviceState::kStop);
  EXPECT_EQ(dst.dev->state(), kStateStop) << "a destination is brought to STOP";
  EXPECT_TRUE(d2->Regions().empty());
  EXPECT_TRUE(d2->StreamsState());
}

TEST(VfioDevice, SourceArcsFollowTheKernelAndRollBackToRunning) {
  FakeHost h(Config());
  auto d = OpenOn(h, DeviceRole::kSource);
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(d->SetState(DeviceState::kPreCopy).ok());
  EXPECT_EQ(h.dev->state(), kStatePreCopy);
  EXPECT_EQ(h.kernel.OpenFds(), 3u) << "device fd, iommufd and the saving session's data fd";
  auto p = d->PendingEstimate();
  EXPECT_EQ(p.precopy_bytes, 16 * (sizeof(fake::FakeRecord) + 4096));
  EXPECT_EQ(p.stop_copy_bytes, p.precopy_bytes);
  ASSERT_TRUE(d->SetState(DeviceState::kStopCopy).ok());
  ASSERT_TRUE(d->SetState(DeviceState::kRunning).ok());
  EXPECT_EQ(h.dev->state(), kStateRunning);
  EXPECT_EQ(h.kernel.OpenFds(), 2u) << "the data fd is closed with the session";
  Status bad = d->SetState(DeviceState::kResuming);
  EXPECT_EQ(bad.code(), StatusCode::kFailedPrecondition) << "not a source arc";
}

TEST(VfioDevice, WithoutPreCopyTheSourceRunsOnWithAnHonestEstimate) {
  FakeHost h(Config(VFIO_MIGRATION_STOP_COPY));
  auto d = OpenOn(h, DeviceRole::kSource);
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(d->SetState(DeviceState::kPreCopy).ok());
  EXPECT_EQ(h.dev->state(), kStateRunning) << "no PRE_COPY: the device runs on";
  auto chunk = std::vector<std::byte>(4096);
  auto n = d->ReadStateChunk(chunk);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u) << "nothing before the stun";
  EXPECT_EQ(d->PendingEstimate().stop_copy_bytes, 16 * (sizeof(fake::FakeRecord) + 4096)) << "MIG_DATA_SIZE";
  ASSERT_TRUE(d->SetState(DeviceState::kStopCopy).ok());
  EXPECT_EQ(h.dev->Steps(), (std::vector<uint32_t>{kStateStop, kStateStopCopy}));
  uint64_t total = 0;
  for (;;) {
    auto r = d->ReadStateChunk(chunk);
    ASSERT_TRUE(r.ok());
    if (*r == 0) break;
    total += *r;
  }
  EXPECT_EQ(total, 16 * (sizeof(fake::FakeRecord) + 4096));
}

TEST(VfioDevice, ReadErrorNamesTheCallAndTheSourceGoesBackToRunning) {
  FakeHost h(Config());
  auto d = OpenOn(h, DeviceRole::kSource);
  ASSERT_NE(d, nullptr);
  h.dev->faults.read_error_after_bytes = 5000;
  ASSERT_TRUE(d->SetState(DeviceState::kPreCopy).ok());
  std::vector<std::byte> chunk(64 << 10);
  auto r = d->ReadStateChunk(chunk);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("read of the migration data fd in PRE_COPY failed"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("EIO"), std::string::npos);
  ASSERT_TRUE(d->SetState(DeviceState::kRunning).ok());
  EXPECT_EQ(h.dev->state(), kStateRunning);
}

TEST(VfioDevice, AnArcIntoErrorIsResetAndTheSourceRunsOn) {
  FakeHost h(Config());
  auto d = OpenOn(h, DeviceRole::kSource);
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(d->SetState(DeviceState::kPreCopy).ok());
  h.dev->faults.error_on_next_arc = true;
  Status st = d->SetState(DeviceState::kStopCopy);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("VFIO_DEVICE_FEATURE SET MIG_DEVICE_STATE PRE_COPY -> STOP_COPY failed"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("EIO"), std::string::npos);
  EXPECT_EQ(d->State(), DeviceState::kRunning);
  EXPECT_EQ(h.dev->state(), kStateRunning) << "recovered with VFIO_DEVICE_RESET";
  EXPECT_EQ(h.kernel.OpenFds(), 2u);
}

TEST(VfioDevice, DestinationRefusingTheStreamIsDiscarded) {
  FakeHost h(Config());
  auto d = OpenOn(h, DeviceRole::kDestination);
  ASSERT_NE(d, nullptr);
  ASSERT_TRUE(d->SetState(DeviceState::kResuming).ok());
  h.dev->faults.refuse_resume_stream = true;
  std::vector<std::byte> junk(100);
  Status st = d->WriteStateChunk(junk);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("write of the migration data fd in RESUMING failed"), std::string::npos);
  EXPECT_NE(st.message().find("EINVAL"), std::string::npos);
  ASSERT_TRUE(d->SetState(DeviceState::kError).ok());
  EXPECT_EQ(h.dev->state(), kStateStop) << "discarded: reset, then STOP for another attempt";
  ASSERT_TRUE(d->SetState(DeviceState::kStop).ok());
  EXPECT_EQ(h.kernel.OpenFds(), 2u);
}

TEST(VfioDevice, BlobAndRegionCallsAreRefused) {
  FakeHost h(Config());
  auto d = OpenOn(h, DeviceRole::kSource);
  ASSERT_NE(d, nullptr);
  std::byte b[8];
  EXPECT_FALSE(d->Read(0, 0, b).ok());
  EXPECT_FALSE(d->SaveState().ok());
  EXPECT_TRUE(d->LoadState({}).ok());
  EXPECT_NE(d->Tracker(), nullptr);
}

}  // namespace
}  // namespace gpumigrate::vfio
