// The gm_hash_pages kernel (gpu_hash.cu) as PTX text, embedded at build time:
// CMake runs nvcc -ptx -arch=GPUMIGRATE_PTX_ARCH when it finds nvcc and writes
// the text into a generated source file; without nvcc the text is empty and the
// shim hashes on the host. The driver JIT-compiles the PTX for the GPU it runs
// on (compute_75 PTX runs on Turing and every later GPU, Hopper included); the
// text is stamped PTX ISA 6.4 rather than nvcc's own, so drivers older than the
// toolkit (back to 418) accept it too (cmake/embed_ptx.cmake).
#pragma once

#include <cstddef>

#ifndef GM_HASH_PTX_ARCH
#define GM_HASH_PTX_ARCH "compute_75"  // keep in step with GPUMIGRATE_PTX_ARCH in CMakeLists.txt
#endif

namespace gpumigrate::cuda {

// NUL-terminated PTX (cuModuleLoadData takes it as is); kGmHashPtxBytes == 0
// when the build had no nvcc.
extern const char kGmHashPtx[];
extern const size_t kGmHashPtxBytes;

}  // namespace gpumigrate::cuda
