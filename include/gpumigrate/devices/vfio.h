// The `vfio` backend: a device bound to VFIO that implements the kernel's
// migration v2 uAPI (vendor variant drivers such as mlx5, hisi_acc, NVIDIA vGPU,
// or the kernel's mtty sample). Spec: vfio:PATH, PATH the device's VFIO cdev
// (/dev/vfio/devices/vfioN, already bound to an iommufd by its owner).
//
// The device has no memory regions of its own: its whole state is the opaque
// stream the kernel's migration data fd yields (Device::StreamsState()). The
// source goes RUNNING -> PRE_COPY (when the device offers it; otherwise it stays
// RUNNING until the stun, with an honest stop-copy estimate from
// VFIO_DEVICE_FEATURE_MIG_DATA_SIZE) -> STOP_COPY -> STOP; a failure returns it
// to RUNNING (VFIO_DEVICE_RESET when the device fell into ERROR). The destination
// goes STOP -> RESUMING -> STOP -> RUNNING. Every kernel error names the call,
// the state arc and the errno.
//
// Several devices of one VM migrate as one: vfio:PATH1,PATH2,... (every one must
// offer VFIO_MIGRATION_P2P; all are quiesced before any stops). The destination
// names its devices in the same order.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {
namespace vfio {
class Kernel;
}

struct VfioSpec {
  std::vector<std::string> paths;  // the VFIO device cdevs, at least one
};

// "vfio:/dev/vfio/devices/vfio0[,/dev/vfio/devices/vfio1...]" -> {paths}; each
// path absolute, none twice.
Result<VfioSpec> ParseVfioSpec(std::string_view spec);

// Opens the device through `kernel` (tests pass a fake; OpenDevice passes the
// real one). A source must be RUNNING; a destination is brought to STOP.
Result<std::unique_ptr<Device>> OpenVfioDevice(const VfioSpec& spec, DeviceRole role, vfio::Kernel& kernel);

}  // namespace gpumigrate
