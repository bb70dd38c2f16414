// `gpumigrate estimate --qemu SRC.qmp --device shm:PATH`: the device's W(t),
// sampled through the shm device's hash tracker as for any device, and the
// guest's RAM as QEMU reports it (size, page-sampled dirty rate), combined into
// one predicted guest-visible stun. Nothing is migrated; the guest keeps running.
//
//   connect to QEMU (running, not migrating) -> calc-dirty-rate starts (QEMU's
//   thread) -> the device is profiled meanwhile -> query-dirty-rate "measured"
//   -> the RAM's dirty rate is QEMU's minus the device's own over the same window
//   (QEMU samples the shared block too) -> the model with BesideMemory.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/qemu/qemu.h"

namespace gpumigrate::cli {

struct QemuEstimate {
  std::string qmp_path;
  QemuRamProfile ram;
  double device_dirty_bytes_per_s = 0;  // the shm's own, over QEMU's window, subtracted
  double ram_dirty_bytes_per_s = 0;     // what the model takes
};

// The guest RAM as the model's BesideMemory.
BesideMemory QemuBeside(const QemuEstimate& q);
// QEMU's figures and how they were taken, as assumption lines.
void AddQemuAssumptions(const QemuEstimate& q, std::vector<std::string>& assumptions);
// The estimate JSON's `qemu` object.
nlohmann::ordered_json QemuEstimateJson(const QemuEstimate& q, const EstimateReport& r);

struct EstimateFlags;
// The whole `estimate --qemu` run: 0, 1 (measurement or model failed) or 2 (bad
// flags, a QEMU that is missing, not running or migrating).
int RunQemuEstimate(const EstimateFlags& f);

}  // namespace gpumigrate::cli
