#include "engine/devices/device_spec.h"

#include <fmt/format.h>

namespace gpumigrate {

Result<SplitSpec> SplitDeviceSpec(std::string_view text) {
  SplitSpec split;
  const size_t colon = text.find(':');
  split.kind = text.substr(0, colon);
  std::string_view rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    SpecToken t;
    const size_t eq = item.find('=');
    t.key = item.substr(0, eq);
    if (eq != std::string_view::npos) {
      t.value = item.substr(eq + 1);
      t.has_value = true;
      if (t.key.empty()) return InvalidArgument(fmt::format("device spec: '{}' in '{}' has no key", item, text));
    }
    split.tokens.push_back(t);
  }
  return split;
}

}  // namespace gpumigrate
