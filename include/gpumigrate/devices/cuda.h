// The `cuda` backend: the CUDA device memory of a live, separate process that
// links the gpumigrate shim and registers its allocations with
// gm_shim_register_cuda (gpumigrate/shim.h).
//
// A cuda:PID device is a ProcDevice (gpumigrate/devices/proc.h): the same connection to
// the shim, the same pause / hold / release / adopt lifecycle and state blob;
// device allocations are one more kind of region. For them:
//   - dirty pages are found by comparing a digest per page between syncs
//     (engine/devices/cuda/page_hash.h). The shim computes the digests in the
//     process's own context: on the GPU with the gm_hash_pages kernel (only the
//     digests cross PCIe), or on the host from staged pages when no kernel can
//     be loaded (a build without nvcc, a driver that refuses the PTX) or when
//     hash=host asks for it. ProcDevice::TrackerName() says "gpu-hash" or
//     "host-hash", TrackerReason() why;
//   - reads and writes go through pinned staging memory the shim shares with
//     gpumigrate (a memfd): device→host for the source, host→device for a
//     destination;
//   - STOP_COPY pauses the workload at gm_shim_leave and then waits for its
//     queued GPU work (cuCtxSynchronize) before the final sync.
// Host regions of the same process (gm_shim_alloc / gm_shim_register) move as
// under proc:PID.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

enum class CudaHash { kAuto, kGpu, kHost };
std::string_view CudaHashName(CudaHash h);  // "auto", "gpu", "host"

// The page of a CUDA region unless page= says otherwise: a power of two, a
// multiple of the digest's smallest page (2 KiB), and at most the session's
// frame payload (1 MiB), since a dirty page travels in one frame.
inline constexpr uint32_t kCudaDefaultPageSize = 64u << 10;
inline constexpr uint32_t kCudaMinPageSize = 2u << 10;
inline constexpr uint32_t kCudaMaxPageSize = 1u << 20;

struct CudaSpec {
  int pid = 0;
  uint32_t page_size = kCudaDefaultPageSize;
  CudaHash hash = CudaHash::kAuto;
  std::string ToString() const;
};

// "cuda:PID[,page=SIZE][,hash=auto|gpu|host]". Errors name the spec and the
// part that is wrong.
Result<CudaSpec> ParseCudaSpec(std::string_view text);

}  // namespace gpumigrate
