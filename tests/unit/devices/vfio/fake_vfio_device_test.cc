// The fake VFIO device enforces the migration v2 uAPI: features and argsz, the
// kernel's arc table, data fd sessions, PRE_COPY info, short reads, ERROR.
#include "tests/support/vfio/fake_vfio_device.h"

#include <fcntl.h>

#include <cerrno>
#include <deque>
#include <set>
#include <utility>

#include <gtest/gtest.h>

#include "tests/support/vfio/vfio_test_util.h"

namespace gpumigrate::vfio::fake {
namespace {

constexpr uint64_t kAll = VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P | VFIO_MIGRATION_PRE_COPY;
constexpr uint32_t E = kStateError, S = kStateStop, R = kStateRunning, SC = kStateStopCopy, RS = kStateResuming,
                   RP = kStateRunningP2P, PC = kStatePreCopy, PP = kStatePreCopyP2P;

struct Rig {
  FakeKernel k;
  std::shared_ptr<FakeVfioDevice> dev;
  int fd = -1;
  explicit Rig(uint64_t flags = kAll, uint32_t initial = R) {
    FakeVfioConfig cfg;
    cfg.migration_flags = flags;
    cfg.memory_bytes = 64 << 10;
    cfg.initial_state = initial;
    dev = FakeVfioDevice::Create(cfg);
    k.Add("/dev/vfio/devices/vfio0", [d = dev] { return d->OpenFile(); });
    k.Add("/dev/iommu", [] { return std::make_shared<File>(); });
    fd = k.Open("/dev/vfio/devices/vfio0", O_RDWR);
    EXPECT_GE(Bind(k, fd), 0);
  }
};

TEST(FakeVfioDevice, ACdevAnswersOnlyBindUntilBound) {
  FakeVfioConfig cfg;
  auto dev = FakeVfioDevice::Create(cfg);
  FakeKernel k;
  k.Add("/dev/vfio/devices/vfio0", [dev] { return dev->OpenFile(); });
  k.Add("/dev/iommu", [] { return std::make_shared<File>(); });
  int fd = k.Open("/dev/vfio/devices/vfio0", O_RDWR);
  EXPECT_EQ(GetMig(k, fd), ~0u) << "GET before bind is refused";
  EXPECT_EQ(k.Ioctl(fd, VFIO_DEVICE_RESET, nullptr), -EINVAL);
  vfio_device_bind_iommufd b{sizeof(b), 0, 9999, 0};
  EXPECT_EQ(k.Ioctl(fd, VFIO_DEVICE_BIND_IOMMUFD, &b), -EBADF) << "not an open fd";
  b.iommufd = k.Open("/dev/iommu", 0);
  b.flags = 1;
  EXPECT_EQ(k.Ioctl(fd, VFIO_DEVICE_BIND_IOMMUFD, &b), -EINVAL) << "flags must be 0";
  b.flags = 0;
  b.argsz = 12;
  EXPECT_EQ(k.Ioctl(fd, VFIO_DEVICE_BIND_IOMMUFD, &b), -EINVAL) << "argsz short";
  b.argsz = sizeof(b);
  EXPECT_EQ(k.Ioctl(fd, VFIO_DEVICE_BIND_IOMMUFD, &b), 0);
  EXPECT_EQ(k.Ioctl(fd, VFIO_DEVICE_BIND_IOMMUFD, &b), -EINVAL) << "bound once";
  EXPECT_EQ(GetMig(k, fd), kStateRunning);
}

TEST(FakeVfioDevice, FeatureFlagsAndArgszAreChecked) {
  Rig r;
  vfio_device_feature_migration mig{};
  const uint32_t get = VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIGRATION;
  EXPECT_EQ(Feature(r.k, r.fd, get, mig), 0);
  EXPECT_EQ(mig.flags, kAll);
  EXPECT_EQ(Feature(r.k, r.fd, get, mig, 4), -EINVAL) << "argsz below the header";
  EXPECT_EQ(Feature(r.k, r.fd, get, mig, 12), -EINVAL) << "argsz below header + payload";
  EXPECT_EQ(Feature(r.k, r.fd, get | (1u << 20), mig), -EINVAL) << "unknown flag bit";
  EXPECT_EQ(Feature(r.k, r.fd, get | VFIO_DEVICE_FEATURE_SET, mig), -EINVAL) << "GET and SET together";
  EXPECT_EQ(Feature(r.k, r.fd, VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_MIGRATION, mig), -EINVAL)
      << "MIGRATION is GET only";
  EXPECT_EQ(Feature(r.k, r.fd, VFIO_DEVICE_FEATURE_MIGRATION, mig), -EINVAL) << "neither GET, SET nor PROBE";
  EXPECT_EQ(Feature(r.k, r.fd, VFIO_DEVICE_FEATURE_PROBE | get, mig), 0);
  EXPECT_EQ(Feature(r.k, r.fd, VFIO_DEVICE_FEATURE_PROBE | VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_MIGRATION,
                    mig),
            -EINVAL)
      << "PROBE of an unsupported op";
  for (uint32_t feature : {6u, 7u, 8u, 42u}) {
    EXPECT_EQ(Feature(r.k, r.fd, VFIO_DEVICE_FEATURE_GET | feature, mig), -ENOTTY) << feature;
  }
  vfio_device_feature_mig_data_size size{};
  EXPECT_EQ(Feature(r.k, r.fd, VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIG_DATA_SIZE, size), 0);
  EXPECT_EQ(size.stop_copy_length, 16 * (sizeof(FakeRecord) + 4096));
  EXPECT_EQ(r.k.Ioctl(r.fd, VFIO_MIG_GET_PRECOPY_INFO, nullptr), -ENOTTY) << "that number is EEH on a device fd";

  Rig none(0);
  EXPECT_EQ(Feature(none.k, none.fd, get, mig), -ENOTTY) << "a device without migration";
  EXPECT_EQ(r.k.Open("/dev/vfio/devices/vfio0", O_RDWR), -EBUSY) << "a VFIO device opens once";
}

// The direct arcs docs/qemu-facts.md §7.3 lists (from include/uapi/linux/vfio.h),
// written out independently of the fake's table.
std::set<std::pair<uint32_t, uint32_t>> DirectArcs(uint64_t flags) {
  std::set<std::pair<uint32_t, uint32_t>> a = {{S, SC}, {SC, S}, {S, RS}, {RS, S}};
  const bool p2p = flags & VFIO_MIGRATION_P2P, pre = flags & VFIO_MIGRATION_PRE_COPY;
  if (p2p) a.insert({{R, RP}, {RP, R}, {RP, S}, {S, RP}});
  if (!p2p) a.insert({{R, S}, {S, R}});
  if (pre) a.insert({{R, PC}, {PC, R}});
  // A P2P device quiesces first (PRE_COPY -> PRE_COPY_P2P -> STOP_COPY, the
  // kernel table's path), as RUNNING -> STOP goes through RUNNING_P2P.
  if (pre && !p2p) a.insert({PC, SC});
  if (pre && p2p) a.insert({{PC, PP}, {PP, PC}, {PP, RP}, {PP, SC}, {RP, PP}});
  return a;
}

bool Supported(uint32_t s, uint64_t flags) {
  if (s == E) return false;
  if ((s == RP || s == PP) && !(flags & VFIO_MIGRATION_P2P)) return false;
  if ((s == PC || s == PP) && !(flags & VFIO_MIGRATION_PRE_COPY)) return false;
  return true;
}

// Shortest path by direct arcs with no saving-group state (nor RESUMING)
// inside, except PRE_COPY_P2P on the way out of PRE_COPY (the kernel's table
// goes PRE_COPY -> PRE_COPY_P2P -> STOP_COPY), and STOP_COPY -> PRE_COPY(_P2P)
// blocked. -1: unreachable.
int ShortestPath(uint32_t from, uint32_t to, uint64_t flags) {
  if (from == SC && (to == PC || to == PP)) return -1;  // blocked: STOP_COPY never goes back to PRE_COPY
  auto arcs = DirectArcs(flags);
  std::deque<std::pair<uint32_t, int>> q{{from, 0}};
  std::set<uint32_t> seen{from};
  while (!q.empty()) {
    auto [s, d] = q.front();
    q.pop_front();
    if (s == to) return d;
    const bool may_pass = s == from || s == S || s == R || s == RP || (s == PP && from == PC);
    if (!may_pass) continue;
    for (auto [a, b] : arcs) {
      if (a == s && !seen.count(b)) {
        seen.insert(b);
        q.push_back({b, d + 1});
      }
    }
  }
  return -1;
}

// Every (from, to) pair on each kind of device: each step is a direct arc, the
// path is the shortest, unsupported or blocked targets are -EINVAL.
TEST(FakeVfioDevice, ArcTableWalksShortestPathsOfDirectArcs) {
  const uint64_t kinds[] = {VFIO_MIGRATION_STOP_COPY, VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P,
                            VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_PRE_COPY, kAll};
  for (uint64_t flags : kinds) {
    for (uint32_t from = S; from < kStateCount; ++from) {
      for (uint32_t to = E; to < kStateCount; ++to) {
        if (!Supported(from, flags)) continue;
        Rig r(flags, from);
        const int ret = SetMig(r.k, r.fd, to);
        auto steps = r.dev->Steps();
        SCOPED_TRACE(testing::Message() << "flags " << flags << ": " << from << " -> " << to);
        const int want = Supported(to, flags) ? ShortestPath(from, to, flags) : -1;
        if (want < 0) {
          EXPECT_EQ(ret, -EINVAL);
          EXPECT_EQ(r.dev->state(), from) << "a refused transition moves nothing";
          continue;
        }
        EXPECT_EQ(ret, 0);
        EXPECT_EQ(r.dev->state(), to);
        EXPECT_EQ(static_cast<int>(steps.size()), want);
        if (static_cast<int>(steps.size()) != want) continue;
        uint32_t at = from;
        for (uint32_t s : steps) {
          EXPECT_TRUE(DirectArcs(flags).count({at, s})) << at << " -> " << s << " is not a direct arc";
          at = s;
        }
      }
    }
  }
}

TEST(FakeVfioDevice, NamedCombinationsAndBlockedArcs) {
  Rig r;
  ASSERT_EQ(SetMig(r.k, r.fd, S), 0);
  EXPECT_EQ(r.dev->Steps(), (std::vector<uint32_t>{RP, S})) << "RUNNING -> STOP goes through RUNNING_P2P";
  int data = -1;
  ASSERT_EQ(SetMig(r.k, r.fd, SC, &data), 0);
  EXPECT_GE(data, 0) << "STOP -> STOP_COPY opens a saving session";
  EXPECT_EQ(SetMig(r.k, r.fd, PC), -EINVAL) << "STOP_COPY -> PRE_COPY is blocked";
  EXPECT_EQ(SetMig(r.k, r.fd, PP), -EINVAL);
  EXPECT_EQ(r.dev->state(), SC);
  EXPECT_EQ(SetMig(r.k, r.fd, E), -EINVAL) << "ERROR is never a target";
  Rig n(VFIO_MIGRATION_STOP_COPY);
  EXPECT_EQ(SetMig(n.k, n.fd, PC), -EINVAL) << "PRE_COPY on a device without it";
  EXPECT_EQ(SetMig(n.k, n.fd, RP), -EINVAL) << "RUNNING_P2P on a device without P2P";
  ASSERT_EQ(SetMig(n.k, n.fd, S), 0);
  EXPECT_EQ(n.dev->Steps(), (std::vector<uint32_t>{S})) << "without P2P, RUNNING -> STOP is direct";
}

TEST(FakeVfioDevice, DataFdsOpenOnSessionArcsOnlyAndEndWithTheSession) {
  Rig r;
  int data = -1, none = 0;
  ASSERT_EQ(SetMig(r.k, r.fd, PC, &data), 0);
  ASSERT_GE(data, 0);
  ASSERT_EQ(SetMig(r.k, r.fd, SC, &none), 0);
  EXPECT_EQ(none, -1) << "PRE_COPY -> STOP_COPY keeps the session's fd";
  ssize_t last = 1;
  auto bytes = Drain(r.k, data, &last);
  EXPECT_EQ(last, 0) << "STOP_COPY ends the stream with 0";
  EXPECT_EQ(bytes.size(), 16 * (sizeof(FakeRecord) + 4096));
  ASSERT_EQ(SetMig(r.k, r.fd, S, &none), 0);
  EXPECT_EQ(none, -1);
  std::byte b[8];
  EXPECT_EQ(r.k.Read(data, b, sizeof b), -ENODEV) << "the session ended with the saving group";
  EXPECT_EQ(r.k.Close(data), 0);
  ASSERT_EQ(SetMig(r.k, r.fd, R, &none), 0);
  EXPECT_EQ(none, -1);
  ASSERT_EQ(SetMig(r.k, r.fd, PC, &data), 0);
  ASSERT_EQ(SetMig(r.k, r.fd, R), 0);
  EXPECT_EQ(r.k.Read(data, b, sizeof b), -ENODEV) << "PRE_COPY -> RUNNING ends the session";
}

TEST(FakeVfioDevice, PrecopyInfoEnomsgAndShortReads) {
  Rig r;
  vfio_precopy_info info{};
  info.argsz = sizeof(info);
  int data = -1;
  ASSERT_EQ(SetMig(r.k, r.fd, PC, &data), 0);
  ASSERT_EQ(r.k.Ioctl(data, VFIO_MIG_GET_PRECOPY_INFO, &info), 0);
  const uint64_t rec = sizeof(FakeRecord) + 4096;
  EXPECT_EQ(info.initial_bytes, 16 * rec);
  EXPECT_EQ(info.dirty_bytes, 0u);
  std::byte buf[4096 * 2];
  EXPECT_EQ(r.k.Read(data, buf, sizeof buf), 1000) << "short reads";
  ssize_t last = 0;
  auto first = Drain(r.k, data, &last);
  EXPECT_EQ(last, -ENOMSG) << "the temporary end of the pre-copy stream";
  EXPECT_EQ(first.size() + 1000, 16 * rec);
  ASSERT_EQ(r.k.Ioctl(data, VFIO_MIG_GET_PRECOPY_INFO, &info), 0);
  EXPECT_EQ(info.initial_bytes + info.dirty_bytes, 0u);
  std::vector<std::byte> w(10, std::byte{7});
  ASSERT_TRUE(r.dev->WriteMemory(4090, w)) << "the device runs in PRE_COPY";
  ASSERT_EQ(r.k.Ioctl(data, VFIO_MIG_GET_PRECOPY_INFO, &info), 0);
  EXPECT_EQ(info.dirty_bytes, 2 * rec) << "a write across two chunks makes both pending again";
  EXPECT_EQ(info.initial_bytes, 0u);
  info.argsz = 16;
  EXPECT_EQ(r.k.Ioctl(data, VFIO_MIG_GET_PRECOPY_INFO, &info), -EINVAL) << "argsz short";
  info.argsz = sizeof(info);
  r.dev->faults.lie_precopy_sizes = true;
  ASSERT_EQ(r.k.Ioctl(data, VFIO_MIG_GET_PRECOPY_INFO, &info), 0);
  EXPECT_EQ(info.dirty_bytes, 0u) << "the lying device";
  ASSERT_EQ(SetMig(r.k, r.fd, SC), 0);
  EXPECT_EQ(r.k.Ioctl(data, VFIO_MIG_GET_PRECOPY_INFO, &info), -EINVAL) << "only in PRE_COPY states";
  EXPECT_EQ(Drain(r.k, data, &last).size(), 2 * rec) << "STOP_COPY hands over the dirty chunks";
  EXPECT_FALSE(r.dev->WriteMemory(0, w)) << "a stopped device writes nothing";
}

TEST(FakeVfioDevice, ErrorIsLeftOnlyByReset) {
  Rig r;
  r.dev->faults.error_on_next_arc = true;
  EXPECT_EQ(SetMig(r.k, r.fd, PC), -EIO);
  EXPECT_EQ(GetMig(r.k, r.fd), E);
  for (uint32_t to : {S, R, SC, RS, RP, PC, PP}) EXPECT_EQ(SetMig(r.k, r.fd, to), -EINVAL) << to;
  EXPECT_EQ(r.k.Ioctl(r.fd, VFIO_DEVICE_RESET, nullptr), 0);
  EXPECT_EQ(GetMig(r.k, r.fd), R);
}

TEST(FakeVfioDevice, ResumeAppliesRecordsAndRefusesBadStreams) {
  Rig src, dst(kAll, S);
  std::vector<std::byte> w(5000, std::byte{0x5a});
  ASSERT_TRUE(src.dev->WriteMemory(100, w));
  int sfd = -1, dfd = -1;
  ASSERT_EQ(SetMig(src.k, src.fd, SC, &sfd), 0);
  ssize_t last = 0;
  auto stream = Drain(src.k, sfd, &last);
  ASSERT_EQ(SetMig(dst.k, dst.fd, RS, &dfd), 0);
  ASSERT_GE(dfd, 0) << "STOP -> RESUMING opens the resume fd";
  EXPECT_EQ(dst.k.Read(dfd, w.data(), 1), -ENODEV) << "a resume fd is not read";
  for (size_t off = 0; off < stream.size();) {
    ssize_t n = dst.k.Write(dfd, stream.data() + off, stream.size() - off);
    ASSERT_GT(n, 0);
    off += static_cast<size_t>(n);
  }
  ASSERT_EQ(SetMig(dst.k, dst.fd, S), 0);
  EXPECT_EQ(dst.dev->Memory(), src.dev->Memory());

  ASSERT_EQ(SetMig(dst.k, dst.fd, RS, &dfd), 0);
  ASSERT_EQ(dst.k.Write(dfd, stream.data(), 20), 20);
  EXPECT_EQ(SetMig(dst.k, dst.fd, S), -EINVAL) << "a stream cut mid-record";
  EXPECT_EQ(dst.dev->state(), E);
  ASSERT_EQ(dst.k.Ioctl(dst.fd, VFIO_DEVICE_RESET, nullptr), 0);
  ASSERT_EQ(SetMig(dst.k, dst.fd, RS, &dfd), 0);
  std::vector<std::byte> junk(64, std::byte{1});
  EXPECT_EQ(dst.k.Write(dfd, junk.data(), junk.size()), -EINVAL) << "a record with a bad header";
  dst.dev->faults.refuse_resume_stream = true;
  EXPECT_EQ(dst.k.Write(dfd, stream.data(), 16), -EINVAL);
}

TEST(FakeVfioDevice, ReadErrorMidStream) {
  Rig r;
  r.dev->faults.read_error_after_bytes = 3000;
  int data = -1;
  ASSERT_EQ(SetMig(r.k, r.fd, PC, &data), 0);
  ssize_t last = 0;
  EXPECT_EQ(Drain(r.k, data, &last).size(), 3000u);
  EXPECT_EQ(last, -EIO);
}

}  // namespace
}  // namespace gpumigrate::vfio::fake

namespace gpumigrate::vfio::fake {
namespace {

// The P2P bus the multi-device tests rely on: it must see every arc, and flag
// a device left able to initiate P2P DMA while a peer cannot answer it.
TEST(FakeP2PBus, FlagsADeviceRunningBesideAStoppedPeerAndNotAQuiescedOne) {
  FakeKernel k;
  k.Add("/dev/iommu", [] { return std::make_shared<File>(); });
  auto bus = std::make_shared<FakeP2PBus>();
  int fds[2];
  for (int i = 0; i < 2; ++i) {
    FakeVfioConfig cfg;
    cfg.memory_bytes = 64 << 10;
    cfg.p2p_bus = bus;
    auto dev = FakeVfioDevice::Create(cfg);
    const std::string path = "/dev/vfio/devices/vfio" + std::to_string(i);
    k.Add(path, [dev] { return dev->OpenFile(); });
    fds[i] = k.Open(path.c_str(), O_RDWR);
    ASSERT_GE(Bind(k, fds[i]), 0);
  }
  // Quiesced first, then stopped, then back through RUNNING_P2P: no violation.
  for (int fd : fds) ASSERT_EQ(SetMig(k, fd, kStateRunningP2P), 0);
  for (int fd : fds) ASSERT_EQ(SetMig(k, fd, kStateStop), 0);
  for (int fd : fds) ASSERT_EQ(SetMig(k, fd, kStateRunningP2P), 0);
  for (int fd : fds) ASSERT_EQ(SetMig(k, fd, kStateRunning), 0);
  EXPECT_TRUE(bus->Violations().empty()) << bus->Violations().front();
  // Device 0 stops alone while device 1 runs: device 1 is left initiating P2P
  // towards a device that cannot answer.
  ASSERT_EQ(SetMig(k, fds[0], kStateStop), 0);
  auto v = bus->Violations();
  ASSERT_FALSE(v.empty()) << "the bus saw no violation";
  EXPECT_NE(v.front().find("device"), std::string::npos) << v.front();
}

}  // namespace
}  // namespace gpumigrate::vfio::fake
