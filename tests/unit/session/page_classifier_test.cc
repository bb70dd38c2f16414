// Zero-page elision: a chunk splits into exact runs, and every page's hash is
// the one the Prepare digest expects.
#include "engine/session/page_classifier.h"

#include <gtest/gtest.h>

#include "engine/session/page_hashes.h"

namespace gpumigrate {
namespace {

constexpr uint64_t kPage = 4096;

std::vector<std::byte> Chunk(const std::string& pattern, uint64_t last_page_bytes) {
  std::vector<std::byte> v((pattern.size() - 1) * kPage + last_page_bytes);
  for (size_t k = 0; k < pattern.size(); ++k) {
    if (pattern[k] == 'D') v[std::min<uint64_t>(k * kPage + 100, v.size() - 1)] = std::byte(k + 1);
  }
  return v;
}

TEST(PageClassifier, SplitsIntoExactRunsAndHashesEveryPage) {
  auto chunk = Chunk("ZDDZZDZ", 1000);  // the last page is a 1000-byte tail
  PageClassifier c;
  c.Classify(chunk, kPage);
  struct Want {
    uint64_t first, pages, offset, length;
    bool zero;
  };
  const Want want[] = {{0, 1, 0, kPage, true},
                       {1, 2, kPage, 2 * kPage, false},
                       {3, 2, 3 * kPage, 2 * kPage, true},
                       {5, 1, 5 * kPage, kPage, false},
                       {6, 1, 6 * kPage, 1000, true}};
  ASSERT_EQ(c.runs().size(), std::size(want));
  for (size_t i = 0; i < std::size(want); ++i) {
    const PageRun& r = c.runs()[i];
    EXPECT_EQ(r.first_page, want[i].first) << i;
    EXPECT_EQ(r.pages, want[i].pages) << i;
    EXPECT_EQ(r.offset_bytes, want[i].offset) << i;
    EXPECT_EQ(r.length_bytes, want[i].length) << i;
    EXPECT_EQ(r.zero, want[i].zero) << i;
  }
  ASSERT_EQ(c.hashes().size(), 7u);
  for (uint64_t k = 0; k < 7; ++k) {
    auto page = std::span<const std::byte>(chunk).subspan(k * kPage, std::min(kPage, chunk.size() - k * kPage));
    EXPECT_EQ(c.hashes()[k], HashPage(page)) << k;
  }
  EXPECT_EQ(c.hashes()[6], ZeroPageHash(1000));
  EXPECT_EQ(c.hashes()[0], ZeroPageHash(kPage));
}

TEST(PageClassifier, ReusedAcrossChunksAndEdgeCases) {
  PageClassifier c;
  c.Classify({}, kPage);
  EXPECT_TRUE(c.runs().empty());
  EXPECT_TRUE(c.hashes().empty());

  auto data = Chunk("DDD", kPage);
  c.Classify(data, kPage);
  ASSERT_EQ(c.runs().size(), 1u);
  EXPECT_FALSE(c.runs()[0].zero);
  EXPECT_EQ(c.runs()[0].length_bytes, 3 * kPage);

  // A short zero tail, then full zero pages: the cached zero hash follows the length.
  auto tail = Chunk("Z", 512);
  c.Classify(tail, kPage);
  EXPECT_EQ(c.hashes()[0], ZeroPageHash(512));
  auto zeros = Chunk("ZZ", kPage);
  c.Classify(zeros, kPage);
  ASSERT_EQ(c.runs().size(), 1u);
  EXPECT_TRUE(c.runs()[0].zero);
  EXPECT_EQ(c.runs()[0].pages, 2u);
  EXPECT_EQ(c.hashes()[1], ZeroPageHash(kPage));
}

}  // namespace
}  // namespace gpumigrate

namespace gpumigrate {
namespace {

// What a continued session sends of a run: only the pages whose hash differs
// from what the destination holds, as exact sub-runs (a short tail included).
TEST(PageClassifier, UnknownPartsAreThePagesTheDestinationDoesNotHold) {
  auto chunk = Chunk("DDDDDD", 1000);
  PageClassifier c;
  c.Classify(chunk, kPage);
  ASSERT_EQ(c.runs().size(), 1u);
  std::vector<uint64_t> held = c.hashes();
  held[2] ^= 1;  // the destination holds something else at pages 2, 3 and 5
  held[3] ^= 1;
  held[5] ^= 1;
  std::vector<PageRun> out;
  uint64_t same = AppendUnknownParts(c.runs()[0], c.hashes(), held, kPage, out);
  EXPECT_EQ(same, 3u);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].first_page, 2u);
  EXPECT_EQ(out[0].pages, 2u);
  EXPECT_EQ(out[0].offset_bytes, 2 * kPage);
  EXPECT_EQ(out[0].length_bytes, 2 * kPage);
  EXPECT_EQ(out[1].first_page, 5u);
  EXPECT_EQ(out[1].offset_bytes, 5 * kPage);
  EXPECT_EQ(out[1].length_bytes, 1000u) << "the short tail page keeps its length";

  out.clear();
  EXPECT_EQ(AppendUnknownParts(c.runs()[0], c.hashes(), c.hashes(), kPage, out), 6u);
  EXPECT_TRUE(out.empty()) << "everything held: nothing to send";
}

}  // namespace
}  // namespace gpumigrate
