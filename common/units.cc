#include "gpumigrate/common/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

#include <fmt/format.h>

namespace gpumigrate {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Splits "12.5GiB" into 12.5 and "gib" (lower-cased, spaces trimmed).
Result<std::pair<double, std::string>> SplitNumber(std::string_view text, std::string_view what) {
  std::string_view t = text;
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  size_t i = 0;
  while (i < t.size() && (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '.')) ++i;
  if (i == 0) {
    return InvalidArgument(fmt::format("units: parse {} failed: '{}' does not start with a number", what, text));
  }
  double value = 0;
  auto [ptr, ec] = std::from_chars(t.data(), t.data() + i, value);
  if (ec != std::errc() || ptr != t.data() + i || !std::isfinite(value) || value < 0) {
    return InvalidArgument(fmt::format("units: parse {} failed: '{}' is not a valid number", what, text));
  }
  std::string_view unit = t.substr(i);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.remove_prefix(1);
  return std::make_pair(value, Lower(unit));
}

// Multiplier for a byte-size unit ("" = bytes); 0 when unknown.
double SizeUnit(const std::string& u) {
  if (u.empty() || u == "b") return 1;
  if (u == "k" || u == "kb") return 1e3;
  if (u == "m" || u == "mb") return 1e6;
  if (u == "g" || u == "gb") return 1e9;
  if (u == "t" || u == "tb") return 1e12;
  if (u == "kib") return 1024.0;
  if (u == "mib") return 1024.0 * 1024;
  if (u == "gib") return 1024.0 * 1024 * 1024;
  if (u == "tib") return 1024.0 * 1024 * 1024 * 1024;
  return 0;
}

// The whole of `text` as an integer of type T within [min, max].
template <typename T>
Result<T> ParseWhole(std::string_view text, T min, T max) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) {
    return InvalidArgument(fmt::format("units: parse number failed: '{}' is outside {}..{}", text, min, max));
  }
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgument(fmt::format("units: parse number failed: '{}' is not a whole number", text));
  }
  if (value < min || value > max) {
    return InvalidArgument(fmt::format("units: parse number failed: '{}' is outside {}..{}", text, min, max));
  }
  return value;
}

}  // namespace

Result<uint64_t> ParseUint(std::string_view text, uint64_t min, uint64_t max) {
  return ParseWhole<uint64_t>(text, min, max);
}

Result<int64_t> ParseInt(std::string_view text, int64_t min, int64_t max) {
  return ParseWhole<int64_t>(text, min, max);
}

Result<double> ParseDouble(std::string_view text) {
  double value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return InvalidArgument(fmt::format("units: parse number failed: '{}' is not a number", text));
  }
  return value;
}

Result<uint64_t> ParseSize(std::string_view text) {
  GM_ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "size"));
  double mult = SizeUnit(parts.second);
  if (mult == 0) {
    return InvalidArgument(fmt::format(
        "units: parse size failed: unknown unit '{}' in '{}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
        parts.second, text));
  }
  double bytes = parts.first * mult;
  if (bytes > 1.8e19) return InvalidArgument(fmt::format("units: parse size failed: '{}' is too large", text));
  return static_cast<uint64_t>(std::llround(bytes));
}

Result<double> ParseRateBytesPerS(std::string_view text) {
  GM_ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "rate"));
  std::string u = parts.second;
  double value = parts.first;
  auto strip = [&u](std::string_view suffix) {
    if (u.size() >= suffix.size() && u.compare(u.size() - suffix.size(), suffix.size(), suffix) == 0) {
      u.resize(u.size() - suffix.size());
      return true;
    }
    return false;
  };
  // Bits: "gbit", "gbit/s", "gbps", "mbps".
  bool bits = false;
  if (strip("bit/s") || strip("bits/s") || strip("bit") || strip("bits") || strip("bps")) {
    bits = true;
  } else if (!strip("/s")) {
    return InvalidArgument(fmt::format(
        "units: parse rate failed: '{}' needs a unit per second, e.g. 2GiB/s, 500MB/s or 25Gbit", text));
  }
  double mult = 1;
  if (bits) {
    if (u.empty()) mult = 1;
    else if (u == "k") mult = 1e3;
    else if (u == "m") mult = 1e6;
    else if (u == "g") mult = 1e9;
    else if (u == "t") mult = 1e12;
    else return InvalidArgument(fmt::format("units: parse rate failed: unknown unit in '{}'", text));
    mult /= 8.0;
  } else {
    mult = SizeUnit(u);
    if (mult == 0) return InvalidArgument(fmt::format("units: parse rate failed: unknown unit in '{}'", text));
  }
  double rate = value * mult;
  if (rate <= 0) return InvalidArgument(fmt::format("units: parse rate failed: '{}' must be positive", text));
  return rate;
}

Result<std::chrono::nanoseconds> ParseDuration(std::string_view text) {
  GM_ASSIGN_OR_RETURN(auto parts, SplitNumber(text, "duration"));
  const std::string& u = parts.second;
  double ns_per_unit;
  if (u == "ns") ns_per_unit = 1;
  else if (u == "us") ns_per_unit = 1e3;
  else if (u == "ms") ns_per_unit = 1e6;
  else if (u == "s" || u.empty()) ns_per_unit = 1e9;
  else if (u == "m" || u == "min") ns_per_unit = 60e9;
  else if (u == "h") ns_per_unit = 3600e9;
  else {
    return InvalidArgument(fmt::format(
        "units: parse duration failed: unknown unit '{}' in '{}' (use ns, us, ms, s, m, h)", u, text));
  }
  double ns = parts.first * ns_per_unit;
  if (ns > 9e18) return InvalidArgument(fmt::format("units: parse duration failed: '{}' is too long", text));
  return std::chrono::nanoseconds(static_cast<int64_t>(std::llround(ns)));
}

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int i = 0;
  while (std::fabs(bytes) >= 1024 && i < 5) {
    bytes /= 1024;
    ++i;
  }
  if (i == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.2f} {}", bytes, kUnits[i]);
}

std::string FormatRate(double bytes_per_s) {
  static const char* kUnits[] = {"B/s", "KB/s", "MB/s", "GB/s", "TB/s"};
  int i = 0;
  while (bytes_per_s >= 1000 && i < 4) {
    bytes_per_s /= 1000;
    ++i;
  }
  return fmt::format("{:.2f} {}", bytes_per_s, kUnits[i]);
}

std::string FormatDuration(std::chrono::nanoseconds d) {
  const int64_t ns = d.count();
  if (ns % 1'000'000'000 == 0) return fmt::format("{}s", ns / 1'000'000'000);
  if (ns % 1'000'000 == 0) return fmt::format("{}ms", ns / 1'000'000);
  if (ns % 1'000 == 0) return fmt::format("{}us", ns / 1'000);
  return fmt::format("{}ns", ns);
}

}  // namespace gpumigrate
