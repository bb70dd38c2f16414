// PageHashes: per-page hashes, zero pages (full and a short tail), and the
// region digest both sides compare, computed here independently from its
// documented definition: XXH3-64 over the little-endian array of page hashes.
#include "engine/session/page_hashes.h"

#include <cstring>
#include <set>

#include <gtest/gtest.h>
#include <xxhash.h>

namespace gpumigrate {
namespace {

// Region 0: 4 full pages of 4096. Region 1: 2 pages of 1024, the second 100 bytes.
std::vector<RegionInfo> Layout() {
  return {RegionInfo{0, "a", 4 * 4096, 4096, RegionHint::kStatic},
          RegionInfo{1, "b", 1024 + 100, 1024, RegionHint::kDynamic}};
}

uint64_t DigestOf(const std::vector<uint64_t>& hashes) {
  std::vector<unsigned char> le(hashes.size() * 8);
  for (size_t i = 0; i < hashes.size(); ++i) {
    for (int b = 0; b < 8; ++b) le[i * 8 + b] = static_cast<unsigned char>(hashes[i] >> (8 * b));
  }
  return XXH3_64bits(le.data(), le.size());
}

TEST(PageHashes, HashPageIsXxh3AndZeroPagesHashTheirZeros) {
  std::vector<std::byte> page(4096, std::byte{0});
  page[7] = std::byte{42};
  EXPECT_EQ(HashPage(page), XXH3_64bits(page.data(), page.size()));
  std::vector<std::byte> zeros(4096);
  EXPECT_EQ(ZeroPageHash(4096), XXH3_64bits(zeros.data(), zeros.size()));
  EXPECT_EQ(ZeroPageHash(100), XXH3_64bits(zeros.data(), 100));
  EXPECT_NE(ZeroPageHash(4096), ZeroPageHash(100)) << "a zero page's hash depends on its length";
}

TEST(PageHashes, AFreshTableHoldsZeroPagesWithAShortTail) {
  PageHashes h(Layout());
  for (uint64_t p = 0; p < 4; ++p) EXPECT_EQ(h.Get(0, p), ZeroPageHash(4096)) << p;
  EXPECT_EQ(h.Get(1, 0), ZeroPageHash(1024));
  EXPECT_EQ(h.Get(1, 1), ZeroPageHash(100));
  EXPECT_EQ(h.RegionDigest(0), DigestOf(std::vector<uint64_t>(4, ZeroPageHash(4096))));
  EXPECT_EQ(h.RegionDigest(1), DigestOf({ZeroPageHash(1024), ZeroPageHash(100)}));
}

TEST(PageHashes, SetAndGetAndTheDigestFollowsThem) {
  PageHashes h(Layout());
  h.Set(0, 2, 0x1111);
  h.Set(1, 1, 0x2222);
  EXPECT_EQ(h.Get(0, 2), 0x1111u);
  EXPECT_EQ(h.Get(1, 1), 0x2222u);
  const uint64_t z = ZeroPageHash(4096);
  EXPECT_EQ(h.RegionDigest(0), DigestOf({z, z, 0x1111, z}));
  EXPECT_EQ(h.RegionDigest(1), DigestOf({ZeroPageHash(1024), 0x2222}));
}

TEST(PageHashes, EveryPageChangesTheDigestAndOnlyItsOwnRegions) {
  PageHashes h(Layout());
  const uint64_t base0 = h.RegionDigest(0), base1 = h.RegionDigest(1);
  std::set<uint64_t> seen{base0};
  for (uint64_t p = 0; p < 4; ++p) {
    const uint64_t old = h.Get(0, p);
    h.Set(0, p, 0xabcdef);
    EXPECT_TRUE(seen.insert(h.RegionDigest(0)).second) << "page " << p << " did not change the digest uniquely";
    EXPECT_EQ(h.RegionDigest(1), base1);
    h.Set(0, p, old);
    EXPECT_EQ(h.RegionDigest(0), base0) << "restoring page " << p;
  }
}

TEST(PageHashes, TheDigestIsOrderSensitive) {
  PageHashes a(Layout()), b(Layout());
  a.Set(0, 0, 1);
  a.Set(0, 1, 2);
  b.Set(0, 0, 2);
  b.Set(0, 1, 1);
  EXPECT_NE(a.RegionDigest(0), b.RegionDigest(0)) << "same hashes, swapped pages";
}

TEST(PageHashes, SetZeroRestoresTheZeroHashForFullAndTailPages) {
  PageHashes h(Layout());
  const uint64_t fresh0 = h.RegionDigest(0), fresh1 = h.RegionDigest(1);
  h.Set(0, 3, 5);
  h.Set(1, 0, 6);
  h.Set(1, 1, 7);
  h.SetZero(0, 3);
  h.SetZero(1, 1);  // the 100-byte tail
  h.SetZero(1, 0);  // then a full 1024-byte page: the zero hash depends on the length
  EXPECT_EQ(h.Get(0, 3), ZeroPageHash(4096));
  EXPECT_EQ(h.Get(1, 1), ZeroPageHash(100));
  EXPECT_EQ(h.Get(1, 0), ZeroPageHash(1024));
  EXPECT_EQ(h.RegionDigest(0), fresh0);
  EXPECT_EQ(h.RegionDigest(1), fresh1);
}

}  // namespace
}  // namespace gpumigrate
