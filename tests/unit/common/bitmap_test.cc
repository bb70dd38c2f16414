#include "gpumigrate/common/bitmap.h"

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

TEST(DirtyBitmap, SetClearCountAndScan) {
  DirtyBitmap b(200);
  EXPECT_FALSE(b.Any());
  EXPECT_EQ(b.NextSet(0), 200u);
  b.Set(0);
  b.Set(63);
  b.Set(64);
  b.Set(199);
  EXPECT_EQ(b.Count(), 4u);
  EXPECT_EQ(b.NextSet(0), 0u);
  EXPECT_EQ(b.NextSet(1), 63u);
  EXPECT_EQ(b.NextSet(65), 199u);
  EXPECT_EQ(b.NextClear(63), 65u);
  EXPECT_EQ(b.NextClear(199), 200u);
  b.Clear(63);
  EXPECT_FALSE(b.Test(63));
  EXPECT_EQ(b.Count(), 3u);
}

TEST(DirtyBitmap, SetRangeAcrossWordsAndTail) {
  DirtyBitmap b(130);
  b.SetRange(5, 200);  // clipped at the end
  EXPECT_EQ(b.Count(), 125u);
  EXPECT_FALSE(b.Test(4));
  EXPECT_TRUE(b.Test(129));
  EXPECT_EQ(b.NextClear(5), 130u);
  // Bits past the last page never show up.
  b.SetAll();
  EXPECT_EQ(b.Count(), 130u);
  EXPECT_EQ(b.NextClear(0), 130u);
  DirtyBitmap c(130);
  c.Set(7);
  b.ClearAll();
  b.OrWith(c);
  EXPECT_EQ(b.Count(), 1u);
  EXPECT_TRUE(b.Test(7));
}

TEST(AtomicDirtyBitmap, ReadAndClearMovesBitsOnce) {
  AtomicDirtyBitmap a(100);
  a.Mark(3);
  a.Mark(99);
  a.MarkRange(10, 5);
  DirtyBitmap out(100);
  EXPECT_EQ(a.ReadAndClearInto(out), 7u);
  EXPECT_TRUE(out.Test(3) && out.Test(99) && out.Test(14));
  DirtyBitmap again(100);
  EXPECT_EQ(a.ReadAndClearInto(again), 0u);
  EXPECT_FALSE(again.Any());
}

// Writers mark pages while a reader syncs continuously: the union of all syncs
// (plus a last one after the writers stop) must hold every page ever marked.
TEST(AtomicDirtyBitmap, NoMarkLostUnderConcurrentSync) {
  constexpr uint64_t kPages = 1 << 14;
  AtomicDirtyBitmap a(kPages);
  std::atomic<bool> stop{false};
  std::vector<std::vector<uint64_t>> marked(2);
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&, w] {
      std::mt19937_64 rng(w + 1);
      for (int i = 0; i < 200000; ++i) {
        uint64_t p = rng() % kPages;
        a.Mark(p);
        marked[w].push_back(p);
      }
    });
  }
  DirtyBitmap seen(kPages);
  std::thread reader([&] {
    while (!stop.load()) {
      DirtyBitmap round(kPages);
      a.ReadAndClearInto(round);
      seen.OrWith(round);
    }
  });
  for (auto& t : writers) t.join();
  stop = true;
  reader.join();
  a.ReadAndClearInto(seen);
  for (const auto& list : marked) {
    for (uint64_t p : list) ASSERT_TRUE(seen.Test(p)) << "page " << p << " was marked but never reported";
  }
}

}  // namespace
}  // namespace gpumigrate
