#include <algorithm>

#include <fmt/format.h>

#include "engine/devices/vfio/vfio_device.h"
#include "gpumigrate/devices/vfio.h"

namespace gpumigrate {

Result<VfioSpec> ParseVfioSpec(std::string_view spec) {
  constexpr std::string_view kPrefix = "vfio:";
  if (spec.substr(0, kPrefix.size()) != kPrefix) {
    return InvalidArgument(fmt::format("device spec '{}' is not vfio:PATH", spec));
  }
  VfioSpec s;
  std::string_view rest = spec.substr(kPrefix.size());
  for (;;) {
    const size_t comma = rest.find(',');
    std::string path(rest.substr(0, comma));
    if (path.empty() || path[0] != '/') {
      return InvalidArgument(fmt::format("device spec '{}': vfio:PATH[,PATH...] needs the absolute path of each "
                                         "device's VFIO cdev, e.g. vfio:/dev/vfio/devices/vfio0",
                                         spec));
    }
    if (std::find(s.paths.begin(), s.paths.end(), path) != s.paths.end()) {
      return InvalidArgument(fmt::format("device spec '{}': {} is named twice", spec, path));
    }
    s.paths.push_back(std::move(path));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return s;
}

Result<std::unique_ptr<Device>> OpenVfioDevice(const VfioSpec& spec, DeviceRole role, vfio::Kernel& kernel) {
  GM_ASSIGN_OR_RETURN(auto dev, vfio::VfioDevice::Open(spec, role, kernel));
  return std::unique_ptr<Device>(std::move(dev));
}

}  // namespace gpumigrate
