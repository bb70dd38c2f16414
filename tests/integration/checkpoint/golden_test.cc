// The checkpoint golden files (tests/data/checkpoint), written by version 1.0 of
// the format: every later version must still read, verify and restore them.
#include <gtest/gtest.h>

#include "gpumigrate/checkpoint/checkpoint.h"
#include "gpumigrate/devices/sim.h"

namespace gpumigrate {
namespace {

std::string Data(const std::string& name) { return std::string(GPUMIGRATE_SOURCE_DIR) + "/tests/data/checkpoint/" + name; }

TEST(CheckpointGolden, PlainStopAndCopyFileVerifiesAndRestores) {
  auto info = VerifyCheckpoint(Data("small-v1.0.ckpt"), RestoreOptions{});
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->version_major, 1);
  EXPECT_EQ(info->version_minor, 0);
  EXPECT_FALSE(info->encrypted);
  EXPECT_FALSE(info->live);
  EXPECT_EQ(info->source_fate, "stop");
  ASSERT_EQ(info->regions.size(), 3u);
  EXPECT_EQ(info->regions[0].name, "weights");
  EXPECT_EQ(info->regions[0].page_size, 16384u);
  EXPECT_EQ(info->final_round, 0u);
  EXPECT_EQ(info->records, 10u);

  auto spec = ParseSimSpec(info->device);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto dst = SimDevice::Create(*spec, SimRole::kDestination);
  ASSERT_TRUE(dst.ok());
  MigrationReport r = RestoreCheckpoint(Data("small-v1.0.ckpt"), **dst, RestoreOptions{});
  ASSERT_EQ(r.outcome, Outcome::kCompleted) << r.status.ToString();
  EXPECT_TRUE(r.verified);
}

TEST(CheckpointGolden, EncryptedLiveFileNeedsItsKey) {
  auto head = ReadCheckpointInfo(Data("small-encrypted-v1.0.ckpt"), std::nullopt);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_TRUE(head->encrypted);
  EXPECT_FALSE(head->manifest_read);
  auto key = ReadKeyFile(Data("small-encrypted-v1.0.key"));
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  RestoreOptions o;
  o.key = *key;
  auto info = VerifyCheckpoint(Data("small-encrypted-v1.0.ckpt"), o);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_TRUE(info->live);
  EXPECT_GT(info->final_round, 0u) << "pre-copy rounds, then the final one";
}

TEST(CheckpointGolden, KeyFileMustHold32Bytes) {
  auto k = ReadKeyFile(Data("small-v1.0.ckpt"));
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("exactly 32 bytes"), std::string::npos);
}

}  // namespace
}  // namespace gpumigrate
