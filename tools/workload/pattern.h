// The workload's memory pattern: page p at version v (v >= 1) holds a 16-byte
// header {magic, p, v} and a body derived from (seed, p, v); version 0 is a page
// never written (zeros). With the version of every page, the workload can check
// its whole memory: a stale page (a missed dirty bit), a torn or misplaced page,
// or a zeroed one is found and named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gpumigrate::workload {

inline constexpr uint32_t kPageMagic = 0x4c574d47;  // "GMWL"

void FillPage(std::span<std::byte> page, uint64_t seed, uint32_t index, uint32_t version);

// Empty when the page holds `version` of page `index`; else what is wrong.
std::string CheckPage(std::span<const std::byte> page, uint64_t seed, uint32_t index, uint32_t version);

// The state that travels with the memory: where the workload stands and the
// version of every page.
struct State {
  uint64_t seed = 0;
  uint64_t size = 0;
  uint32_t page_size = 0;
  uint64_t step = 0;
  std::vector<uint32_t> versions;

  std::vector<std::byte> Serialize() const;
  // Empty string on success, else why the blob was rejected.
  std::string Parse(std::span<const std::byte> blob);
};

}  // namespace gpumigrate::workload
