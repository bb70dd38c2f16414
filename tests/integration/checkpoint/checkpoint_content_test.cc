// checkpoint --content-store, in process: pre-copy pages the store holds are
// recorded as their SHA-256 and a restore fills them from the same store; a
// file that needs a store is refused without one, and a store that no longer
// holds a page the file left to it is named, before the device is touched.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "gpumigrate/checkpoint/checkpoint.h"
#include "gpumigrate/content/content_store.h"
#include "gpumigrate/devices/sim.h"
#include "tests/support/device_compare.h"

namespace gpumigrate {
namespace {

using testing::DevicesEqual;
namespace fs = std::filesystem;

constexpr const char* kStoreCkptSpec = "sim:size=32MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms,layers=16";

std::unique_ptr<SimDevice> StoreCkptSim(SimRole role) {
  auto s = ParseSimSpec(kStoreCkptSpec);
  EXPECT_TRUE(s.ok());
  auto d = SimDevice::Create(*s, role);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

uint64_t StoreCkptStaticBytes(const Device& d) {
  uint64_t n = 0;
  for (const auto& r : d.Regions()) n += r.hint == RegionHint::kStatic ? r.size_bytes : 0;
  return n;
}

class CheckpointContent : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("gm-ckpt-content-{}-{}", getpid(), ::testing::UnitTest::GetInstance()->random_seed());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "store");
    store_ = (dir_ / "store").string();
    // The store holds this model's weights: another instance's static regions.
    auto seed = StoreCkptSim(SimRole::kSource);
    auto w = DumpRegions(*seed, store_, "model", /*static_only=*/true, nullptr);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  CheckpointReport Take(SimDevice& src, const std::string& file, const std::string& store) {
    CheckpointOptions o;
    o.session.bandwidth_limit_bytes_per_s = 200e6;
    o.session.downtime_target = std::chrono::milliseconds(20);
    o.then = SourceFate::kStop;  // kept stopped to compare with
    o.content_store = store;
    return WriteCheckpoint(src, file, o);
  }
  ::testing::AssertionResult RestoresTo(const std::string& file, Device& source, const std::string& store) {
    auto dst = StoreCkptSim(SimRole::kDestination);
    ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
    RestoreOptions ro;
    ro.session.content_store_dir = store;
    ro.session.on_phase = [&](Phase p, uint32_t) {
      if (p == Phase::kCommitReceived) equal = DevicesEqual(source, *dst);
    };
    MigrationReport r = RestoreCheckpoint(file, *dst, ro);
    if (r.outcome != Outcome::kCompleted) return ::testing::AssertionFailure() << r.status.ToString();
    if (dst->State() != DeviceState::kRunning) return ::testing::AssertionFailure() << "restored device not running";
    return equal;
  }

  fs::path dir_;
  std::string store_;
};

TEST_F(CheckpointContent, TheWeightsTheStoreHoldsStayOutOfTheFileAndTheRestoreFillsThem) {
  auto plain_src = StoreCkptSim(SimRole::kSource);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CheckpointReport plain = Take(*plain_src, Path("plain.ckpt"), "");
  ASSERT_EQ(plain.migration.outcome, Outcome::kCompleted) << plain.migration.status.ToString();

  auto src = StoreCkptSim(SimRole::kSource);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CheckpointReport r = Take(*src, Path("held.ckpt"), store_);
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  const uint64_t weights = StoreCkptStaticBytes(*src);
  // Nearly all of the weights (zero pages never go; the first runs are
  // probed before the first answer comes back).
  EXPECT_GE(r.migration.dedup_bytes, weights * 8 / 10) << "the weights were left to the store";
  // Round 0 wrote each page once: the held file's lacks the weights. (Later
  // rounds carry what the workload dirtied, as many as a loaded machine makes
  // it run, so whole files are not compared.)
  ASSERT_FALSE(r.migration.rounds.empty());
  ASSERT_FALSE(plain.migration.rounds.empty());
  EXPECT_LT(r.migration.rounds[0].bytes + r.migration.dedup_bytes * 9 / 10, plain.migration.rounds[0].bytes)
      << "held round 0 " << r.migration.rounds[0].bytes << " bytes, plain " << plain.migration.rounds[0].bytes
      << ", weights " << weights;
  EXPECT_EQ(r.content_store, store_);

  auto info = ReadCheckpointInfo(Path("held.ckpt"), std::nullopt);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->content_store, fs::absolute(store_).string());
  EXPECT_EQ(info->version_minor, 1) << "readers before 1.1 must refuse a file that needs a store";
  auto plain_info = ReadCheckpointInfo(Path("plain.ckpt"), std::nullopt);
  ASSERT_TRUE(plain_info.ok());
  EXPECT_EQ(plain_info->version_minor, 0);

  RestoreOptions vo;
  vo.session.content_store_dir = store_;
  auto v = VerifyCheckpoint(Path("held.ckpt"), vo);
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(RestoresTo(Path("held.ckpt"), *src, store_));
}

TEST_F(CheckpointContent, AnEncryptedChainOverAStoreRestoresWithIt) {
  FileKey key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<std::byte>(i * 13 + 5);
  auto src = StoreCkptSim(SimRole::kSource);
  CheckpointOptions o;
  o.session.bandwidth_limit_bytes_per_s = 200e6;
  o.session.downtime_target = std::chrono::milliseconds(20);
  o.key = key;
  o.content_store = store_;
  CheckpointReport base = WriteCheckpoint(*src, Path("base.ckpt"), o);  // the source runs on
  ASSERT_EQ(base.migration.outcome, Outcome::kCompleted) << base.migration.status.ToString();
  EXPECT_GT(base.migration.dedup_pages, 0u) << "the recorder opened the sealed digests";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  o.base = Path("base.ckpt");
  o.then = SourceFate::kStop;
  CheckpointReport top = WriteCheckpoint(*src, Path("top.ckpt"), o);
  ASSERT_EQ(top.migration.outcome, Outcome::kCompleted) << top.migration.status.ToString();
  EXPECT_EQ(top.chain_depth, 1u);
  auto dst = StoreCkptSim(SimRole::kDestination);
  ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
  RestoreOptions ro;
  ro.key = key;
  ro.session.content_store_dir = store_;
  ro.session.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kCommitReceived) equal = DevicesEqual(*src, *dst);
  };
  MigrationReport r = RestoreCheckpoint(Path("top.ckpt"), *dst, ro);
  ASSERT_EQ(r.outcome, Outcome::kCompleted) << r.status.ToString();
  EXPECT_TRUE(equal);
}

TEST_F(CheckpointContent, AFileThatNeedsAStoreIsRefusedWithoutOneNamingIt) {
  auto src = StoreCkptSim(SimRole::kSource);
  CheckpointReport r = Take(*src, Path("held.ckpt"), store_);
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  ASSERT_GT(r.migration.dedup_pages, 0u);
  auto v = VerifyCheckpoint(Path("held.ckpt"), {});
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument) << v.status().ToString();
  EXPECT_NE(v.status().message().find("--content-store"), std::string::npos) << v.status().ToString();
  EXPECT_NE(v.status().message().find(fs::absolute(store_).string()), std::string::npos) << v.status().ToString();
  auto dst = StoreCkptSim(SimRole::kDestination);
  MigrationReport rr = RestoreCheckpoint(Path("held.ckpt"), *dst, {});
  EXPECT_NE(rr.outcome, Outcome::kCompleted);
  EXPECT_NE(rr.status.message().find("--content-store"), std::string::npos) << rr.status.ToString();
  EXPECT_NE(dst->State(), DeviceState::kRunning);
}

TEST_F(CheckpointContent, AStoreThatLostAPageTheFileLeftToItIsNamedBeforeTheDeviceIsTouched) {
  auto src = StoreCkptSim(SimRole::kSource);
  CheckpointReport r = Take(*src, Path("held.ckpt"), store_);
  ASSERT_EQ(r.migration.outcome, Outcome::kCompleted) << r.migration.status.ToString();
  ASSERT_GT(r.migration.dedup_pages, 0u);
  // The store's weights are replaced by other bytes (a new file, re-indexed).
  for (const auto& e : fs::directory_iterator(store_)) {
    if (e.path().filename().string().rfind(".", 0) == 0) continue;
    const auto size = fs::file_size(e.path());
    fs::remove(e.path());
    std::ofstream f(e.path(), std::ios::binary);
    std::vector<char> junk(size, 'x');
    f.write(junk.data(), static_cast<std::streamsize>(size));
  }
  RestoreOptions ro;
  ro.session.content_store_dir = store_;
  auto dst = StoreCkptSim(SimRole::kDestination);
  bool wrote = false;
  ro.session.on_phase = [&](Phase p, uint32_t) { wrote |= p == Phase::kCommitReceived; };
  MigrationReport rr = RestoreCheckpoint(Path("held.ckpt"), *dst, ro);
  ASSERT_NE(rr.outcome, Outcome::kCompleted);
  EXPECT_NE(rr.status.message().find("does not hold page"), std::string::npos) << rr.status.ToString();
  EXPECT_NE(rr.status.message().find("held.ckpt"), std::string::npos) << rr.status.ToString();
  EXPECT_NE(rr.resolution.find("nothing was written"), std::string::npos) << rr.resolution;
  EXPECT_FALSE(wrote);
  EXPECT_NE(dst->State(), DeviceState::kRunning);
}

TEST_F(CheckpointContent, AStopAndCopyCheckpointWithAStoreIsRefusedAsItWouldNeverOffer) {
  auto src = StoreCkptSim(SimRole::kSource);
  CheckpointOptions o;
  o.stop_first = true;
  o.content_store = store_;
  CheckpointReport r = WriteCheckpoint(*src, Path("s.ckpt"), o);
  EXPECT_EQ(r.migration.outcome, Outcome::kAborted);
  EXPECT_EQ(r.migration.status.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(Path("s.ckpt")));
  EXPECT_EQ(src->State(), DeviceState::kRunning);
}

}  // namespace
}  // namespace gpumigrate
