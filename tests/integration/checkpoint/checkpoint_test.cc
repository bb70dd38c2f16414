// Checkpoint files end to end, in process, with a running sim workload: live
// and stop-and-copy, encrypted, incremental chains, and the source's fate.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "gpumigrate/checkpoint/checkpoint.h"
#include "gpumigrate/devices/sim.h"
#include "tests/support/device_compare.h"

namespace gpumigrate {
namespace {

using testing::DevicesEqual;
namespace fs = std::filesystem;

constexpr const char* kSpec = "sim:size=24MiB,hot=2MiB,kv_rate=64MiB/s,page=16KiB,step=2ms,layers=16";

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("gm-ckpt-{}-{}", getpid(), ::testing::UnitTest::GetInstance()->random_seed());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static std::unique_ptr<SimDevice> Sim(SimRole role, const char* spec = kSpec) {
    auto s = ParseSimSpec(spec);
    EXPECT_TRUE(s.ok());
    auto d = SimDevice::Create(*s, role);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return std::move(d).value();
  }
  static CheckpointOptions Live() {
    CheckpointOptions o;
    o.session.bandwidth_limit_bytes_per_s = 100e6;  // several rounds while the workload writes
    o.session.downtime_target = std::chrono::milliseconds(20);
    return o;
  }
  // Restores `file` onto a fresh destination and compares it, before it runs a
  // kernel, with `source` (stopped at its checkpoint).
  ::testing::AssertionResult RestoresTo(const std::string& file, Device& source, RestoreOptions ro = {}) {
    auto dst = Sim(SimRole::kDestination);
    ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
    ro.session.on_phase = [&](Phase p, uint32_t) {
      if (p == Phase::kCommitReceived) equal = DevicesEqual(source, *dst);
    };
    MigrationReport r = RestoreCheckpoint(file, *dst, ro);
    if (r.outcome != Outcome::kCompleted) return ::testing::AssertionFailure() << r.status.ToString();
    if (!r.verified) return ::testing::AssertionFailure() << "restore not verified";
    if (dst->State() != DeviceState::kRunning) return ::testing::AssertionFailure() << "restored device not running";
    return equal;
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, LiveCheckpointRestoresTheSourceAtItsStop) {
  auto src = Sim(SimRole::kSource);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const uint64_t before = src->KernelsRun();
  CheckpointOptions o = Live();
  o.then = SourceFate::kStop;  // keep the source stopped to compare with
  CheckpointReport r = WriteCheckpoint(*src, Path("a.ckpt"), o);
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  EXPECT_GE(r.migration.rounds.size(), 3u) << "pre-copy rounds, then the final delta";
  EXPECT_GT(src->KernelsRun(), before) << "the workload ran during the live phase";
  EXPECT_EQ(src->State(), DeviceState::kStop);
  EXPECT_TRUE(fs::exists(Path("a.ckpt")));
  EXPECT_FALSE(fs::exists(Path("a.ckpt.partial")));
  EXPECT_EQ(r.file_bytes, fs::file_size(Path("a.ckpt")));
  EXPECT_GT(r.migration.stun_ms, 0);
  EXPECT_TRUE(RestoresTo(Path("a.ckpt"), *src));
}

TEST_F(CheckpointTest, StopFirstCopiesEverythingDuringTheStun) {
  auto src = Sim(SimRole::kSource);
  CheckpointOptions o;
  o.stop_first = true;
  o.then = SourceFate::kStop;
  CheckpointReport r = WriteCheckpoint(*src, Path("s.ckpt"), o);
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  ASSERT_EQ(r.migration.rounds.size(), 1u);
  EXPECT_TRUE(r.migration.rounds[0].final);
  EXPECT_TRUE(RestoresTo(Path("s.ckpt"), *src));
}

TEST_F(CheckpointTest, ResumeLetsTheSourceRunOnAndReleaseStopsIt) {
  auto src = Sim(SimRole::kSource);
  CheckpointReport r = WriteCheckpoint(*src, Path("r.ckpt"), Live());
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  EXPECT_EQ(src->State(), DeviceState::kRunning);
  const uint64_t k = src->KernelsRun();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_GT(src->KernelsRun(), k) << "resumed: the workload runs on";
  CheckpointOptions o = Live();
  o.then = SourceFate::kRelease;
  r = WriteCheckpoint(*src, Path("r2.ckpt"), o);
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  EXPECT_EQ(src->State(), DeviceState::kStop);
}

TEST_F(CheckpointTest, EncryptedFileNeedsItsKey) {
  auto src = Sim(SimRole::kSource);
  FileKey key{}, other{};
  std::mt19937_64 rng(7);
  for (auto& b : key) b = static_cast<std::byte>(rng());
  for (auto& b : other) b = static_cast<std::byte>(rng());
  CheckpointOptions o = Live();
  o.then = SourceFate::kStop;
  o.key = key;
  CheckpointReport r = WriteCheckpoint(*src, Path("e.ckpt"), o);
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  EXPECT_TRUE(r.encrypted);
  // The weights' bytes appear nowhere in the file (a page of them, in the clear, would).
  std::vector<std::byte> page(16384);
  ASSERT_TRUE(src->Read(src->Regions()[0].id, 0, page).ok());
  std::ifstream in(Path("e.ckpt"), std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(file.find(std::string(reinterpret_cast<const char*>(page.data()) + 1024, 64)), std::string::npos);

  auto info = ReadCheckpointInfo(Path("e.ckpt"), std::nullopt);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->encrypted);
  EXPECT_FALSE(info->manifest_read);
  RestoreOptions wrong;
  wrong.key = other;
  auto v = VerifyCheckpoint(Path("e.ckpt"), wrong);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("wrong key"), std::string::npos) << v.status().ToString();
  v = VerifyCheckpoint(Path("e.ckpt"), RestoreOptions{});
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("encrypted"), std::string::npos) << v.status().ToString();
  auto dst = Sim(SimRole::kDestination);
  MigrationReport bad = RestoreCheckpoint(Path("e.ckpt"), *dst, wrong);
  EXPECT_NE(bad.outcome, Outcome::kCompleted);
  EXPECT_EQ(dst->State(), DeviceState::kStop) << "nothing reached the device";
  RestoreOptions right;
  right.key = key;
  EXPECT_TRUE(RestoresTo(Path("e.ckpt"), *src, right));
}

TEST_F(CheckpointTest, KeyForAPlainFileIsRefused) {
  auto src = Sim(SimRole::kSource);
  CheckpointReport r = WriteCheckpoint(*src, Path("p.ckpt"), Live());
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted);
  RestoreOptions o;
  o.key = FileKey{};
  auto v = VerifyCheckpoint(Path("p.ckpt"), o);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("not encrypted"), std::string::npos) << v.status().ToString();
}

TEST_F(CheckpointTest, IncrementalChainThreeDeepSendsOnlyChangesAndRestores) {
  auto src = Sim(SimRole::kSource);
  CheckpointOptions o = Live();
  CheckpointReport full = WriteCheckpoint(*src, Path("c0.ckpt"), o);
  ASSERT_EQ(full.migration.outcome, Outcome::kCompleted) << full.migration.status.ToString();
  std::string base = Path("c0.ckpt");
  for (int i = 1; i <= 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CheckpointOptions inc = Live();
    inc.base = base;
    if (i == 3) inc.then = SourceFate::kStop;
    CheckpointReport r = WriteCheckpoint(*src, Path(fmt::format("c{}.ckpt", i)), inc);
    ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << i << ": " << r.migration.status.ToString();
    EXPECT_EQ(r.chain_depth, static_cast<uint32_t>(i));
    // Its first round skips what the base holds: the weights did not change.
    ASSERT_FALSE(r.migration.rounds.empty());
    EXPECT_GT(r.migration.rounds[0].known_pages, 0u);
    EXPECT_LT(r.migration.rounds[0].raw_bytes, full.migration.rounds[0].raw_bytes / 2);
    base = Path(fmt::format("c{}.ckpt", i));
  }
  auto v = VerifyCheckpoint(Path("c3.ckpt"), RestoreOptions{});
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->chain.size(), 4u);
  EXPECT_TRUE(RestoresTo(Path("c3.ckpt"), *src));
}

TEST_F(CheckpointTest, MissingOrDifferentBaseIsRefused) {
  auto src = Sim(SimRole::kSource);
  ASSERT_EQ(WriteCheckpoint(*src, Path("b.ckpt"), Live()).migration.outcome, Outcome::kCompleted);
  ASSERT_EQ(WriteCheckpoint(*src, Path("other.ckpt"), Live()).migration.outcome, Outcome::kCompleted);
  CheckpointOptions inc = Live();
  inc.base = Path("b.ckpt");
  ASSERT_EQ(WriteCheckpoint(*src, Path("i.ckpt"), inc).migration.outcome, Outcome::kCompleted);

  RestoreOptions different;
  different.base_paths = {Path("other.ckpt")};
  auto v = VerifyCheckpoint(Path("i.ckpt"), different);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("different checkpoint"), std::string::npos) << v.status().ToString();

  fs::remove(Path("b.ckpt"));
  auto dst = Sim(SimRole::kDestination);
  MigrationReport r = RestoreCheckpoint(Path("i.ckpt"), *dst, RestoreOptions{});
  EXPECT_NE(r.outcome, Outcome::kCompleted);
  EXPECT_NE(r.status.message().find("base"), std::string::npos) << r.status.ToString();
  EXPECT_EQ(dst->State(), DeviceState::kStop);

  // A base from another device's geometry is refused before anything is written.
  auto small = Sim(SimRole::kSource, "sim:size=8MiB,hot=1MiB,page=16KiB");
  CheckpointOptions wrong = Live();
  wrong.base = Path("other.ckpt");
  CheckpointReport w = WriteCheckpoint(*small, Path("w.ckpt"), wrong);
  EXPECT_NE(w.migration.outcome, Outcome::kCompleted);
  EXPECT_FALSE(fs::exists(Path("w.ckpt")));
  EXPECT_EQ(small->State(), DeviceState::kRunning);
}

TEST_F(CheckpointTest, AFailedCheckpointKeepsTheEarlierFileAndTheSourceRunning) {
  auto src = Sim(SimRole::kSource);
  ASSERT_EQ(WriteCheckpoint(*src, Path("keep.ckpt"), Live()).migration.outcome, Outcome::kCompleted);
  const auto before = fs::file_size(Path("keep.ckpt"));
  // Cancel in the middle of the pre-copy: the session rolls back.
  std::atomic<bool> cancel{false};
  CheckpointOptions o = Live();
  o.session.cancel = &cancel;
  o.session.on_phase = [&](Phase p, uint32_t round) {
    if (p == Phase::kRoundEnd && round == 1) cancel = true;
  };
  CheckpointReport r = WriteCheckpoint(*src, Path("keep.ckpt"), o);
  EXPECT_EQ(r.migration.outcome, Outcome::kAborted);
  EXPECT_EQ(src->State(), DeviceState::kRunning);
  EXPECT_FALSE(fs::exists(Path("keep.ckpt.partial")));
  EXPECT_EQ(fs::file_size(Path("keep.ckpt")), before);
  EXPECT_TRUE(VerifyCheckpoint(Path("keep.ckpt"), RestoreOptions{}).ok());
}

}  // namespace
}  // namespace gpumigrate
