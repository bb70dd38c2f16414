#include "gpumigrate/units.h"

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

TEST(Units, Sizes) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("256MiB"), 256ull << 20);
  EXPECT_EQ(*ParseSize("80GB"), 80'000'000'000ull);
  EXPECT_EQ(*ParseSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseSize("64kib"), 64ull << 10);
  EXPECT_EQ(*ParseSize(" 2 TiB "), 2ull << 40);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("GiB").ok());
  EXPECT_FALSE(ParseSize("12 parsecs").ok());
  EXPECT_NE(ParseSize("12 parsecs").status().message().find("unknown unit 'parsecs'"), std::string::npos);
  EXPECT_FALSE(ParseSize("-5MiB").ok());
  EXPECT_FALSE(ParseSize("1e30").ok());
}

TEST(Units, Rates) {
  EXPECT_DOUBLE_EQ(*ParseRateBytesPerS("100Gbit"), 100e9 / 8);
  EXPECT_DOUBLE_EQ(*ParseRateBytesPerS("25Gbit/s"), 25e9 / 8);
  EXPECT_DOUBLE_EQ(*ParseRateBytesPerS("800Mbps"), 100e6);
  EXPECT_DOUBLE_EQ(*ParseRateBytesPerS("2GiB/s"), 2.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(*ParseRateBytesPerS("500MB/s"), 500e6);
  EXPECT_FALSE(ParseRateBytesPerS("500MB").ok());  // a size, not a rate
  EXPECT_FALSE(ParseRateBytesPerS("0MB/s").ok());
  EXPECT_FALSE(ParseRateBytesPerS("3furlongs/s").ok());
}

TEST(Units, Durations) {
  using namespace std::chrono;
  EXPECT_EQ(*ParseDuration("300ms"), milliseconds(300));
  EXPECT_EQ(*ParseDuration("100s"), seconds(100));
  EXPECT_EQ(*ParseDuration("1.5s"), milliseconds(1500));
  EXPECT_EQ(*ParseDuration("250us"), microseconds(250));
  EXPECT_EQ(*ParseDuration("2m"), minutes(2));
  EXPECT_FALSE(ParseDuration("soon").ok());
  EXPECT_FALSE(ParseDuration("3 fortnights").ok());
}

TEST(Units, Formatting) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(4.0 * (1ull << 30)), "4.00 GiB");
  EXPECT_EQ(FormatRate(1.5e9), "1.50 GB/s");
}

}  // namespace
}  // namespace gpumigrate
