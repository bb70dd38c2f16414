// Several VFIO devices of one VM migrated as one vfio: device
// (vfio:PATH1,PATH2,...): every device is quiesced through the P2P states
// before any stops and answers P2P again before any runs (the fake P2P bus
// records every arc that breaks that rule), the streams travel as records and
// arrive byte-identical, and every failure returns all of them to RUNNING.
#include <atomic>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "engine/devices/vfio/vfio_device.h"
#include "gpumigrate/session/local_migration.h"
#include "tests/support/vfio/fake_vfio_device.h"

namespace gpumigrate::vfio {
namespace {

constexpr uint64_t kAll = VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P | VFIO_MIGRATION_PRE_COPY;

// The VFIO devices of one VM behind one fake kernel, on one P2P bus.
struct Vm {
  fake::FakeKernel kernel;
  std::shared_ptr<fake::FakeP2PBus> bus = std::make_shared<fake::FakeP2PBus>();
  std::vector<std::shared_ptr<fake::FakeVfioDevice>> devs;
  VfioSpec spec;

  Vm(const std::vector<uint64_t>& flags, size_t memory) {
    kernel.Add("/dev/iommu", [] { return std::make_shared<fake::File>(); });
    for (size_t i = 0; i < flags.size(); ++i) {
      fake::FakeVfioConfig c;
      c.migration_flags = flags[i];
      c.memory_bytes = memory;
      c.max_read_bytes = 40 << 10;
      c.p2p_bus = bus;
      auto d = fake::FakeVfioDevice::Create(c);
      devs.push_back(d);
      std::string path = "/dev/vfio/devices/vfio" + std::to_string(i);
      kernel.Add(path, [d] { return d->OpenFile(); });
      spec.paths.push_back(path);
    }
  }
  void Fill(uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& d : devs) {
      std::vector<std::byte> v(d->Memory().size());
      for (auto& b : v) b = std::byte(rng() & 0xff);
      ASSERT_TRUE(d->WriteMemory(0, v));
    }
  }
  void ExpectNoViolation() {
    auto v = bus->Violations();
    EXPECT_TRUE(v.empty()) << "P2P rule broken: " << v.front();
  }
  void ExpectAll(uint32_t state) {
    for (size_t i = 0; i < devs.size(); ++i) EXPECT_EQ(devs[i]->state(), state) << "device " << i;
  }
};

struct Pair {
  Vm src, dst;
  LocalMigrationOptions opt;
  LocalMigrationResult res;
  Pair(const std::vector<uint64_t>& flags, size_t memory, size_t dst_devices = 0)
      : src(flags, memory), dst(dst_devices ? std::vector<uint64_t>(dst_devices, kAll) : flags, memory) {
    src.Fill(3);
    opt.source.downtime_target = std::chrono::milliseconds(500);
    opt.source.max_frame_payload_bytes = 24 << 10;
    opt.data_streams = 2;
  }
  void Migrate(const std::function<void()>& armed = nullptr) {
    auto s = VfioDevice::Open(src.spec, DeviceRole::kSource, src.kernel);
    auto d = VfioDevice::Open(dst.spec, DeviceRole::kDestination, dst.kernel);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    if (armed) armed();
    res = MigrateLocally(**s, **d, opt);
  }
};

TEST(VfioP2PMigration, ThreeDevicesQuiescedTogetherArriveByteIdentical) {
  // One device without PRE_COPY: it stays RUNNING through pre-copy and gives
  // everything in the stun, beside two that pre-copy.
  Pair r({kAll, VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P, kAll}, 1 << 20);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::mt19937 rng(11);
    std::vector<std::byte> v(700);
    while (!stop) {
      for (auto& b : v) b = std::byte(rng() & 0xff);
      (void)r.src.devs[rng() % 3]->WriteMemory(rng() % ((1 << 20) - v.size()), v);
    }
  });
  r.Migrate();
  stop = true;
  writer.join();
  ASSERT_EQ(r.res.source.outcome, Outcome::kCompleted) << r.res.source.status.ToString();
  ASSERT_EQ(r.res.destination.outcome, Outcome::kCompleted) << r.res.destination.status.ToString();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(r.dst.devs[i]->Memory() == r.src.devs[i]->Memory()) << "device " << i << " differs";
  }
  r.src.ExpectAll(kStateStop);
  r.dst.ExpectAll(kStateRunning);
  r.src.ExpectNoViolation();
  r.dst.ExpectNoViolation();
  // Quiesced before stopped: each device's path into STOP_COPY passes a _P2P state.
  for (auto& d : r.src.devs) {
    auto steps = d->Steps();
    auto sc = std::find(steps.begin(), steps.end(), kStateStopCopy);
    ASSERT_NE(sc, steps.end());
    ASSERT_NE(sc, steps.begin());
    EXPECT_TRUE(sc[-1] == kStatePreCopyP2P || sc[-1] == kStateStop) << "entered STOP_COPY from " << sc[-1];
  }
  EXPECT_EQ(r.src.kernel.OpenFds(), 0u) << "every device fd, data fd and the iommufd closed";
}

TEST(VfioP2PMigration, ADeviceWithoutP2PCannotJoinASet) {
  Vm vm({kAll, VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_PRE_COPY}, 64 << 10);
  auto s = VfioDevice::Open(vm.spec, DeviceRole::kSource, vm.kernel);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("vfio:/dev/vfio/devices/vfio1: the device does not offer VFIO_MIGRATION_P2P"),
            std::string::npos)
      << s.status().ToString();
  EXPECT_EQ(vm.kernel.OpenFds(), 0u);
  vm.ExpectAll(kStateRunning);
}

TEST(VfioP2PMigration, ADestinationWithAnotherNumberOfDevicesIsRefusedBeforeAnythingMoves) {
  Pair r({kAll, kAll}, 64 << 10, /*dst_devices=*/3);
  r.Migrate();
  EXPECT_EQ(r.res.source.outcome, Outcome::kAborted);
  EXPECT_NE(r.res.source.status.message().find("the destination resumes 3 VFIO device(s), this source migrates 2"),
            std::string::npos)
      << r.res.source.status.ToString();
  r.src.ExpectAll(kStateRunning);
  for (auto& d : r.src.devs) EXPECT_TRUE(d->Steps().empty()) << "a source device moved";
}

// A device that falls into ERROR on its way to STOP_COPY: every device runs
// again, the broken one reset (and the report says its state is lost), the
// others brought back through RUNNING_P2P without breaking the P2P rule.
TEST(VfioP2PMigration, ADeviceFallingIntoErrorInTheStunBringsEveryDeviceBack) {
  Pair r({kAll, kAll, kAll}, 256 << 10);
  r.opt.source.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kSwitchover) r.src.devs[1]->faults.error_on_next_arc = true;
  };
  r.Migrate();
  EXPECT_EQ(r.res.source.outcome, Outcome::kAborted) << r.res.source.status.ToString();
  r.src.ExpectAll(kStateRunning);
  EXPECT_EQ(r.src.devs[0]->resets(), 0);
  EXPECT_EQ(r.src.devs[1]->resets(), 1);
  EXPECT_EQ(r.src.devs[2]->resets(), 0);
  EXPECT_NE(r.res.source.resolution.find("vfio:/dev/vfio/devices/vfio1 was reset"), std::string::npos)
      << r.res.source.resolution;
  r.src.ExpectNoViolation();
  r.dst.ExpectNoViolation();
  r.dst.ExpectAll(kStateStop);  // discarded, ready for another attempt
  EXPECT_EQ(r.src.kernel.OpenFds(), 0u);
}

// The last device falls into ERROR on its arc into STOP_COPY, when the others
// are already there: the stopped ones answer P2P again before the broken one is
// reset, and none runs before all can answer.
TEST(VfioP2PMigration, TheLastDeviceFallingIntoErrorAfterTheOthersStoppedBringsEveryDeviceBack) {
  Pair r({kAll, kAll, kAll}, 256 << 10);
  r.opt.source.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kSwitchover) r.src.devs[2]->faults.error_on_arc_into = kStateStopCopy;
  };
  r.Migrate();
  EXPECT_EQ(r.res.source.outcome, Outcome::kAborted) << r.res.source.status.ToString();
  r.src.ExpectAll(kStateRunning);
  EXPECT_EQ(r.src.devs[0]->resets(), 0);
  EXPECT_EQ(r.src.devs[1]->resets(), 0);
  EXPECT_EQ(r.src.devs[2]->resets(), 1);
  for (int i : {0, 1}) {
    auto steps = r.src.devs[i]->Steps();
    EXPECT_NE(std::find(steps.begin(), steps.end(), kStateStopCopy), steps.end()) << "device " << i << " never stopped";
  }
  r.src.ExpectNoViolation();
  EXPECT_EQ(r.src.kernel.OpenFds(), 0u);
}

// Busy devices must not starve a quiet one: the records of one pre-copy round
// come from every device that has data, in turn.
TEST(VfioP2PMigration, EveryDeviceIsReadInTurn) {
  Vm vm({kAll, kAll}, 256 << 10);
  vm.Fill(5);
  auto s = VfioDevice::Open(vm.spec, DeviceRole::kSource, vm.kernel);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)->SetState(DeviceState::kPreCopy).ok());
  std::vector<std::byte> chunk(8 << 10);
  std::vector<uint32_t> order;
  for (int i = 0; i < 6; ++i) {
    auto got = (*s)->ReadStateChunk(chunk);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_GT(*got, kMuxHeaderBytes);
    order.push_back(std::to_integer<uint32_t>(chunk[4]));
  }
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 1, 0, 1, 0, 1}));
  ASSERT_TRUE((*s)->SetState(DeviceState::kRunning).ok());
}

// STOP -> RUNNING on the destination fails on one device after another is
// already RUNNING: every device is brought back to STOP (the first through
// RUNNING_P2P), so the destination is truly stopped while the outcome is in
// doubt; a device that fell into ERROR says the state is lost.
TEST(VfioP2PMigration, ADestinationThatFailsToStartIsStoppedAgainWhole) {
  for (bool error : {false, true}) {
    SCOPED_TRACE(error ? "device 1 falls into ERROR" : "device 1 stays put");
    Pair r({kAll, kAll}, 64 << 10);
    auto& f = r.dst.devs[1]->faults;
    (error ? f.error_on_arc_into : f.fail_on_arc_into) = kStateRunning;
    r.Migrate();
    EXPECT_EQ(r.res.destination.outcome, Outcome::kInDoubt) << r.res.destination.status.ToString();
    EXPECT_EQ(r.res.source.outcome, Outcome::kInDoubt) << r.res.source.status.ToString();
    EXPECT_EQ(r.dst.devs[0]->state(), kStateStop);
    EXPECT_EQ(r.dst.devs[1]->state(), error ? kStateError : kStateStop);
    EXPECT_EQ(r.dst.devs[0]->resets() + r.dst.devs[1]->resets(), 0) << "the verified copy was thrown away";
    const std::string& why = r.res.destination.resolution;
    EXPECT_EQ(why.find("is lost; resume the source") != std::string::npos, error) << why;
    EXPECT_EQ(why.find("holds the complete, verified state") != std::string::npos, !error) << why;
    r.src.ExpectAll(kStateStop);
    r.dst.ExpectNoViolation();
  }
}

TEST(VfioP2PMigration, OneDestinationDeviceRefusingItsStreamAbortsAllWithTheSourceRunning) {
  Pair r({kAll, kAll}, 256 << 10);
  r.dst.devs[1]->faults.refuse_resume_stream = true;
  r.Migrate();
  EXPECT_EQ(r.res.source.outcome, Outcome::kAborted);
  EXPECT_EQ(r.res.destination.outcome, Outcome::kAborted);
  EXPECT_NE(r.res.destination.status.message().find("vfio:/dev/vfio/devices/vfio1: write of the migration data fd"),
            std::string::npos)
      << r.res.destination.status.ToString();
  r.src.ExpectAll(kStateRunning);
  r.dst.ExpectAll(kStateStop);
  EXPECT_NE(r.res.source.resolution.find("memory intact"), std::string::npos) << r.res.source.resolution;
  r.src.ExpectNoViolation();
  r.dst.ExpectNoViolation();
}

}  // namespace
}  // namespace gpumigrate::vfio
