#include "gpumigrate/devices/device.h"

#include <fmt/format.h>

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

std::string_view OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kCompleted: return "completed";
    case Outcome::kAborted: return "aborted";
    case Outcome::kInDoubt: return "in_doubt";
  }
  return "unknown";
}

std::string_view DeviceRoleName(DeviceRole r) {
  return r == DeviceRole::kSource ? "source" : "destination";
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

Status CheckTransition(std::string_view backend, DeviceRole role, DeviceState cur, DeviceState next) {
  const bool source = role == DeviceRole::kSource;
  using S = DeviceState;
  auto from = [&](std::initializer_list<S> ok) {
    for (S s : ok) {
      if (cur == s) return true;
    }
    return false;
  };
  bool allowed = false;
  if (source) {
    switch (next) {
      case S::kPreCopy: allowed = from({S::kRunning}); break;
      case S::kStopCopy: allowed = from({S::kRunning, S::kPreCopy}); break;
      case S::kStop: allowed = from({S::kStopCopy, S::kRunning}); break;
      case S::kRunning: allowed = from({S::kPreCopy, S::kStopCopy, S::kStop}); break;
      default: break;
    }
  } else {
    switch (next) {
      case S::kResuming: allowed = from({S::kStop}); break;
      case S::kStop: allowed = from({S::kResuming, S::kError, S::kRunning}); break;
      case S::kRunning: allowed = from({S::kStop}); break;
      case S::kError: allowed = true; break;
      default: break;
    }
  }
  if (allowed) return Status::Ok();
  return FailedPrecondition(fmt::format("{}: transition {} -> {} is not allowed on a {} device", backend,
                                        DeviceStateName(cur), DeviceStateName(next), DeviceRoleName(role)));
}

const RegionInfo* FindRegion(const std::vector<RegionInfo>& regions, uint32_t id) {
  for (const auto& r : regions) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

Status CheckRange(std::string_view backend, std::string_view action, const std::vector<RegionInfo>& regions,
                  uint32_t region, uint64_t offset, uint64_t length) {
  const RegionInfo* r = FindRegion(regions, region);
  if (r == nullptr) return InvalidArgument(fmt::format("{}: {} failed: no region {}", backend, action, region));
  // Written so that offset + length cannot wrap around.
  if (offset > r->size_bytes || length > r->size_bytes - offset) {
    return InvalidArgument(fmt::format("{}: {} failed: [{}, +{}) is outside region {} '{}' ({} bytes)", backend,
                                       action, offset, length, region, r->name, r->size_bytes));
  }
  return Status::Ok();
}

}  // namespace gpumigrate
