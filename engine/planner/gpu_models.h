// GPU models the planner knows: memory, and for MIG the profile table of
// docs/planner.md (memory slices, valid start slices) and the instance limit.
// Pure data and lookups.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace gpumigrate::planner {

struct MigProfile {
  std::string_view name;  // "3g.40gb"
  uint32_t slices = 0;    // memory slices it occupies
  uint8_t valid_starts = 0;  // bit s set: s is a valid start slice
  uint64_t bytes = 0;     // frame buffer
  bool ValidStart(uint32_t s) const { return s < 8 && ((valid_starts >> s) & 1u); }
  // The slices an instance at `start` occupies, as a bit mask.
  uint8_t Mask(uint32_t start) const { return static_cast<uint8_t>(((1u << slices) - 1u) << start); }
};

struct GpuModel {
  std::string_view name;
  uint64_t memory_bytes = 0;
  uint32_t mig_slices = 8;
  uint32_t mig_max_instances = 7;
  std::span<const MigProfile> mig_profiles;  // largest first

  const MigProfile* FindMigProfile(std::string_view profile) const;
  // "1g.10gb, 1g.20gb, ..." for error messages.
  std::string MigProfileNames() const;
};

const GpuModel* FindGpuModel(std::string_view name);
std::string KnownGpuModelNames();  // "A100-80GB, H100-80GB"

}  // namespace gpumigrate::planner

namespace gpumigrate::planner {
// "40 GB", "12.5 GB": decimal, as GPU memory and profiles are named.
std::string DecimalGB(uint64_t bytes);
}  // namespace gpumigrate::planner
