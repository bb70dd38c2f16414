// The CUDA workload's device memory: the driver loaded through driver_loader
// (so $GPUMIGRATE_LIBCUDA points it at the driver double), a context, and two
// allocations shaped like LLM inference:
//   weights   static: word i holds WeightWord(seed, i), written once;
//   kv cache  dynamic: pages of kv_page bytes; page p at version v (v >= 1) holds
//             the workload pattern (tools/workload/pattern.h) when v is odd
//             (written with cuMemcpyHtoD) and the 32-bit value MemsetValue(seed,
//             p, v) everywhere when v is even (written with cuMemsetD32);
//             version 0 is zeros.
// With the version table every byte of both regions can be checked.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/devices/cuda/driver_loader.h"

namespace gpumigrate::cudaworkload {

uint64_t WeightWord(uint64_t seed, uint64_t index);
uint32_t MemsetValue(uint64_t seed, uint32_t page, uint32_t version);

class DeviceMemory {
 public:
  // Loads the driver, makes device `ordinal`'s primary context current on this
  // thread and allocates both regions (zeroed). Empty on success, else why.
  std::string Open(int ordinal, uint64_t weights_bytes, uint64_t kv_bytes, uint32_t kv_page);
  // Makes the context current on the calling thread.
  std::string Bind() const;

  std::string FillWeights(uint64_t seed);
  // Writes version `version` of kv page `page` (HtoD when odd, memset when even).
  std::string WriteKv(uint64_t seed, uint32_t page, uint32_t version, std::vector<std::byte>& scratch);

  // Empty when every word of the weights and every kv page is as `versions` says;
  // else the first fault and how many pages are wrong.
  std::string Check(uint64_t seed, std::span<const uint32_t> versions);
  // A page_hash.h digest of every 64 KiB of weights, then of kv cache.
  std::string Digests(std::vector<uint64_t>* out);

  unsigned long long weights() const { return weights_; }
  unsigned long long kv() const { return kv_; }
  uint64_t weights_bytes() const { return weights_bytes_; }
  uint64_t kv_bytes() const { return kv_bytes_; }
  uint32_t kv_pages() const { return static_cast<uint32_t>(kv_bytes_ / kv_page_); }
  const std::string& driver_path() const { return drv_.path; }

 private:
  std::string Call(const char* what, cuda::CUresult r) const;
  std::string CheckWeights(uint64_t seed, std::vector<std::byte>& buf);

  cuda::LoadedDriver drv_;
  cuda::CUcontext ctx_ = nullptr;
  unsigned long long weights_ = 0, kv_ = 0;
  uint64_t weights_bytes_ = 0, kv_bytes_ = 0;
  uint32_t kv_page_ = 0;
};

}  // namespace gpumigrate::cudaworkload
