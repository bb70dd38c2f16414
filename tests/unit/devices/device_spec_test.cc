#include "engine/devices/device_spec.h"

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

TEST(DeviceSpec, SplitsKindBareTokensAndKeyValues) {
  auto s = SplitDeviceSpec("proc:1234,tracker=hash,page=");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->kind, "proc");
  ASSERT_EQ(s->tokens.size(), 3u);
  EXPECT_EQ(s->tokens[0].key, "1234");
  EXPECT_FALSE(s->tokens[0].has_value);
  EXPECT_EQ(s->tokens[1].key, "tracker");
  EXPECT_EQ(s->tokens[1].value, "hash");
  EXPECT_TRUE(s->tokens[1].has_value);
  EXPECT_EQ(s->tokens[2].key, "page");
  EXPECT_EQ(s->tokens[2].value, "");
  EXPECT_TRUE(s->tokens[2].has_value);
}

TEST(DeviceSpec, ValueKeepsLaterEqualsSigns) {
  auto s = SplitDeviceSpec("sim:a=b=c");
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->tokens.size(), 1u);
  EXPECT_EQ(s->tokens[0].key, "a");
  EXPECT_EQ(s->tokens[0].value, "b=c");
}

TEST(DeviceSpec, KindAloneAndEmptyTokens) {
  auto bare = SplitDeviceSpec("sim");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->kind, "sim");
  EXPECT_TRUE(bare->tokens.empty());
  auto empty = SplitDeviceSpec("sim:,size=1GiB,,");
  ASSERT_TRUE(empty.ok());
  ASSERT_EQ(empty->tokens.size(), 1u);
  EXPECT_EQ(empty->tokens[0].key, "size");
  EXPECT_TRUE(SplitDeviceSpec("proc:")->tokens.empty());
}

TEST(DeviceSpec, RejectsAValueWithoutAKeyNamingIt) {
  auto s = SplitDeviceSpec("sim:size=1GiB,=5");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'=5' in 'sim:size=1GiB,=5' has no key"), std::string::npos)
      << s.status().message();
}

}  // namespace
}  // namespace gpumigrate
