// gm_hash_pages: the page digest of page_hash.h, on the GPU. One block of
// kHashLanes (256) threads per page; thread l folds the words l, l + 256, ...
// (consecutive threads read consecutive words: coalesced), the block XORs the
// lanes' mixed values, thread 0 stores the page's digest. A grid smaller than
// `pages` strides over them. Compiled to PTX at build time (see hash_ptx.h) and
// checked against page_hash.h on a real GPU by tests/hardware/cuda_gpu_test.cc.
#include "engine/devices/cuda/page_hash.h"

namespace {

__device__ __forceinline__ unsigned long long Rotl(unsigned long long x, int r) { return (x << r) | (x >> (64 - r)); }

__device__ __forceinline__ unsigned long long Mix(unsigned long long x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

extern "C" __global__ void gm_hash_pages(const unsigned long long* base, unsigned long long page_bytes,
                                         unsigned long long pages, unsigned long long* digests) {
  constexpr unsigned kLanes = gpumigrate::cuda::kHashLanes;
  __shared__ unsigned long long part[kLanes];
  const unsigned lane = threadIdx.x;
  const unsigned long long words = page_bytes / sizeof(unsigned long long);
  for (unsigned long long p = blockIdx.x; p < pages; p += gridDim.x) {
    const unsigned long long* w = base + p * words;
    unsigned long long h = gpumigrate::cuda::kHashSeed + lane * gpumigrate::cuda::kHashLaneStep;
    for (unsigned long long i = lane; i < words; i += kLanes) h = Rotl(h ^ w[i], 29) * gpumigrate::cuda::kHashMul;
    part[lane] = Mix(h + lane);
    __syncthreads();
    for (unsigned s = kLanes / 2; s > 0; s >>= 1) {
      if (lane < s) part[lane] ^= part[lane + s];
      __syncthreads();
    }
    if (lane == 0) digests[p] = part[0];
    __syncthreads();
  }
}
