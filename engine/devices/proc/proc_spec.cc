#include <climits>

#include <fmt/format.h>

#include "engine/devices/device_spec.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {

std::string_view ProcTrackingName(ProcTracking t) {
  switch (t) {
    case ProcTracking::kAuto: return "auto";
    case ProcTracking::kPagemapScan: return "pagemap-scan";
    case ProcTracking::kSyncWp: return "sync-wp";
    case ProcTracking::kHash: return "hash";
  }
  return "?";
}

std::string ProcSpec::ToString() const {
  if (cuda) return CudaSpec{pid, cuda_page_size, cuda_hash}.ToString();
  std::string s = fmt::format("proc:{}", pid);
  if (tracker != ProcTracking::kAuto) s += fmt::format(",tracker={}", ProcTrackingName(tracker));
  if (page_size != 0) s += fmt::format(",page={}", page_size);
  return s;
}

Result<ProcSpec> ParseProcSpec(std::string_view text) {
  constexpr std::string_view kPrefix = "proc:";
  auto bad = [&](std::string_view why) {
    return InvalidArgument(fmt::format("device '{}': {} (expected proc:PID[,tracker=auto|pagemap-scan|sync-wp|hash]"
                                       "[,page=SIZE])",
                                       text, why));
  };
  if (text.substr(0, kPrefix.size()) != kPrefix) return bad("not a proc device");
  GM_ASSIGN_OR_RETURN(SplitSpec split, SplitDeviceSpec(text));
  ProcSpec spec;
  // The first token is the PID; the rest are key=value.
  auto pid = ParseInt(split.tokens.empty() || split.tokens[0].has_value ? "" : split.tokens[0].key, 1, INT_MAX);
  if (!pid.ok()) return bad("PID must be a positive number");
  spec.pid = static_cast<int>(*pid);
  for (size_t i = 1; i < split.tokens.size(); ++i) {
    const SpecToken& token = split.tokens[i];
    if (!token.has_value) return bad(fmt::format("'{}' is not key=value", token.key));
    std::string_view key = token.key, value = token.value;
    if (key == "tracker") {
      if (value == "auto") spec.tracker = ProcTracking::kAuto;
      else if (value == "pagemap-scan" || value == "async") spec.tracker = ProcTracking::kPagemapScan;
      else if (value == "sync-wp" || value == "sync") spec.tracker = ProcTracking::kSyncWp;
      else if (value == "hash") spec.tracker = ProcTracking::kHash;
      else return bad(fmt::format("unknown tracker '{}'", value));
    } else if (key == "page") {
      auto size = ParseSize(value);
      if (!size.ok()) return bad(size.status().message());
      if (*size == 0 || (*size & (*size - 1)) != 0 || *size > (uint64_t{1} << 30)) return bad("page must be a power of two");
      spec.page_size = static_cast<uint32_t>(*size);
    } else {
      return bad(fmt::format("unknown key '{}'", key));
    }
  }
  return spec;
}

}  // namespace gpumigrate
