#include "gpumigrate/common/units.h"

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

TEST(Units, BareNumbers) {
  EXPECT_EQ(*ParseUint("0"), 0u);
  EXPECT_EQ(*ParseUint("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(*ParseUint("443", 0, 65535), 443u);
  EXPECT_FALSE(ParseUint("").ok());
  EXPECT_FALSE(ParseUint("12x").ok());
  EXPECT_FALSE(ParseUint(" 12").ok());
  EXPECT_FALSE(ParseUint("-1").ok());  // std::stoull would have wrapped it around
  EXPECT_FALSE(ParseUint("18446744073709551616").ok());
  EXPECT_NE(ParseUint("65536", 0, 65535).status().message().find("'65536' is outside 0..65535"), std::string::npos);
  EXPECT_NE(ParseUint("0", 1).status().message().find("outside 1.."), std::string::npos);
  EXPECT_NE(ParseUint("abc").status().message().find("'abc' is not a whole number"), std::string::npos);

  EXPECT_EQ(*ParseInt("-3"), -3);
  EXPECT_EQ(*ParseInt("22", 1, 22), 22);
  EXPECT_FALSE(ParseInt("23", 1, 22).ok());
  EXPECT_FALSE(ParseInt("3.5").ok());

  EXPECT_DOUBLE_EQ(*ParseDouble("0.75"), 0.75);
  EXPECT_DOUBLE_EQ(*ParseDouble("1"), 1.0);
  EXPECT_DOUBLE_EQ(*ParseDouble("-2.5"), -2.5);
  EXPECT_FALSE(ParseDouble("").ok());
  EXPECT_FALSE(ParseDouble("0.5x").ok());
  EXPECT_NE(ParseDouble("half").status().message().find("'half' is not a number"), std::string::npos);
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

// The CLI's flag defaults are written from the engine's (switchover.h): each
// spelling reads back as the value it came from.
TEST(Units, DurationsFormatAsTheyParse) {
  using namespace std::chrono;
  EXPECT_EQ(FormatDuration(milliseconds(300)), "300ms");
  EXPECT_EQ(FormatDuration(seconds(100)), "100s");
  EXPECT_EQ(FormatDuration(microseconds(250)), "250us");
  EXPECT_EQ(FormatDuration(milliseconds(1500)), "1500ms");
  for (nanoseconds d : {nanoseconds(milliseconds(300)), nanoseconds(seconds(100)), nanoseconds(microseconds(250)),
                        nanoseconds(milliseconds(1500))}) {
    auto back = ParseDuration(FormatDuration(d));
    ASSERT_TRUE(back.ok()) << FormatDuration(d);
    EXPECT_EQ(*back, d);
  }
}

TEST(Units, Formatting) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(4.0 * (1ull << 30)), "4.00 GiB");
  EXPECT_EQ(FormatRate(1.5e9), "1.50 GB/s");
}

}  // namespace
}  // namespace gpumigrate
