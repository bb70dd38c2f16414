// The content store against real files in a temporary directory: what it
// indexes, what it fills, and each guard (a changed file, changed content with
// its mtime kept, a damaged index) — each of which a store without the guard
// would fail.
#include "gpumigrate/content/content_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;
constexpr uint32_t kPage = 4096;

class ContentStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gm-content-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `pages` pages, page k filled from seed+k (page `zero_at` all zeros).
  static std::vector<std::byte> Pages(uint64_t pages, uint32_t seed, int64_t zero_at = -1) {
    std::vector<std::byte> b(pages * kPage);
    for (uint64_t k = 0; k < pages; ++k) {
      if (static_cast<int64_t>(k) == zero_at) continue;
      std::mt19937_64 rng(seed + k);
      for (uint64_t i = 0; i < kPage; i += 8) {
        uint64_t v = rng();
        std::memcpy(b.data() + k * kPage + i, &v, 8);
      }
    }
    return b;
  }
  void Write(const std::string& name, std::span<const std::byte> bytes) {
    fs::create_directories(fs::path(dir_ + "/" + name).parent_path());
    std::ofstream f(dir_ + "/" + name, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::unique_ptr<ContentStore> Open() {
    auto s = ContentStore::Open(dir_, {.page_size = kPage});
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  static std::span<const std::byte> Page(const std::vector<std::byte>& b, uint64_t k) {
    return std::span<const std::byte>(b).subspan(k * kPage, kPage);
  }
  std::string dir_;
};

TEST_F(ContentStoreTest, Sha256IsTheStandardOne) {
  const std::string abc = "abc";
  EXPECT_EQ(DigestHex(Sha256(std::as_bytes(std::span(abc.data(), abc.size())))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_F(ContentStoreTest, IndexesWholeNonZeroPagesAndFillsThem) {
  auto a = Pages(8, 100, /*zero_at=*/3);
  a.resize(a.size() + 100);  // a partial last page: not indexed
  auto b = Pages(4, 200);
  Write("model/a.safetensors", a);
  Write("b.raw", b);
  Write(".hidden", Pages(2, 300));  // names starting with '.' are not scanned
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().files, 2u);
  EXPECT_EQ(s->stats().pages, 7u + 4u);
  EXPECT_EQ(s->stats().zero_pages, 1u);
  EXPECT_EQ(s->stats().files_hashed, 2u);
  EXPECT_TRUE(s->stats().index_written);
  EXPECT_EQ(s->stats().index_bytes_in_memory, 11u * sizeof(ContentStore::Entry));

  std::vector<std::byte> out(kPage);
  for (uint64_t k : {0, 5, 7}) {
    ASSERT_EQ(s->Fill(Sha256(Page(a, k)), out), FillResult::kFilled) << k;
    EXPECT_TRUE(std::equal(out.begin(), out.end(), Page(a, k).begin())) << k;
  }
  ASSERT_EQ(s->Fill(Sha256(Page(b, 2)), out), FillResult::kFilled);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), Page(b, 2).begin()));
  auto other = Pages(1, 300);
  EXPECT_FALSE(s->Contains(Sha256(other)));
  EXPECT_EQ(s->Fill(Sha256(other), out), FillResult::kNotHeld);
  EXPECT_EQ(s->filled(), 4u);
  EXPECT_EQ(s->missed(), 1u);
}

// The models a store holds (an agent's "models"): top-level directories and
// top-level files up to their first '.', hidden names (the index) left out.
TEST_F(ContentStoreTest, ModelsAreItsTopLevelNames) {
  Write("llama.weights.raw", Pages(1, 1));
  Write("llama.kv.raw", Pages(1, 2));
  Write("mistral/shard-1.safetensors", Pages(1, 3));
  Write("mistral/shard-2.safetensors", Pages(1, 4));
  Write("phi", Pages(1, 5));
  ASSERT_NE(Open(), nullptr);  // writes the hidden index beside them
  auto models = ContentStoreModels(dir_);
  ASSERT_TRUE(models.ok()) << models.status().ToString();
  EXPECT_EQ(*models, (std::vector<std::string>{"llama", "mistral", "phi"}));
  auto gone = ContentStoreModels(dir_ + "/absent");
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find(dir_ + "/absent"), std::string::npos) << gone.status().message();
}

TEST_F(ContentStoreTest, DuplicatePagesAreIndexedOnce) {
  auto a = Pages(4, 100);
  Write("a", a);
  Write("copy-of-a", a);
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().pages, 4u);
  EXPECT_EQ(s->stats().duplicate_pages, 4u);
}

TEST_F(ContentStoreTest, ASecondOpenReusesTheIndexAndRehashesOnlyChangedFiles) {
  Write("a", Pages(4, 100));
  Write("b", Pages(4, 200));
  ASSERT_TRUE(Open());
  auto again = Open();
  ASSERT_TRUE(again);
  EXPECT_EQ(again->stats().files_hashed, 0u);
  EXPECT_FALSE(again->stats().index_written);
  EXPECT_EQ(again->stats().pages, 8u);

  auto b2 = Pages(6, 900);
  Write("b", b2);
  fs::remove(dir_ + "/a");
  auto third = Open();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->stats().files_hashed, 1u);
  EXPECT_EQ(third->stats().files, 1u);
  EXPECT_EQ(third->stats().pages, 6u);
  EXPECT_TRUE(third->Contains(Sha256(Page(b2, 5))));
  EXPECT_FALSE(third->Contains(Sha256(Page(Pages(4, 100), 0))));  // a's pages went with it
}

TEST_F(ContentStoreTest, AFileChangedAfterIndexingIsNotUsed) {
  auto a = Pages(4, 100);
  Write("a", a);
  auto s = Open();
  ASSERT_TRUE(s);
  // Appended to: its size no longer matches the index.
  {
    std::ofstream f(dir_ + "/a", std::ios::binary | std::ios::app);
    f << "more";
  }
  std::vector<std::byte> out(kPage);
  EXPECT_EQ(s->Fill(Sha256(Page(a, 1)), out), FillResult::kFileChanged);
  EXPECT_EQ(s->refused(), 1u);
  EXPECT_EQ(s->filled(), 0u);
}

TEST_F(ContentStoreTest, ContentRewrittenWithItsMtimeKeptFailsItsDigestAndIsNotUsed) {
  auto a = Pages(4, 100);
  Write("a", a);
  struct stat before {};
  ASSERT_EQ(::stat((dir_ + "/a").c_str(), &before), 0);
  auto s = Open();
  ASSERT_TRUE(s);
  // Page 2 rewritten in place, same size, mtime put back as it was.
  auto changed = Pages(4, 500);
  {
    std::fstream f(dir_ + "/a", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(2 * kPage);
    f.write(reinterpret_cast<const char*>(changed.data()), kPage);
  }
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, (dir_ + "/a").c_str(), times, 0), 0);
  std::vector<std::byte> out(kPage);
  EXPECT_EQ(s->Fill(Sha256(Page(a, 2)), out), FillResult::kBadContent);
  // The file is not trusted again: not even for its pages that still match.
  EXPECT_EQ(s->Fill(Sha256(Page(a, 0)), out), FillResult::kFileChanged);
  EXPECT_EQ(s->filled(), 0u);
}

TEST_F(ContentStoreTest, ADamagedIndexIsRebuiltNotTrusted) {
  auto a = Pages(4, 100);
  Write("a", a);
  ASSERT_TRUE(Open());
  const std::string index = dir_ + "/.gpumigrate-index-4096";
  ASSERT_TRUE(fs::exists(index));
  // One byte of an entry's digest flipped: an index that trusted it would claim
  // content it does not hold.
  {
    std::fstream f(index, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(fs::file_size(index) - 8 - 48));
    char c = 0;
    f.seekg(f.tellp());
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(static_cast<std::streamoff>(fs::file_size(index) - 8 - 48));
    f.write(&c, 1);
  }
  auto s = Open();
  ASSERT_TRUE(s);
  EXPECT_NE(s->stats().rebuilt.find("checksum"), std::string::npos) << s->stats().rebuilt;
  EXPECT_EQ(s->stats().files_hashed, 1u);
  EXPECT_TRUE(s->stats().index_written);
  std::vector<std::byte> out(kPage);
  for (uint64_t k = 0; k < 4; ++k) EXPECT_EQ(s->Fill(Sha256(Page(a, k)), out), FillResult::kFilled) << k;
  // And the rewritten index is whole again.
  auto again = Open();
  ASSERT_TRUE(again);
  EXPECT_TRUE(again->stats().rebuilt.empty());
  EXPECT_EQ(again->stats().files_hashed, 0u);
}

TEST(ContentIndex, DecodeRejectsEachKindOfDamageNamingWhere) {
  std::vector<ContentStore::File> files = {{"a", 3 * kPage, 1}};
  std::vector<ContentStore::Entry> entries(2);
  entries[0].digest.fill(1);
  entries[0].file = 0;
  entries[0].page = 0;
  entries[1].digest.fill(2);
  entries[1].file = 0;
  entries[1].page = 2;
  auto good = EncodeContentIndex(kPage, files, entries);
  ASSERT_TRUE(DecodeContentIndex(good, kPage).ok());
  EXPECT_NE(DecodeContentIndex(good, 8192).status().message().find("page size 4096, wanted 8192"), std::string::npos);
  auto cut = good;
  cut.resize(10);
  EXPECT_NE(DecodeContentIndex(cut, kPage).status().message().find("shorter than a header"), std::string::npos);
  auto magic = good;
  magic[0] = std::byte{'X'};
  EXPECT_NE(DecodeContentIndex(magic, kPage).status().message().find("magic"), std::string::npos);
  // A consistent checksum over bad contents: each content check on its own.
  auto past_end = entries;
  past_end[1].page = 3;
  EXPECT_NE(DecodeContentIndex(EncodeContentIndex(kPage, files, past_end), kPage).status().message().find("past the end"),
            std::string::npos);
  auto unordered = entries;
  std::swap(unordered[0], unordered[1]);
  EXPECT_NE(DecodeContentIndex(EncodeContentIndex(kPage, files, unordered), kPage).status().message().find("out of order"),
            std::string::npos);
  auto escaping = files;
  escaping[0].path = "../etc/passwd";
  EXPECT_NE(DecodeContentIndex(EncodeContentIndex(kPage, escaping, entries), kPage).status().message().find("not inside"),
            std::string::npos);
  auto bad_file = entries;
  bad_file[0].file = 7;
  EXPECT_NE(DecodeContentIndex(EncodeContentIndex(kPage, files, bad_file), kPage).status().message().find("file 7 of 1"),
            std::string::npos);
}

TEST(ContentStoreOpen, RefusesANonDirectoryAndABadPageSize) {
  EXPECT_FALSE(ContentStore::Open("/nonexistent-gm-store", {}).ok());
  EXPECT_NE(ContentStore::Open("/tmp", {.page_size = 1000}).status().message().find("power of two"), std::string::npos);
}

}  // namespace
}  // namespace gpumigrate
