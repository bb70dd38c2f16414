#include "engine/planner/gpu_models.h"

#include <array>

namespace gpumigrate::planner {
namespace {

constexpr uint8_t Starts(std::initializer_list<int> s) {
  uint8_t m = 0;
  for (int x : s) m = static_cast<uint8_t>(m | (1u << x));
  return m;
}

constexpr uint64_t kGB = 1000ull * 1000 * 1000;

// docs/planner.md, "Placement rules": the 80 GB A100/H100 (8 memory slices). Largest
// first: the fragmentation score weighs the large profiles first.
constexpr std::array<MigProfile, 6> k80GbProfiles = {{
    {"7g.80gb", 8, Starts({0}), 80 * kGB},
    {"4g.40gb", 4, Starts({0}), 40 * kGB},
    {"3g.40gb", 4, Starts({0, 4}), 40 * kGB},
    {"2g.20gb", 2, Starts({0, 2, 4}), 20 * kGB},
    {"1g.20gb", 2, Starts({0, 2, 4, 6}), 20 * kGB},
    {"1g.10gb", 1, Starts({0, 1, 2, 3, 4, 5, 6}), 10 * kGB},
}};

const std::array<GpuModel, 2> kModels = {{
    {"A100-80GB", 80 * kGB, 8, 7, k80GbProfiles},
    {"H100-80GB", 80 * kGB, 8, 7, k80GbProfiles},
}};

}  // namespace

const MigProfile* GpuModel::FindMigProfile(std::string_view profile) const {
  for (const auto& p : mig_profiles) {
    if (p.name == profile) return &p;
  }
  return nullptr;
}

std::string GpuModel::MigProfileNames() const {
  std::string out;
  for (auto it = mig_profiles.rbegin(); it != mig_profiles.rend(); ++it) {
    if (!out.empty()) out += ", ";
    out += it->name;
  }
  return out;
}

const GpuModel* FindGpuModel(std::string_view name) {
  for (const auto& m : kModels) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string KnownGpuModelNames() {
  std::string out;
  for (const auto& m : kModels) {
    if (!out.empty()) out += ", ";
    out += m.name;
  }
  return out;
}

}  // namespace gpumigrate::planner

#include <fmt/format.h>

namespace gpumigrate::planner {
std::string DecimalGB(uint64_t bytes) { return fmt::format("{:.3g} GB", static_cast<double>(bytes) / 1e9); }
}  // namespace gpumigrate::planner
