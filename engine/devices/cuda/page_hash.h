// The page digest the CUDA backend compares between rounds to find pages of
// device memory that changed. The GPU computes it with the kernel in
// gpu_hash.cu (one thread block of kLanes threads per page, digests copied to
// the host); this header is the reference: the shim's host-side fallback and the
// driver double (libcuda-fake, which runs "kernels" on the CPU) use it, and the
// `gpu` tests compare the kernel's digests with it on the same memory.
//
// Definition: a page is page_bytes / 8 little-endian 64-bit words w[i]
// (page_bytes a multiple of kLanes * 8). Lane l (0 <= l < kLanes) folds the words
// i = l, l + kLanes, l + 2*kLanes, ...:
//     h = kSeed + l * kLaneStep;  for each: h = rotl64(h ^ w[i], 29) * kMul;
// and the digest is the XOR over lanes of Mix(h_l + l). A changed word changes its
// lane's h and so the digest, but for a 2^-64 chance.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gpumigrate::cuda {

inline constexpr uint32_t kHashLanes = 256;
inline constexpr uint64_t kHashSeed = 0x9e3779b97f4a7c15ull;
inline constexpr uint64_t kHashLaneStep = 0xbf58476d1ce4e5b9ull;
inline constexpr uint64_t kHashMul = 0x94d049bb133111ebull;
// The smallest page the hash takes (every lane gets at least one word).
inline constexpr size_t kHashMinPage = kHashLanes * sizeof(uint64_t);

inline uint64_t HashRotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t HashMix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Digest of one page; page_bytes must be a multiple of kHashMinPage.
inline uint64_t HashPage(const std::byte* page, size_t page_bytes) {
  const size_t words = page_bytes / sizeof(uint64_t);
  uint64_t h[kHashLanes];
  for (uint32_t l = 0; l < kHashLanes; ++l) h[l] = kHashSeed + l * kHashLaneStep;
  for (size_t i = 0; i < words; i += kHashLanes) {
    for (uint32_t l = 0; l < kHashLanes; ++l) {
      uint64_t w;
      std::memcpy(&w, page + (i + l) * sizeof(uint64_t), sizeof(w));
      h[l] = HashRotl(h[l] ^ w, 29) * kHashMul;
    }
  }
  uint64_t d = 0;
  for (uint32_t l = 0; l < kHashLanes; ++l) d ^= HashMix(h[l] + l);
  return d;
}

// Digests of `pages` consecutive pages starting at base.
inline void HashPages(const std::byte* base, size_t page_bytes, size_t pages, uint64_t* digests) {
  for (size_t p = 0; p < pages; ++p) digests[p] = HashPage(base + p * page_bytes, page_bytes);
}

}  // namespace gpumigrate::cuda
