#include "engine/devices/sim/content.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace gpumigrate::sim {
namespace {

std::vector<std::byte> Page(uint64_t seed, uint32_t region, uint64_t page, uint32_t version, ContentKind kind,
                            size_t size = 65536) {
  std::vector<std::byte> out(size);
  FillPage(seed, region, page, version, kind, out);
  return out;
}

double Entropy(const std::vector<uint8_t>& bytes) {
  std::array<double, 256> count{};
  for (uint8_t b : bytes) count[b] += 1;
  double h = 0;
  for (double c : count) {
    if (c > 0) {
      double p = c / static_cast<double>(bytes.size());
      h -= p * std::log2(p);
    }
  }
  return h;
}

float Bf16ToFloat(uint16_t v) { return std::bit_cast<float>(uint32_t{v} << 16); }

TEST(SimContent, DeterministicAndDistinct) {
  EXPECT_EQ(Page(1, 0, 7, 1, ContentKind::kWeights), Page(1, 0, 7, 1, ContentKind::kWeights));
  EXPECT_NE(Page(1, 0, 7, 1, ContentKind::kWeights), Page(1, 0, 7, 2, ContentKind::kWeights));
  EXPECT_NE(Page(1, 0, 7, 1, ContentKind::kWeights), Page(1, 0, 8, 1, ContentKind::kWeights));
  EXPECT_NE(Page(1, 0, 7, 1, ContentKind::kWeights), Page(2, 0, 7, 1, ContentKind::kWeights));
  EXPECT_NE(Page(1, 0, 7, 1, ContentKind::kKvCache), Page(1, 1, 7, 1, ContentKind::kKvCache));
  // A partial page is the prefix of the full one, so reads at any alignment agree.
  auto full = Page(3, 1, 9, 4, ContentKind::kKvCache, 4096);
  auto part = Page(3, 1, 9, 4, ContentKind::kKvCache, 4000);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin()));
}

TEST(SimContent, VersionZeroAndZeroKindAreZeros) {
  auto z = Page(1, 0, 0, 0, ContentKind::kWeights);
  EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](std::byte b) { return b == std::byte{0}; }));
  auto f = Page(1, 3, 0, 5, ContentKind::kZero);
  EXPECT_TRUE(std::all_of(f.begin(), f.end(), [](std::byte b) { return b == std::byte{0}; }));
}

// Weights must look like bf16 N(0, 0.02) and carry the byte entropy real
// weights have: a nearly random low byte, a skewed sign/exponent byte.
TEST(SimContent, WeightsHaveRealisticDistributionAndEntropy) {
  std::vector<uint8_t> lo, hi, all;
  double sum = 0, sumsq = 0;
  size_t n = 0;
  for (uint64_t p = 0; p < 16; ++p) {
    auto page = Page(11, 0, p, 1, ContentKind::kWeights);
    for (size_t i = 0; i + 1 < page.size(); i += 2) {
      uint8_t l = std::to_integer<uint8_t>(page[i]), h = std::to_integer<uint8_t>(page[i + 1]);
      lo.push_back(l);
      hi.push_back(h);
      all.push_back(l);
      all.push_back(h);
      float v = Bf16ToFloat(static_cast<uint16_t>(l | (h << 8)));
      sum += v;
      sumsq += double{v} * v;
      ++n;
    }
  }
  double mean = sum / static_cast<double>(n);
  double sd = std::sqrt(sumsq / static_cast<double>(n) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.02, 0.001);
  EXPECT_GT(Entropy(lo), 7.5);
  EXPECT_LT(Entropy(hi), 5.0);
  double h = Entropy(all);
  EXPECT_GT(h, 5.0);  // not trivially compressible...
  EXPECT_LT(h, 7.6);  // ...nor random: a real compressor gains something
}

TEST(SimContent, ActivationCanaryCarriesVersionAndIdentity) {
  auto page = Page(5, 2, 33, 1234, ContentKind::kActivations, 4096);
  Canary c = ReadCanary(page, 2, 33);
  EXPECT_EQ(c.version, 1234u);
  EXPECT_TRUE(c.matches_identity);
  EXPECT_FALSE(ReadCanary(page, 2, 34).matches_identity);  // misplaced page
  auto weights = Page(5, 2, 33, 1234, ContentKind::kWeights, 4096);
  EXPECT_FALSE(ReadCanary(weights, 2, 33).matches_identity);
}

}  // namespace
}  // namespace gpumigrate::sim

namespace gpumigrate::sim {
namespace {

// The tables are built by Newton's method now (bisection cost ~300 ms per
// process, in round 0): every entry must be what bisection gave, or a sim's
// content (and every checkpoint and digest of it) would change.
TEST(SimContentTables, NewtonBuildsTheSameTablesAsBisection) {
  for (double sigma : {0.02, 1.0, 2.5}) {
    const auto fast = BuildContentTable(sigma, false);
    const auto slow = BuildContentTable(sigma, true);
    for (size_t i = 0; i < fast.size(); ++i) ASSERT_EQ(fast[i], slow[i]) << "sigma " << sigma << " entry " << i;
  }
}

}  // namespace
}  // namespace gpumigrate::sim
