#include <fmt/format.h>

#include "engine/devices/device_spec.h"
#include "gpumigrate/devices/shm.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {

std::string ShmSpec::ToString() const {
  std::string s = "shm:" + path;
  if (page_size != 4096) s += fmt::format(",page={}", page_size);
  return s;
}

Result<ShmSpec> ParseShmSpec(std::string_view text) {
  constexpr std::string_view kPrefix = "shm:";
  auto bad = [&](std::string_view why) {
    return InvalidArgument(fmt::format("device '{}': {} (expected shm:PATH[,page=SIZE])", text, why));
  };
  if (text.substr(0, kPrefix.size()) != kPrefix) return bad("not an shm device");
  GM_ASSIGN_OR_RETURN(SplitSpec split, SplitDeviceSpec(text));
  if (split.tokens.empty() || split.tokens[0].has_value) return bad("the path of the shared memory file comes first");
  ShmSpec spec;
  spec.path = std::string(split.tokens[0].key);
  for (size_t i = 1; i < split.tokens.size(); ++i) {
    const SpecToken& token = split.tokens[i];
    if (!token.has_value) return bad(fmt::format("'{}' is not key=value", token.key));
    if (token.key != "page") return bad(fmt::format("unknown key '{}'", token.key));
    auto size = ParseSize(token.value);
    if (!size.ok()) return bad(size.status().message());
    if (*size < 4096 || *size > (2u << 20) || (*size & (*size - 1)) != 0) {
      return bad("page must be a power of two from 4KiB to 2MiB");
    }
    spec.page_size = static_cast<uint32_t>(*size);
  }
  return spec;
}

}  // namespace gpumigrate
