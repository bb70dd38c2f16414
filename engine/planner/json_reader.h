// Typed access to a parsed JSON object with the key path in every error
// ("vms[3].placement: expected a whole number, got \"x\""), for the inventory.
// Absent keys and null read as "not given"; a key of the wrong type is an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "gpumigrate/common/status.h"

namespace gpumigrate::planner {

using Json = nlohmann::json;

Status KeyError(const std::string& path, const std::string& message);
std::string Child(const std::string& path, const std::string& key);  // "a.b", or "b" at the root
std::string Index(const std::string& path, size_t i);                // "a[3]"

// The value at obj[key] or null; obj must be an object.
const Json& Get(const Json& obj, const std::string& key);

Result<std::optional<std::string>> ReadString(const Json& obj, const std::string& key, const std::string& path);
Result<std::optional<bool>> ReadBool(const Json& obj, const std::string& key, const std::string& path);
Result<std::optional<int64_t>> ReadInt(const Json& obj, const std::string& key, const std::string& path, int64_t min,
                                       int64_t max);
Result<std::optional<double>> ReadNumber(const Json& obj, const std::string& key, const std::string& path,
                                         double min);
Result<std::optional<std::chrono::nanoseconds>> ReadDuration(const Json& obj, const std::string& key,
                                                             const std::string& path);
Result<std::optional<double>> ReadRate(const Json& obj, const std::string& key, const std::string& path);

// Present and of the right type, or an error naming the key.
template <typename T>
Result<T> Required(Result<std::optional<T>> r, const std::string& path) {
  if (!r.ok()) return r.status();
  if (!r->has_value()) return KeyError(path, "missing");
  return std::move(**r);
}

std::string Describe(const Json& v);  // the value, shortened, for messages

}  // namespace gpumigrate::planner
