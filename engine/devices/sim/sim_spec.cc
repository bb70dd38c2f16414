#include <string>
#include <vector>

#include <fmt/format.h>

#include "engine/devices/device_spec.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {
namespace {

Result<double> ParseFraction(std::string_view key, std::string_view value) {
  auto v = ParseDouble(value);
  if (!v.ok()) return InvalidArgument(fmt::format("device spec: '{}={}' is not a number", key, value));
  if (!(*v >= 0 && *v <= 1)) {
    return InvalidArgument(fmt::format("device spec: '{}={}' must be a fraction between 0 and 1", key, value));
  }
  return *v;
}

Result<uint64_t> ParseCount(std::string_view key, std::string_view value) {
  auto v = ParseUint(value);
  if (!v.ok()) return InvalidArgument(fmt::format("device spec: '{}={}' is not a whole number", key, value));
  return *v;
}

// The largest IEC unit that divides `bytes` exactly, so the text parses back to the same value.
std::string ExactSize(uint64_t bytes) {
  static const char* kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    uint64_t unit = uint64_t{1} << (10 * (4 - i));
    if (bytes >= unit && bytes % unit == 0) return fmt::format("{}{}", bytes / unit, kUnits[i]);
  }
  return fmt::format("{}B", bytes);
}

}  // namespace

std::string SimSpec::ToString() const {
  std::string step = step_period.count() % 1000 == 0 ? fmt::format("{}ms", step_period.count() / 1000)
                                                      : fmt::format("{}us", step_period.count());
  std::string rate = kv_rate_bytes_per_s <= 0 ? std::string("0")
                                              : ExactSize(static_cast<uint64_t>(kv_rate_bytes_per_s)) + "/s";
  return fmt::format("sim:size={},static={},kv={},kv_fill={},kv_rate={},hot={},page={},seed={},step={},layers={}{}",
                     ExactSize(size_bytes), static_fraction, kv_fraction, kv_fill, rate, ExactSize(hot_bytes),
                     ExactSize(page_size), seed, step, layers, noise ? ",data=noise" : "");
}

Result<SimSpec> ParseSimSpec(std::string_view text) {
  SimSpec spec;
  if (text == "sim" || text == "sim:llm") return spec;
  if (text.substr(0, 4) != "sim:") {
    return InvalidArgument(fmt::format("device spec: '{}' is not a sim spec (expected sim:llm or sim:key=value,...)", text));
  }
  GM_ASSIGN_OR_RETURN(SplitSpec split, SplitDeviceSpec(text));
  for (const SpecToken& token : split.tokens) {
    if (!token.has_value && token.key == "llm") continue;
    if (!token.has_value) {
      return InvalidArgument(fmt::format("device spec: '{}' in '{}' is not key=value", token.key, text));
    }
    std::string_view key = token.key, value = token.value;
    if (key == "size") {
      GM_ASSIGN_OR_RETURN(spec.size_bytes, ParseSize(value));
    } else if (key == "static") {
      GM_ASSIGN_OR_RETURN(spec.static_fraction, ParseFraction(key, value));
    } else if (key == "kv") {
      GM_ASSIGN_OR_RETURN(spec.kv_fraction, ParseFraction(key, value));
    } else if (key == "kv_fill") {
      GM_ASSIGN_OR_RETURN(spec.kv_fill, ParseFraction(key, value));
    } else if (key == "kv_rate") {
      if (value == "0") {
        spec.kv_rate_bytes_per_s = 0;
      } else {
        GM_ASSIGN_OR_RETURN(spec.kv_rate_bytes_per_s, ParseRateBytesPerS(value));
      }
    } else if (key == "hot") {
      GM_ASSIGN_OR_RETURN(spec.hot_bytes, ParseSize(value));
    } else if (key == "page") {
      GM_ASSIGN_OR_RETURN(uint64_t page, ParseSize(value));
      if (page < 4096 || page > (uint64_t{2} << 20) || (page & (page - 1)) != 0) {
        return InvalidArgument(fmt::format("device spec: page={} must be a power of two from 4KiB to 2MiB", value));
      }
      spec.page_size = static_cast<uint32_t>(page);
    } else if (key == "seed") {
      GM_ASSIGN_OR_RETURN(spec.seed, ParseCount(key, value));
    } else if (key == "step") {
      GM_ASSIGN_OR_RETURN(auto d, ParseDuration(value));
      spec.step_period = std::chrono::duration_cast<std::chrono::microseconds>(d);
      if (spec.step_period.count() <= 0) return InvalidArgument("device spec: step must be at least 1us");
    } else if (key == "layers") {
      GM_ASSIGN_OR_RETURN(uint64_t layers, ParseCount(key, value));
      if (layers == 0 || layers > 1024) return InvalidArgument("device spec: layers must be 1..1024");
      spec.layers = static_cast<uint32_t>(layers);
    } else if (key == "data") {
      if (value != "bf16" && value != "noise") {
        return InvalidArgument(fmt::format("device spec: data={} must be bf16 (model-like values) or noise (random "
                                           "bytes)", value));
      }
      spec.noise = value == "noise";
    } else {
      return InvalidArgument(fmt::format(
          "device spec: unknown key '{}' in '{}' (known: size, static, kv, kv_fill, kv_rate, hot, page, seed, step, "
          "layers, data)",
          key, text));
    }
  }
  if (spec.size_bytes < 4 * uint64_t{spec.page_size}) {
    return InvalidArgument(fmt::format("device spec: size={} is too small (at least 4 pages of {} bytes)",
                                       spec.size_bytes, spec.page_size));
  }
  if (spec.hot_bytes + static_cast<uint64_t>(spec.static_fraction * static_cast<double>(spec.size_bytes)) >
      spec.size_bytes) {
    return InvalidArgument(fmt::format("device spec: static={} and hot={} do not fit in size={}",
                                       spec.static_fraction, spec.hot_bytes, spec.size_bytes));
  }
  return spec;
}

}  // namespace gpumigrate
