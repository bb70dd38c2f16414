// The CUDA half of libgpumigrate_shim: device allocations registered with
// gm_shim_register_cuda, served to gpumigrate through the staging protocol of
// transport/wire/shim_protocol.h (CudaInfo, CudaRead/Write/Zero, CudaHash).
//
// Context: the shim works in the context that was current on the thread that
// registered the first CUDA region (cuCtxGetCurrent at gm_shim_register_cuda);
// when none was current, in the primary context of device 0 (the one the CUDA
// runtime API uses). Its server thread makes that context current before every
// CUDA call. The driver is the application's own: driver_loader opens the same
// library ($GPUMIGRATE_LIBCUDA or libcuda.so.1), so dlopen returns the handle the
// application already holds.
//
// Copies and the hash kernel run on the legacy default stream (stream 0): they
// are ordered with the application's work on blocking streams, never racing a
// kernel the application launched before. Hashing runs the embedded
// gm_hash_pages PTX (gpu_hash.cu) when a module loads, else stages pages to host
// memory and hashes them there (page_hash.h: both give the same digests).
//
// Threads: CudaRegister runs on the application's thread; everything else on the
// shim's server thread, one request at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/wire/shim_protocol.h"

namespace gpumigrate::shimcuda {

// A region as the CUDA half sees it; dptr == 0 for a host region.
struct RegionRef {
  uint64_t dptr = 0;
  uint64_t size = 0;
};

// Loads the driver (once) and records the context for region [dptr, dptr+size).
// Returns 0, or -errno with *why set.
int Register(uint64_t dptr, uint64_t size, std::string* why);

// Whether any CUDA region was registered (the driver is loaded).
bool Active();

// Server thread. Answers one CUDA request (type kCudaInfo..kCudaHash) on `sock`;
// returns 0, or the negative errno of a failed send (the session ends).
int Handle(int sock, shimwire::Msg type, bool destination, std::span<const std::byte> payload,
           std::span<const RegionRef> regions);

// Server thread, workload paused: waits for all work queued in the context.
// Empty on success, else what failed.
std::string Synchronize();

// Server thread: zeroes every CUDA region (a destination discarding what it got).
void ZeroAll(std::span<const RegionRef> regions);

// Frees the staging memory, the kernel module and the digest buffer (the session
// that set them up ended, or the shim shuts down). Server thread.
void Release();

// Forgets the driver and context (gm_shim_shutdown, after Release).
void Reset();

}  // namespace gpumigrate::shimcuda
