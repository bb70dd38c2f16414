// The content store's index file: a header, the files it covers, the entries
// sorted by digest, and an XXH3-64 checksum of all that. Little-endian.
//
//   "GMCSTIDX" | u32 version (2) | u32 page size | u32 files | u64 entries
//   per file:  u32 path length | path | u64 size | i64 mtime (ns)
//   per entry: 32-byte SHA-256 | u64 XXH3-64 of the page | u32 file | u32 page
//   u64 XXH3-64 of every byte before it
#include <algorithm>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "gpumigrate/content/content_store.h"

namespace gpumigrate {
namespace {

constexpr char kMagic[8] = {'G', 'M', 'C', 'S', 'T', 'I', 'D', 'X'};
constexpr uint32_t kVersion = 2;  // 1: entries without the XXH3 (rebuilt)
constexpr uint64_t kEntryBytes = 48;
constexpr uint32_t kMaxPath = 4096;

class Writer {
 public:
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  }
  template <typename T>
  void Int(T v) {
    std::byte b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF);
    Bytes(b, sizeof(T));
  }
  std::vector<std::byte> out;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : b_(b) {}
  size_t pos() const { return pos_; }
  size_t left() const { return b_.size() - pos_; }
  bool Bytes(void* p, size_t n) {
    if (left() < n) return false;
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Int(T* v) {
    if (left() < sizeof(T)) return false;
    uint64_t x = 0;
    for (size_t i = 0; i < sizeof(T); ++i) x |= static_cast<uint64_t>(b_[pos_ + i]) << (8 * i);
    pos_ += sizeof(T);
    *v = static_cast<T>(x);
    return true;
  }

 private:
  std::span<const std::byte> b_;
  size_t pos_ = 0;
};

bool SafeRelativePath(const std::string& p) {
  if (p.empty() || p.front() == '/') return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string part = p.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return p.find('\0') == std::string::npos;
}

}  // namespace

std::vector<std::byte> EncodeContentIndex(uint32_t page_size, const std::vector<ContentStore::File>& files,
                                          const std::vector<ContentStore::Entry>& entries) {
  Writer w;
  w.Bytes(kMagic, sizeof kMagic);
  w.Int<uint32_t>(kVersion);
  w.Int<uint32_t>(page_size);
  w.Int<uint32_t>(static_cast<uint32_t>(files.size()));
  w.Int<uint64_t>(entries.size());
  for (const auto& f : files) {
    w.Int<uint32_t>(static_cast<uint32_t>(f.path.size()));
    w.Bytes(f.path.data(), f.path.size());
    w.Int<uint64_t>(f.size);
    w.Int<int64_t>(f.mtime_ns);
  }
  w.out.reserve(w.out.size() + entries.size() * kEntryBytes + 8);
  for (const auto& e : entries) {
    w.Bytes(e.digest.data(), e.digest.size());
    w.Int<uint64_t>(e.xxh3);
    w.Int<uint32_t>(e.file);
    w.Int<uint32_t>(e.page);
  }
  w.Int<uint64_t>(XXH3_64bits(w.out.data(), w.out.size()));
  return std::move(w.out);
}

Result<DecodedContentIndex> DecodeContentIndex(std::span<const std::byte> bytes, uint32_t page_size) {
  auto bad = [](size_t at, std::string what) {
    return Corrupt(fmt::format("content index: {} (at byte {})", what, at));
  };
  if (bytes.size() < sizeof kMagic + 20 + 8) return bad(0, fmt::format("{} bytes, shorter than a header", bytes.size()));
  uint64_t want = 0;
  std::memcpy(&want, bytes.data() + bytes.size() - 8, 8);  // little-endian hosts only, as the writer
  const uint64_t got = XXH3_64bits(bytes.data(), bytes.size() - 8);
  Reader r(bytes.first(bytes.size() - 8));
  char magic[8];
  r.Bytes(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) return bad(0, "not a gpumigrate content index (magic)");
  uint32_t version = 0, ps = 0, nfiles = 0;
  uint64_t nentries = 0;
  r.Int(&version);
  r.Int(&ps);
  r.Int(&nfiles);
  r.Int(&nentries);
  if (version != kVersion) return bad(8, fmt::format("version {}, this build reads {}", version, kVersion));
  if (ps != page_size) return bad(12, fmt::format("page size {}, wanted {}", ps, page_size));
  if (got != want) return bad(bytes.size() - 8, fmt::format("checksum {:016x}, the bytes give {:016x}", want, got));
  DecodedContentIndex out;
  for (uint32_t i = 0; i < nfiles; ++i) {
    const size_t at = r.pos();
    uint32_t len = 0;
    if (!r.Int(&len) || len > kMaxPath || r.left() < len + 16) return bad(at, fmt::format("file {}: truncated", i));
    ContentStore::File f;
    f.path.resize(len);
    r.Bytes(f.path.data(), len);
    r.Int(&f.size);
    r.Int(&f.mtime_ns);
    if (!SafeRelativePath(f.path)) return bad(at, fmt::format("file {}: path '{}' is not inside the store", i, f.path));
    out.files.push_back(std::move(f));
  }
  if (nentries > r.left() / kEntryBytes || r.left() != nentries * kEntryBytes) {
    return bad(r.pos(), fmt::format("{} entries do not fill the {} bytes left", nentries, r.left()));
  }
  out.entries.resize(nentries);
  for (uint64_t i = 0; i < nentries; ++i) {
    const size_t at = r.pos();
    auto& e = out.entries[i];
    r.Bytes(e.digest.data(), e.digest.size());
    r.Int(&e.xxh3);
    r.Int(&e.file);
    r.Int(&e.page);
    if (e.file >= out.files.size()) return bad(at, fmt::format("entry {}: file {} of {}", i, e.file, out.files.size()));
    if ((static_cast<uint64_t>(e.page) + 1) * page_size > out.files[e.file].size) {
      return bad(at, fmt::format("entry {}: page {} past the end of {}", i, e.page, out.files[e.file].path));
    }
    if (i > 0 && !(out.entries[i - 1].digest < e.digest)) return bad(at, fmt::format("entry {}: digests out of order", i));
  }
  return out;
}

}  // namespace gpumigrate
