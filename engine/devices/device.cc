#include "gpumigrate/device.h"

namespace gpumigrate {

std::string_view DeviceStateName(DeviceState s) {
  switch (s) {
    case DeviceState::kError: return "ERROR";
    case DeviceState::kStop: return "STOP";
    case DeviceState::kRunning: return "RUNNING";
    case DeviceState::kStopCopy: return "STOP_COPY";
    case DeviceState::kResuming: return "RESUMING";
    case DeviceState::kRunningP2P: return "RUNNING_P2P";
    case DeviceState::kPreCopy: return "PRE_COPY";
    case DeviceState::kPreCopyP2P: return "PRE_COPY_P2P";
  }
  return "UNKNOWN";
}

std::string_view RegionHintName(RegionHint h) {
  switch (h) {
    case RegionHint::kUnspecified: return "unspecified";
    case RegionHint::kStatic: return "static";
    case RegionHint::kDynamic: return "dynamic";
    case RegionHint::kUnknown: return "unknown";
  }
  return "unknown";
}

const RegionInfo* FindRegion(const std::vector<RegionInfo>& regions, uint32_t id) {
  for (const auto& r : regions) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

}  // namespace gpumigrate
