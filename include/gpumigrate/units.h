// Parsing and printing of the sizes, rates and durations the CLI contract names.
//
//   sizes      "4096", "256MiB", "80GB", "1.5GiB", "64KiB", "2T"   (bytes; SI and IEC)
//   rates      "100Gbit", "25Gbit/s", "2GiB/s", "500MB/s", "800Mbps" (bytes per second)
//   durations  "300ms", "100s", "2m", "250us", "1.5s"
//
// Pure functions, no I/O. Errors name the text and what was expected.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpumigrate/status.h"

namespace gpumigrate {

Result<uint64_t> ParseSize(std::string_view text);
Result<double> ParseRateBytesPerS(std::string_view text);
Result<std::chrono::nanoseconds> ParseDuration(std::string_view text);

// "3.98 GiB", "512 KiB", "17 B".
std::string FormatBytes(double bytes);
// "1.23 GB/s" (decimal, as links are sold).
std::string FormatRate(double bytes_per_s);

}  // namespace gpumigrate
