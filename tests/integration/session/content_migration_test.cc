// Content-addressed pre-copy, in process: a destination whose content store
// holds the source's weights fills them from it instead of receiving them, and
// every guard holds (a different model fills nothing and costs a probe, a store
// file rewritten under the index is not used, the source can refuse to offer).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "gpumigrate/content/content_store.h"
#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "tests/support/device_compare.h"

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;
using testing::DevicesEqual;

constexpr const char* kContentSpec = "sim:size=32MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms,layers=16";

std::unique_ptr<SimDevice> MakeSim(const std::string& text, SimRole role) {
  auto spec = ParseSimSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto d = SimDevice::Create(*spec, role);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return std::move(d).value();
}

uint64_t ContentStaticBytes(Device& d) {
  uint64_t n = 0;
  for (const auto& r : d.Regions()) n += r.hint == RegionHint::kStatic ? r.size_bytes : 0;
  return n;
}

class ContentMigration : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gm-content-mig-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    store_ = tmpl;
  }
  void TearDown() override { fs::remove_all(store_); }

  // Seeds the store with the static regions of a sim of `spec`.
  void Seed(const std::string& spec) {
    auto d = MakeSim(spec, SimRole::kSource);
    auto w = DumpRegions(*d, store_, "model", /*static_only=*/true, nullptr);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
  }

  struct Run {
    LocalMigrationResult res;
    ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
    uint64_t static_bytes = 0;
  };
  Run Migrate(bool offer = true) {
    auto src = MakeSim(kContentSpec, SimRole::kSource);
    auto dst = MakeSim(kContentSpec, SimRole::kDestination);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    Run run;
    run.static_bytes = ContentStaticBytes(*src);
    LocalMigrationOptions opt;
    opt.data_streams = 2;
    opt.source.downtime_target = std::chrono::milliseconds(20);
    opt.source.content_offer = offer;
    opt.destination.content_store_dir = store_;
    opt.destination.on_phase = [&](Phase phase, uint32_t) {
      if (phase == Phase::kCommitReceived) run.equal = DevicesEqual(*src, *dst);
    };
    run.res = MigrateLocally(*src, *dst, opt);
    return run;
  }

  // Indexes the store, then overwrites one MiB in every `every` of its weights
  // file with junk, putting its size and mtime back as they were.
  void RewriteWeightsKeepingMtime(uint64_t every) {
    ASSERT_TRUE(ContentStore::Open(store_, {.page_size = 16 << 10}).ok());
    const std::string file = store_ + "/model.weights.raw";
    struct stat before {};
    ASSERT_EQ(::stat(file.c_str(), &before), 0);
    {
      std::fstream f(file, std::ios::binary | std::ios::in | std::ios::out);
      std::vector<char> junk(1 << 20, 'x');
      for (uint64_t off = 0; off < static_cast<uint64_t>(before.st_size); off += every * junk.size()) {
        f.seekp(static_cast<std::streamoff>(off));
        f.write(junk.data(), static_cast<std::streamsize>(std::min<uint64_t>(junk.size(), before.st_size - off)));
      }
    }
    struct timespec times[2] = {before.st_atim, before.st_mtim};
    ASSERT_EQ(::utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
    struct stat after {};
    ASSERT_EQ(::stat(file.c_str(), &after), 0);
    ASSERT_EQ(after.st_size, before.st_size);
  }

  std::string store_;
};

TEST_F(ContentMigration, WeightsTheDestinationHoldsAreFilledThereNotSent) {
  Seed(kContentSpec);
  Run run = Migrate();
  const MigrationReport& s = run.res.source;
  const MigrationReport& d = run.res.destination;
  ASSERT_EQ(s.outcome, Outcome::kCompleted) << s.status.ToString();
  ASSERT_EQ(d.outcome, Outcome::kCompleted) << d.status.ToString();
  EXPECT_TRUE(s.verified && d.verified);
  EXPECT_TRUE(run.equal);
  // Nearly all of the weights were filled at the destination (the first runs
  // of each region are probed before the first answer comes back).
  EXPECT_GE(d.dedup_bytes, run.static_bytes * 8 / 10) << d.dedup_bytes << " of " << run.static_bytes;
  EXPECT_EQ(s.dedup_bytes, d.dedup_bytes);
  EXPECT_EQ(s.dedup_pages, d.dedup_pages);
  EXPECT_EQ(s.offered_pages, d.offered_pages);
  EXPECT_GT(d.content_store_pages, 0u);
  // Round 0's page bytes are the device less what was filled (later rounds
  // send what the workload dirtied, as many as a loaded machine makes it run).
  ASSERT_FALSE(s.rounds.empty());
  EXPECT_GT(s.rounds[0].offered_pages, 0u);
  EXPECT_LE(s.rounds[0].raw_bytes + d.dedup_bytes, s.device_bytes);
  EXPECT_LT(s.rounds[0].bytes, s.device_bytes / 2) << "the weights (60%) did not cross the link";
}

TEST_F(ContentMigration, ADifferentModelFillsNothingAndTheOfferBacksOff) {
  Seed("sim:size=32MiB,hot=2MiB,kv_rate=32MiB/s,page=16KiB,step=2ms,layers=16,seed=7");
  Run run = Migrate();
  const MigrationReport& s = run.res.source;
  ASSERT_EQ(s.outcome, Outcome::kCompleted) << s.status.ToString();
  EXPECT_TRUE(s.verified && run.res.destination.verified);
  EXPECT_TRUE(run.equal);
  EXPECT_EQ(run.res.destination.dedup_pages, 0u);
  EXPECT_EQ(s.dedup_bytes, 0u);
  // Offered: the probe window of each region and the occasional re-probe, not the device.
  const uint64_t pages = s.device_bytes / (16 << 10);
  EXPECT_GT(s.offered_pages, 0u);
  EXPECT_LT(s.offered_pages, pages / 3) << s.offered_pages << " of " << pages << " pages offered";
  uint64_t missed = 0;
  for (const auto& r : s.rounds) missed += r.offer_missed_pages;
  EXPECT_EQ(missed, s.offered_pages) << "every offered page missed and went again with data";
}

TEST_F(ContentMigration, AStoreFileRewrittenUnderItsIndexIsNotUsed) {
  Seed(kContentSpec);
  // Index it, then rewrite every page of the weights file in place keeping size
  // and mtime: the index still says it holds them. A store that trusted the
  // index would fill pages with the wrong bytes. (Every page: which of them a
  // fill meets first depends on how the data streams interleave, and a run of
  // still-matching pages may be filled, correctly, before a changed one marks
  // the file.)
  RewriteWeightsKeepingMtime(/*every=*/1);
  Run run = Migrate();
  const MigrationReport& s = run.res.source;
  ASSERT_EQ(s.outcome, Outcome::kCompleted) << s.status.ToString();
  EXPECT_TRUE(s.verified && run.res.destination.verified);
  EXPECT_TRUE(run.equal);
  EXPECT_EQ(run.res.destination.dedup_pages, 0u) << "the rewritten file's pages fail their digest: none used";
}

// One MiB in every four rewritten in place, mtime kept: pages that still match
// may be filled (their bytes are checked), changed ones never; the VM arrives
// byte for byte whichever the streams meet first.
TEST_F(ContentMigration, AStoreFilePartlyRewrittenFillsOnlyWhatStillMatches) {
  Seed(kContentSpec);
  RewriteWeightsKeepingMtime(/*every=*/4);
  Run run = Migrate();
  ASSERT_EQ(run.res.source.outcome, Outcome::kCompleted) << run.res.source.status.ToString();
  EXPECT_TRUE(run.res.source.verified && run.res.destination.verified);
  EXPECT_TRUE(run.equal);
  EXPECT_LE(run.res.destination.dedup_bytes, run.static_bytes * 3 / 4) << "never a rewritten page";
}

TEST_F(ContentMigration, ASourceToldNotToOfferSendsEveryPage) {
  Seed(kContentSpec);
  Run run = Migrate(/*offer=*/false);
  ASSERT_EQ(run.res.source.outcome, Outcome::kCompleted) << run.res.source.status.ToString();
  EXPECT_TRUE(run.equal);
  EXPECT_EQ(run.res.source.offered_pages, 0u);
  EXPECT_EQ(run.res.destination.dedup_pages, 0u);
}

}  // namespace
}  // namespace gpumigrate
