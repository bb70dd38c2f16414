#include "engine/devices/cuda/driver.h"

#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

namespace gpumigrate::cuda {

Result<const CudaDriver*> CudaDriver::Load(unsigned needs) {
  static std::mutex mu;
  // (path, needs) -> driver; never erased, never changed: the pointers are handed
  // out. Loads of one path share the library (dlopen counts references).
  static auto* loaded = new std::map<std::pair<std::string, unsigned>, std::unique_ptr<CudaDriver>>;
  std::lock_guard lock(mu);
  const std::string path = DriverPath();
  for (const auto& [key, driver] : *loaded) {
    if (key.first == path && (key.second & needs) == needs) return driver.get();
  }
  LoadedDriver d;
  if (std::string error = LoadDriver(needs, &d); !error.empty()) return Unavailable("cuda: " + error);
  auto& slot = (*loaded)[{path, needs}];
  slot = std::make_unique<CudaDriver>(std::move(d));
  return slot.get();
}

Status CudaDriver::Check(CUresult r, std::string_view call) const {
  if (r == CUDA_SUCCESS) return Status::Ok();
  std::string m = fmt::format("{} failed: {}", call, ResultText(loaded_.api, r));
  switch (r) {
    case CUDA_ERROR_TIMEOUT:
      return {StatusCode::kDeadlineExceeded, std::move(m)};
    case CUDA_ERROR_ILLEGAL_STATE:
      return FailedPrecondition(std::move(m));
    case CUDA_ERROR_INVALID_VALUE:
      return InvalidArgument(std::move(m));
    case CUDA_ERROR_OUT_OF_MEMORY:
      return {StatusCode::kResourceExhausted, std::move(m)};
    case CUDA_ERROR_NOT_SUPPORTED:
      return Unimplemented(std::move(m));
    default:
      return Internal(std::move(m));
  }
}

}  // namespace gpumigrate::cuda
