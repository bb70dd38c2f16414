#include "gpumigrate/devices/device.h"

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

std::vector<RegionInfo> TwoRegions() {
  RegionInfo a;
  a.id = 0;
  a.name = "weights";
  a.size_bytes = 8192;
  RegionInfo b;
  b.id = 2;  // ids need not be dense
  b.name = "kv_cache";
  b.size_bytes = 4096;
  return {a, b};
}

TEST(CheckRange, AcceptsRangesInsideTheRegionUpToItsEnd) {
  const auto regions = TwoRegions();
  EXPECT_TRUE(CheckRange("test device", "read", regions, 0, 0, 8192).ok());
  EXPECT_TRUE(CheckRange("test device", "read", regions, 0, 8192, 0).ok());
  EXPECT_TRUE(CheckRange("test device", "write", regions, 2, 4000, 96).ok());
}

TEST(CheckRange, RejectsAnUnknownRegionNamingIt) {
  Status s = CheckRange("test device", "read", TwoRegions(), 1, 0, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("test device: read failed: no region 1"), std::string::npos) << s.message();
}

TEST(CheckRange, RejectsRangesPastTheEndWithoutWrappingAround) {
  const auto regions = TwoRegions();
  Status s = CheckRange("test device", "write", regions, 2, 4000, 97);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("test device: write failed: [4000, +97) is outside region 2 'kv_cache' (4096 bytes)"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(CheckRange("test device", "read", regions, 0, 8193, 0).ok());
  // offset + length wraps to a small number: must still be refused.
  EXPECT_FALSE(CheckRange("test device", "read", regions, 0, 4096, UINT64_MAX - 100).ok());
}

TEST(DeviceRole, NamesAndTransitionsFollowTheRole) {
  EXPECT_EQ(DeviceRoleName(DeviceRole::kSource), "source");
  EXPECT_EQ(DeviceRoleName(DeviceRole::kDestination), "destination");
  EXPECT_TRUE(CheckTransition("t", DeviceRole::kSource, DeviceState::kRunning, DeviceState::kPreCopy).ok());
  Status s = CheckTransition("t", DeviceRole::kDestination, DeviceState::kRunning, DeviceState::kPreCopy);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("on a destination device"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace gpumigrate
