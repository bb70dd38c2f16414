#include "gpumigrate/devices/open_device.h"

#include <fmt/format.h>

#include "engine/devices/vfio/kernel.h"
#include "gpumigrate/devices/shm.h"
#include "gpumigrate/devices/vfio.h"

namespace gpumigrate {

Result<OpenedDevice> OpenDevice(const std::string& spec, bool source) {
  OpenedDevice d;
  const bool cuda = spec.rfind("cuda:", 0) == 0;
  if (spec.rfind("proc:", 0) == 0 || cuda) {
    ProcSpec ps;
    if (cuda) {
      GM_ASSIGN_OR_RETURN(CudaSpec cs, ParseCudaSpec(spec));
      ps = ProcSpecForCuda(cs);
    } else {
      GM_ASSIGN_OR_RETURN(ps, ParseProcSpec(spec));
    }
    GM_ASSIGN_OR_RETURN(auto dev, ProcDevice::Connect(ps, source ? ProcRole::kSource : ProcRole::kDestination));
    if (source && dev->State() != DeviceState::kRunning) {
      return FailedPrecondition(fmt::format(
          "process {} is {} from an earlier migration (in doubt): `gpumigrate resume --device {}` or `gpumigrate "
          "release --device {}` first",
          ps.pid, DeviceStateName(dev->State()), spec, spec));
    }
    d.proc = dev.get();
    d.device = std::move(dev);
    return d;
  }
  if (spec.rfind("vfio:", 0) == 0) {
    GM_ASSIGN_OR_RETURN(VfioSpec vs, ParseVfioSpec(spec));
    GM_ASSIGN_OR_RETURN(d.device,
                        OpenVfioDevice(vs, source ? DeviceRole::kSource : DeviceRole::kDestination, vfio::RealKernel()));
    return d;
  }
  if (spec.rfind("shm:", 0) == 0) {
    GM_ASSIGN_OR_RETURN(ShmSpec hs, ParseShmSpec(spec));
    GM_ASSIGN_OR_RETURN(auto dev, ShmDevice::Open(hs, source ? DeviceRole::kSource : DeviceRole::kDestination));
    d.shm = dev.get();
    d.device = std::move(dev);
    return d;
  }
  if (spec.rfind("sim", 0) != 0) {
    return InvalidArgument(
        fmt::format("device '{}' is not supported: use sim:..., proc:PID, cuda:PID, vfio:PATH[,PATH...] or shm:PATH", spec));
  }
  GM_ASSIGN_OR_RETURN(SimSpec ss, ParseSimSpec(spec));
  GM_ASSIGN_OR_RETURN(auto dev, SimDevice::Create(ss, source ? SimRole::kSource : SimRole::kDestination));
  d.sim = dev.get();
  d.device = std::move(dev);
  return d;
}

}  // namespace gpumigrate
