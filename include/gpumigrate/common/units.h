// Parsing and printing of the sizes, rates and durations the CLI contract names.
//
//   sizes      "4096", "256MiB", "80GB", "1.5GiB", "64KiB", "2T"   (bytes; SI and IEC)
//   rates      "100Gbit", "25Gbit/s", "2GiB/s", "500MB/s", "800Mbps" (bytes per second)
//   durations  "300ms", "100s", "2m", "250us", "1.5s"
//   numbers    "42", "-3", "0.75"  (bare: no unit, sign only where signed, no spaces)
//
// Pure functions, no I/O. Errors name the text and what was expected.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

Result<uint64_t> ParseSize(std::string_view text);
Result<double> ParseRateBytesPerS(std::string_view text);
Result<std::chrono::nanoseconds> ParseDuration(std::string_view text);
// The shortest exact spelling ParseDuration reads back: "300ms", "100s", "250us".
std::string FormatDuration(std::chrono::nanoseconds d);

// Bare numbers for keys, ports and flags: the whole text must be the number
// (std::from_chars; no exceptions, no locale). Errors read
// "units: parse number failed: ..." and name the text; callers that promise
// their own message wrap or replace it.
Result<uint64_t> ParseUint(std::string_view text, uint64_t min = 0, uint64_t max = UINT64_MAX);
Result<int64_t> ParseInt(std::string_view text, int64_t min = INT64_MIN, int64_t max = INT64_MAX);
Result<double> ParseDouble(std::string_view text);

// "3.98 GiB", "512 KiB", "17 B".
std::string FormatBytes(double bytes);
// "1.23 GB/s" (decimal, as links are sold).
std::string FormatRate(double bytes_per_s);

}  // namespace gpumigrate
