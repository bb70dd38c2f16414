// Deterministic page contents for the simulated GPU.
//
// A page's bytes are a pure function of (seed, region, page, version, kind), so
// the source side of a sim device stores only a version per page and can be far
// larger than host RAM. Version 0 is "never written" and reads as zeros. Values
// are bf16 drawn from a normal distribution (through a 65,536-entry inverse-CDF
// table), which gives the byte entropy real model weights and KV caches have, so
// compression figures measured on sim data mean something.
//
// Activation pages additionally start with a 16-byte canary: the version (the
// workload step that wrote the page) and the page's own (region, page) identity,
// so a stale or misplaced page is visible after migration. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <span>

namespace gpumigrate::sim {

// kNoise: uniformly random bytes (a sim with data=noise): what no codec can shrink.
enum class ContentKind : uint8_t { kZero, kWeights, kKvCache, kActivations, kNoise };

constexpr size_t kCanaryBytes = 16;

void FillPage(uint64_t seed, uint32_t region, uint64_t page, uint32_t version, ContentKind kind,
              std::span<std::byte> out);

// Builds the value tables FillPage draws from (once per process; a sim device
// does it when created, so no round's timing includes it).
void WarmContentTables();

// One table: sigma times the standard-normal quantile at (i + 0.5) / 65536, as
// bf16. `bisection`: the slow reference the fast build must equal (tests).
std::array<uint16_t, 65536> BuildContentTable(double sigma, bool bisection);
double InverseNormalCdfBisection(double u);

// The canary of an activation page: the version it was written with, or
// nullopt-like 0 when the bytes are not a canary for (region, page).
struct Canary {
  uint64_t version = 0;
  bool matches_identity = false;
};
Canary ReadCanary(std::span<const std::byte> page, uint32_t region, uint64_t page_index);

}  // namespace gpumigrate::sim
