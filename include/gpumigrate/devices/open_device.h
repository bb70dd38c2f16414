// Opens the device a spec names (the CLI contract's device specs): sim:... (simulated in this process) or
// proc:PID (a live process linked with libgpumigrate_shim), cuda:PID (its CUDA device memory; a proc device
// too), vfio:PATH[,PATH...] (VFIO migration v2 devices of one VM) or shm:PATH (a QEMU guest's shared device memory file).
#pragma once

#include <memory>
#include <string>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/devices/shm.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct OpenedDevice {
  std::unique_ptr<Device> device;
  SimDevice* sim = nullptr;    // set when it is a sim device
  ProcDevice* proc = nullptr;  // set when it is a proc or cuda device
  ShmDevice* shm = nullptr;    // set when it is an shm device
};

// A source must be RUNNING (a proc source held from an earlier migration is refused
// with the commands that resolve it).
Result<OpenedDevice> OpenDevice(const std::string& spec, bool source);

}  // namespace gpumigrate
