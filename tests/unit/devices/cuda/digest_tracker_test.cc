// The CUDA regions' dirty tracker over a host-memory digest source: exact
// expectations of which pages a sync reports, the short last page, request
// sizes, errors with context, and the page digest's own properties.
#include "engine/devices/cuda/digest_tracker.h"

#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "engine/devices/cuda/page_hash.h"

namespace gpumigrate::cuda {
namespace {

// Regions in host memory, hashed as the shim would (page_hash.h); counts requests.
struct HostMemory {
  std::vector<std::vector<std::byte>> mem;
  uint64_t calls = 0;
  uint64_t max_request = 0;

  DigestSource Source() {
    return [this](uint32_t region, uint32_t page_bytes, uint64_t first, std::span<uint64_t> out) -> Status {
      if (region >= mem.size()) return InvalidArgument("no such region");
      ++calls;
      max_request = std::max<uint64_t>(max_request, out.size());
      const auto& m = mem[region];
      for (uint64_t k = 0; k < out.size(); ++k) {
        const uint64_t off = (first + k) * page_bytes;
        if (off >= m.size()) return InvalidArgument("page beyond the region");
        out[k] = HashPage(m.data() + off, std::min<uint64_t>(page_bytes, m.size() - off));
      }
      return Status::Ok();
    };
  }
};

void Poke(std::vector<std::byte>& m, uint64_t at, uint8_t v) { m[at] = static_cast<std::byte>(v); }

std::vector<uint64_t> SetPages(const DirtyBitmap& b) {
  std::vector<uint64_t> out;
  for (uint64_t p = b.NextSet(0); p < b.pages(); p = b.NextSet(p + 1)) out.push_back(p);
  return out;
}

TEST(DigestTracker, ReportsExactlyThePagesWhoseBytesChanged) {
  HostMemory h;
  h.mem.assign(8, std::vector<std::byte>(16 * 4096));  // region id 7 lives at index 7
  auto t = MakeDigestTracker("gpu-hash", h.Source(), {{0, 16 * 4096, 4096}, {7, 16 * 4096, 4096}}, 1000);
  ASSERT_TRUE(t->Start().ok());
  EXPECT_EQ(t->Name(), "gpu-hash");
  Poke(h.mem[0], 3 * 4096 + 17, 1);
  Poke(h.mem[0], 9 * 4096 + 4095, 1);  // last byte of page 9
  Poke(h.mem[7], 0, 5);
  DirtyBitmap b0(16), b7(16);
  ASSERT_TRUE(t->Sync(0, b0).ok());
  ASSERT_TRUE(t->Sync(7, b7).ok());
  EXPECT_EQ(SetPages(b0), (std::vector<uint64_t>{3, 9}));
  EXPECT_EQ(SetPages(b7), (std::vector<uint64_t>{0}));
  // Read and clear: nothing changed since.
  DirtyBitmap again(16);
  ASSERT_TRUE(t->Sync(0, again).ok());
  EXPECT_TRUE(SetPages(again).empty());
  // Written back to the bytes it had at Start: still a change since the last sync.
  Poke(h.mem[0], 3 * 4096 + 17, 0);
  ASSERT_TRUE(t->Sync(0, again).ok());
  EXPECT_EQ(SetPages(again), (std::vector<uint64_t>{3}));
}

TEST(DigestTracker, SwappedWordsInAPageAreAChange) {
  // A change that keeps the multiset of words (two words exchanged between lanes) must still show.
  HostMemory h;
  h.mem.assign(1, std::vector<std::byte>(8192));
  std::mt19937_64 rng(3);
  for (size_t i = 0; i < 8192; i += 8) {
    uint64_t v = rng();
    std::memcpy(h.mem[0].data() + i, &v, 8);
  }
  auto t = MakeDigestTracker("host-hash", h.Source(), {{0, 8192, 4096}}, 64);
  ASSERT_TRUE(t->Start().ok());
  std::byte tmp[8];
  std::memcpy(tmp, h.mem[0].data() + 8, 8);
  std::memcpy(h.mem[0].data() + 8, h.mem[0].data() + 16, 8);
  std::memcpy(h.mem[0].data() + 16, tmp, 8);
  DirtyBitmap b(2);
  ASSERT_TRUE(t->Sync(0, b).ok());
  EXPECT_EQ(SetPages(b), (std::vector<uint64_t>{0}));
}

TEST(DigestTracker, ShortLastPageAndRequestSize) {
  HostMemory h;
  const uint64_t size = 10 * 65536 + 2048;  // 11 pages, the last one 2 KiB
  h.mem.assign(1, std::vector<std::byte>(size));
  auto t = MakeDigestTracker("gpu-hash", h.Source(), {{0, size, 65536}}, 4);
  ASSERT_TRUE(t->Start().ok());
  EXPECT_EQ(h.calls, 3u);  // 4 + 4 + 3 pages
  EXPECT_EQ(h.max_request, 4u);
  Poke(h.mem[0], size - 1, 9);
  DirtyBitmap b(11);
  ASSERT_TRUE(t->Sync(0, b).ok());
  EXPECT_EQ(SetPages(b), (std::vector<uint64_t>{10}));
}

TEST(DigestTracker, ErrorsNameTheTrackerAndRegion) {
  HostMemory h;
  h.mem.assign(1, std::vector<std::byte>(8 * 4096));
  auto t = MakeDigestTracker("gpu-hash", h.Source(), {{0, 8 * 4096, 4096}}, 8);
  DirtyBitmap b(8);
  Status st = t->Sync(0, b);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("Sync before Start"), std::string::npos) << st.message();
  ASSERT_TRUE(t->Start().ok());
  DirtyBitmap wrong(9);
  st = t->Sync(0, wrong);
  EXPECT_NE(st.message().find("bitmap of 9 pages"), std::string::npos) << st.message();
  st = t->Sync(3, b);
  EXPECT_NE(st.message().find("region 3 is not tracked"), std::string::npos) << st.message();
  h.mem.clear();  // the source now fails
  st = t->Sync(0, b);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("gpu-hash: sync of region 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("no such region"), std::string::npos) << st.message();
  ASSERT_TRUE(t->Stop().ok());
  EXPECT_FALSE(t->Sync(0, b).ok());
}

TEST(PageHash, EveryWordAndLaneCounts) {
  // The reference the GPU kernel must match: flipping any one bit of a page changes its digest.
  std::vector<std::byte> page(4096);
  const uint64_t base = HashPage(page.data(), page.size());
  for (size_t byte = 0; byte < page.size(); byte += 37) {
    page[byte] ^= std::byte{0x10};
    EXPECT_NE(HashPage(page.data(), page.size()), base) << "byte " << byte;
    page[byte] ^= std::byte{0x10};
  }
  EXPECT_EQ(HashPage(page.data(), page.size()), base);
  // Different page sizes of zeros differ (the lane count of words folds in).
  EXPECT_NE(HashPage(page.data(), 2048), base);
}

}  // namespace
}  // namespace gpumigrate::cuda
