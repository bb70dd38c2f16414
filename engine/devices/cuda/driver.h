// The CUDA driver for the engine: LoadDriver (driver_loader.h) behind Status and
// Result. Load resolves the driver once per process and per path
// ($GPUMIGRATE_LIBCUDA or libcuda.so.1) and keeps it: the driver cannot be
// unloaded, and every caller shares the one instance. A failed load is not
// kept, so a caller may fix the environment and try again.
// Thread safety: Load may be called from any thread; a CudaDriver is immutable.
#pragma once

#include <string>
#include <string_view>

#include "engine/devices/cuda/driver_loader.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::cuda {

class CudaDriver {
 public:
  // The driver at DriverPath() with at least `needs` (driver_loader.h's Need
  // bits) resolved. The pointer lives as long as the process. Errors:
  // kUnavailable with LoadDriver's sentence (no driver, not a library, a symbol
  // missing, too old, the toolkit's stub).
  static Result<const CudaDriver*> Load(unsigned needs);

  const DriverApi& api() const { return loaded_.api; }
  const std::string& path() const { return loaded_.path; }
  int version() const { return loaded_.version; }

  // OK for CUDA_SUCCESS; else "<call> failed: CUDA_ERROR_X (text)" with a code
  // that fits the error (kDeadlineExceeded for a timeout, kFailedPrecondition
  // for an illegal state, kInvalidArgument for an invalid value, else kInternal).
  Status Check(CUresult r, std::string_view call) const;

  explicit CudaDriver(LoadedDriver loaded) : loaded_(std::move(loaded)) {}

 private:
  LoadedDriver loaded_;
};

}  // namespace gpumigrate::cuda
