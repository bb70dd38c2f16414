#include <fmt/format.h>

#include "engine/devices/vfio/vfio_device.h"
#include "gpumigrate/vfio.h"

namespace gpumigrate {

Result<VfioSpec> ParseVfioSpec(std::string_view spec) {
  constexpr std::string_view kPrefix = "vfio:";
  if (spec.substr(0, kPrefix.size()) != kPrefix) {
    return InvalidArgument(fmt::format("device spec '{}' is not vfio:PATH", spec));
  }
  VfioSpec s;
  s.path = std::string(spec.substr(kPrefix.size()));
  if (s.path.empty() || s.path[0] != '/') {
    return InvalidArgument(fmt::format("device spec '{}': vfio:PATH needs the absolute path of the device's VFIO "
                                       "cdev, e.g. vfio:/dev/vfio/devices/vfio0",
                                       spec));
  }
  return s;
}

Result<std::unique_ptr<Device>> OpenVfioDevice(const VfioSpec& spec, DeviceRole role, vfio::Kernel& kernel) {
  GM_ASSIGN_OR_RETURN(auto dev, vfio::VfioDevice::Open(spec, role, kernel));
  return std::unique_ptr<Device>(std::move(dev));
}

}  // namespace gpumigrate
