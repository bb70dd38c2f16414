#include "engine/devices/sim/content.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

namespace gpumigrate::sim {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// wyrand: one 64x64->128 multiply per output; plenty for synthetic data.
struct WyRand {
  uint64_t state;
  uint64_t Next() {
    state += 0xa0761d6478bd642fULL;
    __uint128_t t = static_cast<__uint128_t>(state) * (state ^ 0xe7037ed1a0b428dbULL);
    return static_cast<uint64_t>(t >> 64) ^ static_cast<uint64_t>(t);
  }
};

uint16_t FloatToBf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

double NormalCdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

}  // namespace

// Bisection on erf: 60 halvings of [-9, 9], exact to double precision.
double InverseNormalCdfBisection(double u) {
  double lo = -9, hi = 9;
  for (int i = 0; i < 60; ++i) {
    double mid = 0.5 * (lo + hi);
    (NormalCdf(mid) < u ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

std::array<uint16_t, 65536> BuildContentTable(double sigma, bool bisection) {
  std::array<uint16_t, 65536> v;
  // Newton's method from the previous quantile (the table's u grow in small
  // steps): six steps where bisection took sixty erfc calls, 3 tables in ~15 ms
  // instead of ~300 ms, paid by the first page a process filled (round 0 of
  // every sim migration, which the path calibration then took for a startup
  // cost of every device). The values are the bisection's: a test compares
  // every entry of the three tables.
  double x = InverseNormalCdfBisection(0.5 / 65536.0);
  for (size_t i = 0; i < v.size(); ++i) {
    const double u = (static_cast<double>(i) + 0.5) / 65536.0;
    if (bisection) {
      x = InverseNormalCdfBisection(u);
    } else {
      for (int k = 0; k < 6; ++k) {
        const double density = std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
        x = std::clamp(x - (NormalCdf(x) - u) / density, -9.0, 9.0);
      }
    }
    v[i] = FloatToBf16(static_cast<float>(sigma * x));
  }
  return v;
}

namespace {

struct Table {
  std::array<uint16_t, 65536> v;
  explicit Table(double sigma) : v(BuildContentTable(sigma, false)) {}
};

const Table& TableFor(ContentKind kind) {
  // Weights of a trained transformer: N(0, 0.02). KV entries and activations are
  // of order one, activations with heavier spread.
  static const Table weights(0.02), kv(1.0), act(2.5);
  switch (kind) {
    case ContentKind::kWeights: return weights;
    case ContentKind::kKvCache: return kv;
    default: return act;
  }
}

}  // namespace

void WarmContentTables() {
  for (ContentKind k : {ContentKind::kWeights, ContentKind::kKvCache, ContentKind::kActivations}) (void)TableFor(k);
}

void FillPage(uint64_t seed, uint32_t region, uint64_t page, uint32_t version, ContentKind kind,
              std::span<std::byte> out) {
  if (version == 0 || kind == ContentKind::kZero) {
    std::memset(out.data(), 0, out.size());
    return;
  }
  WyRand rng{SplitMix64(seed ^ SplitMix64((uint64_t{region} << 48) ^ page ^ (uint64_t{version} << 20) ^
                                          (uint64_t{version} << 52)))};
  size_t n = out.size();
  size_t i = 0;
  std::byte* p = out.data();
  if (kind == ContentKind::kNoise) {
    for (; i + 8 <= n; i += 8) {
      const uint64_t r = rng.Next();
      std::memcpy(p + i, &r, 8);
    }
    if (i < n) {
      const uint64_t r = rng.Next();
      std::memcpy(p + i, &r, n - i);
    }
    return;
  }
  const Table& table = TableFor(kind);
  for (; i + 8 <= n; i += 8) {
    uint64_t r = rng.Next();
    uint64_t packed = uint64_t{table.v[r & 0xffff]} | (uint64_t{table.v[(r >> 16) & 0xffff]} << 16) |
                      (uint64_t{table.v[(r >> 32) & 0xffff]} << 32) |
                      (uint64_t{table.v[r >> 48]} << 48);
    std::memcpy(p + i, &packed, 8);
  }
  if (i < n) {
    uint64_t r = rng.Next();
    std::memcpy(p + i, &r, n - i);
  }
  if (kind == ContentKind::kActivations && n >= kCanaryBytes) {
    uint64_t v = version;
    uint64_t id = (uint64_t{region} << 48) ^ page ^ 0x5a5a000000000000ULL;
    std::memcpy(p, &v, 8);
    std::memcpy(p + 8, &id, 8);
  }
}

Canary ReadCanary(std::span<const std::byte> page, uint32_t region, uint64_t page_index) {
  Canary c;
  if (page.size() < kCanaryBytes) return c;
  uint64_t id = 0;
  std::memcpy(&c.version, page.data(), 8);
  std::memcpy(&id, page.data() + 8, 8);
  c.matches_identity = id == ((uint64_t{region} << 48) ^ page_index ^ 0x5a5a000000000000ULL);
  return c;
}

}  // namespace gpumigrate::sim
