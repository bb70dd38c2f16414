// A live migration of an shm device whose file a "guest" thread keeps writing
// through a shared mapping, stopped at the switchover as the QEMU hook stops the
// vCPUs: the destination file ends byte-identical, written in place.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/shm.h"

namespace gpumigrate {
namespace {

constexpr uint64_t kSize = 32ull << 20;

class File {
 public:
  explicit File(const std::string& tag) : path_("/dev/shm/gm-shm-mig-" + tag + "-" + std::to_string(::getpid())) {
    if (!std::filesystem::is_directory("/dev/shm")) path_ = "/tmp" + path_.substr(8);
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, kSize), 0);
    map_ = static_cast<uint64_t*>(::mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    EXPECT_NE(map_, MAP_FAILED);
    ::close(fd);
  }
  ~File() {
    ::munmap(map_, kSize);
    std::filesystem::remove(path_);
  }
  const std::string& path() const { return path_; }
  uint64_t* words() const { return map_; }

 private:
  std::string path_;
  uint64_t* map_;
};

TEST(ShmMigration, AGuestWritingThroughItsMappingArrivesWhole) {
  File src("src"), dst("dst");
  // Weights: the first half, written once.
  const uint64_t words = kSize / 8;
  for (uint64_t i = 0; i < words / 2; ++i) src.words()[i] = i * 0x9e3779b97f4a7c15ull;
  auto sd = ShmDevice::Open({src.path(), 4096}, DeviceRole::kSource);
  auto dd = ShmDevice::Open({dst.path(), 4096}, DeviceRole::kDestination);
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  ASSERT_TRUE(dd.ok()) << dd.status().ToString();

  // The guest: keeps appending to a "KV cache" in the second half until its vCPUs stop.
  std::atomic<bool> stop{false}, stopped{false};
  std::atomic<uint64_t> writes{0};
  std::thread guest([&] {
    uint64_t pass = 1;
    while (!stop.load()) {
      for (uint64_t i = words / 2; i < words && !stop.load(); i += 512) src.words()[i] = pass;
      writes.fetch_add(1);
      ++pass;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    stopped.store(true);
  });

  LocalMigrationOptions opt;
  opt.source.scrub = false;  // the source file is compared with the destination's afterwards
  opt.data_streams = 2;
  opt.source.on_phase = [&](Phase phase, uint32_t) {
    if (phase == Phase::kSwitchover) {  // the hook's job under QEMU: the vCPUs stop before the device does
      stop.store(true);
      while (!stopped.load()) std::this_thread::yield();
    }
  };
  auto res = MigrateLocally(**sd, **dd, opt);
  stop.store(true);
  guest.join();
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  ASSERT_EQ(res.destination.outcome, Outcome::kCompleted) << res.destination.status.ToString();
  EXPECT_GT(writes.load(), 0u);
  EXPECT_EQ(std::memcmp(src.words(), dst.words(), kSize), 0);
  EXPECT_EQ(std::filesystem::file_size(dst.path()), kSize);
}

// After the migration the released source's file is zeroed (the guest's data
// must not stay in the host's shared memory), the destination's kept.
TEST(ShmMigration, TheReleasedSourcesFileIsZeroed) {
  File src("scrub-src"), dst("scrub-dst");
  for (uint64_t i = 0; i < kSize / 8; i += 97) src.words()[i] = i + 1;
  auto sd = ShmDevice::Open({src.path(), 4096}, DeviceRole::kSource);
  auto dd = ShmDevice::Open({dst.path(), 4096}, DeviceRole::kDestination);
  ASSERT_TRUE(sd.ok() && dd.ok());
  auto res = MigrateLocally(**sd, **dd, LocalMigrationOptions{});
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_TRUE(res.source.scrubbed) << res.source.scrub;
  uint64_t left = 0;
  for (uint64_t i = 0; i < kSize / 8; ++i) left += src.words()[i] != 0;
  EXPECT_EQ(left, 0u) << "words of the guest's data left in the source file";
  EXPECT_EQ(dst.words()[97], 98u);
  EXPECT_EQ(std::filesystem::file_size(src.path()), kSize);
}

// QEMU pausing the guest by itself (QEMU 7.2 cannot be held once its RAM is
// sent): switch_now cuts round 0 short; the pages it had not sent yet go in the
// final round, and the destination still ends byte-identical.
TEST(ShmMigration, SwitchNowCutsTheRoundShortAndNothingIsLost) {
  File src("src3"), dst("dst3");
  const uint64_t words = kSize / 8;
  for (uint64_t i = 0; i < words; ++i) src.words()[i] = i ^ 0x5a5a5a5a5a5a5a5aull;
  auto sd = ShmDevice::Open({src.path(), 4096}, DeviceRole::kSource);
  auto dd = ShmDevice::Open({dst.path(), 4096}, DeviceRole::kDestination);
  ASSERT_TRUE(sd.ok() && dd.ok());
  std::atomic<int> asked{0};
  std::atomic<bool> paused{false};
  LocalMigrationOptions opt;
  opt.source.scrub = false;  // the source file is compared with the destination's afterwards
  opt.source.max_frame_payload_bytes = 256 << 10;
  opt.source.downtime_target = std::chrono::nanoseconds(1);  // the rule alone would go on copying
  opt.source.switch_now = [&] {
    if (++asked == 10 && !paused.load()) {
      src.words()[words - 1] = 42;  // the guest's last write before its vCPUs stop
      paused.store(true);
    }
    return paused.load();
  };
  auto res = MigrateLocally(**sd, **dd, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  ASSERT_EQ(res.source.rounds.size(), 2u);
  EXPECT_LT(res.source.rounds[0].pages_sent, kSize / 4096) << "round 0 was not cut short";
  EXPECT_NE(res.source.switchover_reason.find("on its own"), std::string::npos) << res.source.switchover_reason;
  EXPECT_EQ(std::memcmp(src.words(), dst.words(), kSize), 0);
}

// The ABA write through a whole session: a page written after the tracker's
// first hash, sent in round 0 with that content, then written back to it before
// the next sync. The destination must end with the source's content.
TEST(ShmMigration, APageWrittenBackAfterItWasSentIsSentAgain) {
  File src("src4"), dst("dst4");
  auto sd = ShmDevice::Open({src.path(), 4096}, DeviceRole::kSource);
  auto dd = ShmDevice::Open({dst.path(), 4096}, DeviceRole::kDestination);
  ASSERT_TRUE(sd.ok() && dd.ok());
  LocalMigrationOptions opt;
  opt.source.scrub = false;  // the source file is compared with the destination's afterwards
  opt.source.on_phase = [&](Phase phase, uint32_t round) {
    if (round != 0) return;
    if (phase == Phase::kRoundStart) src.words()[700] = 0xabcdef;  // after Start's hash, before the send
    if (phase == Phase::kRoundEnd) src.words()[700] = 0;           // after the send, before the sync
  };
  auto res = MigrateLocally(**sd, **dd, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_EQ(dst.words()[700], 0u) << "the destination kept the content the source no longer has";
  EXPECT_EQ(std::memcmp(src.words(), dst.words(), kSize), 0);
}

TEST(ShmMigration, AFileOfAnotherSizeIsRefusedAtTheManifest) {
  File src("src2"), dst("dst2");
  ASSERT_EQ(::truncate(dst.path().c_str(), kSize / 2), 0);
  auto sd = ShmDevice::Open({src.path(), 4096}, DeviceRole::kSource);
  auto dd = ShmDevice::Open({dst.path(), 4096}, DeviceRole::kDestination);
  ASSERT_TRUE(sd.ok() && dd.ok());
  auto res = MigrateLocally(**sd, **dd, LocalMigrationOptions{});
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_NE(res.destination.status.message().find("does not fit"), std::string::npos)
      << res.destination.status.ToString();
  EXPECT_EQ((*sd)->State(), DeviceState::kRunning);
}

}  // namespace
}  // namespace gpumigrate
