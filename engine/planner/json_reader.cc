#include "engine/planner/json_reader.h"

#include <cmath>

#include <fmt/format.h>

#include "gpumigrate/common/units.h"

namespace gpumigrate::planner {

Status KeyError(const std::string& path, const std::string& message) {
  return InvalidArgument(fmt::format("{}: {}", path, message));
}

std::string Child(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

std::string Index(const std::string& path, size_t i) { return fmt::format("{}[{}]", path, i); }

const Json& Get(const Json& obj, const std::string& key) {
  static const Json kNull;
  auto it = obj.find(key);
  return it == obj.end() ? kNull : *it;
}

std::string Describe(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

Result<std::optional<std::string>> ReadString(const Json& obj, const std::string& key, const std::string& path) {
  const Json& v = Get(obj, key);
  if (v.is_null()) return std::optional<std::string>();
  if (!v.is_string()) return KeyError(Child(path, key), fmt::format("expected a string, got {}", Describe(v)));
  return std::optional<std::string>(v.get<std::string>());
}

Result<std::optional<bool>> ReadBool(const Json& obj, const std::string& key, const std::string& path) {
  const Json& v = Get(obj, key);
  if (v.is_null()) return std::optional<bool>();
  if (!v.is_boolean()) return KeyError(Child(path, key), fmt::format("expected true or false, got {}", Describe(v)));
  return std::optional<bool>(v.get<bool>());
}

Result<std::optional<int64_t>> ReadInt(const Json& obj, const std::string& key, const std::string& path, int64_t min,
                                       int64_t max) {
  const Json& v = Get(obj, key);
  if (v.is_null()) return std::optional<int64_t>();
  int64_t x = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return KeyError(Child(path, key), fmt::format("{} is out of range {}..{}", Describe(v), min, max));
    }
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e15) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    return KeyError(Child(path, key), fmt::format("expected a whole number, got {}", Describe(v)));
  }
  if (x < min || x > max) {
    return KeyError(Child(path, key), max == INT64_MAX ? fmt::format("{} is less than {}", x, min)
                                                       : fmt::format("{} is out of range {}..{}", x, min, max));
  }
  return std::optional<int64_t>(x);
}

Result<std::optional<double>> ReadNumber(const Json& obj, const std::string& key, const std::string& path,
                                         double min) {
  const Json& v = Get(obj, key);
  if (v.is_null()) return std::optional<double>();
  if (!v.is_number()) return KeyError(Child(path, key), fmt::format("expected a number, got {}", Describe(v)));
  double x = v.get<double>();
  if (!std::isfinite(x) || x < min) {
    return KeyError(Child(path, key), fmt::format("{} is less than {}", Describe(v), min));
  }
  return std::optional<double>(x);
}

Result<std::optional<std::chrono::nanoseconds>> ReadDuration(const Json& obj, const std::string& key,
                                                             const std::string& path) {
  GM_ASSIGN_OR_RETURN(auto s, ReadString(obj, key, path));
  if (!s) return std::optional<std::chrono::nanoseconds>();
  auto d = ParseDuration(*s);
  if (!d.ok()) {
    return KeyError(Child(path, key), fmt::format("'{}' is not a duration (e.g. 90s, 300ms, 2m)", *s));
  }
  return std::optional<std::chrono::nanoseconds>(*d);
}

Result<std::optional<double>> ReadRate(const Json& obj, const std::string& key, const std::string& path) {
  GM_ASSIGN_OR_RETURN(auto s, ReadString(obj, key, path));
  if (!s) return std::optional<double>();
  auto r = ParseRateBytesPerS(*s);
  if (!r.ok() || *r <= 0) {
    return KeyError(Child(path, key), fmt::format("'{}' is not a link rate (e.g. 100Gbit, 25Gbit/s, 2GiB/s)", *s));
  }
  return std::optional<double>(*r);
}

}  // namespace gpumigrate::planner
