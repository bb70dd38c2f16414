// The content store of a destination: a directory of files whose pages the
// destination's tenant already holds (raw weight files such as safetensors
// shards, region dumps of a replica or of yesterday's checkpoint), indexed by
// the SHA-256 of each whole page, so that a page the source offers by digest can
// be filled here instead of crossing the link (issue 42).
//
// SHA-256 (OpenSSL, which uses the CPU's SHA instructions) and not XXH3: a
// match stands for the bytes, so a collision must not be constructible; XXH3's
// can be. Debian 12 ships no BLAKE3 library.
//
// The index is a file (by default inside the directory, named
// `.gpumigrate-index-<page size>`; the dot hides it from the scan). Opening the
// store re-hashes only files whose size or modification time changed since the
// index was written, drops vanished ones, and rewrites the index when anything
// changed. An index that fails its checks (magic, version, page size, bounds,
// checksum) is rebuilt from the files, never trusted (`ContentStoreStats::
// rebuilt` says why).
//
// Fill re-checks at use: a file whose size or modification time differs from
// the index, or a page whose bytes are no longer what was indexed (their XXH3-64,
// kept beside the SHA-256 at indexing, differs), is not used (the page counts
// as a miss and must be sent). XXH3 suffices here: it guards the store's own
// files against change, not against a peer (the SHA-256 match with the
// source's offer is what stands for the bytes), and it is 15 times cheaper
// than hashing each filled page again with SHA-256.
//
// Memory: 48 bytes per indexed page (a 32-byte digest, an XXH3-64, a file and
// a page number): 12 MiB per GiB indexed at 4 KiB pages, 768 KiB at 64 KiB pages.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

using ContentDigest = std::array<uint8_t, 32>;

// SHA-256 of `bytes`.
ContentDigest Sha256(std::span<const std::byte> bytes);
// Lower-case hex, for messages.
std::string DigestHex(const ContentDigest& d);

// Computes SHA-256 over many pages with one reused OpenSSL context.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;
  ContentDigest Digest(std::span<const std::byte> bytes);

 private:
  void* ctx_;  // EVP_MD_CTX
};

struct ContentStoreOptions {
  uint32_t page_size = 4096;
  // Where the index lives; empty: DIR/.gpumigrate-index-<page_size>.
  std::string index_path;
  // Called while files are hashed (bytes hashed so far, bytes to hash).
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

struct ContentStoreStats {
  uint64_t files = 0;
  uint64_t file_bytes = 0;       // of the files scanned (partial last pages included)
  uint64_t pages = 0;            // distinct non-zero pages indexed
  uint64_t duplicate_pages = 0;  // pages whose content another indexed page already has (when re-indexed)
  uint64_t files_hashed = 0;     // hashed by this Open (new or changed since the index)
  uint64_t zero_pages = 0;       // of the files hashed: not indexed (zero pages never cross the link)
  uint64_t bytes_hashed = 0;
  uint64_t index_bytes_in_memory = 0;
  bool index_written = false;
  std::string rebuilt;  // why the stored index was not used (empty: used, or none yet)
};

// What Fill did with one page.
enum class FillResult {
  kFilled,      // out holds the page, its SHA-256 checked
  kNotHeld,     // no indexed page has that digest
  kFileChanged, // the file holding it changed since it was indexed (size or mtime)
  kBadContent,  // the bytes read no longer hash to the digest
  kReadError,   // the file could not be opened or read
};
const char* FillResultName(FillResult r);

class ContentStore {
 public:
  // Scans `dir` (regular files, recursively; names starting with '.' skipped),
  // loads and brings up to date its index. Errors: the directory cannot be read,
  // a file cannot be read while hashing, or the index cannot be written.
  static Result<std::unique_ptr<ContentStore>> Open(const std::string& dir, const ContentStoreOptions& options);
  ~ContentStore();

  const std::string& dir() const { return dir_; }
  uint32_t page_size() const { return page_size_; }
  const ContentStoreStats& stats() const { return stats_; }

  bool Contains(const ContentDigest& d) const;
  // Fills `out` (page_size() bytes) with the page whose SHA-256 is `d`, checked
  // as described above. Safe to call from several threads.
  FillResult Fill(const ContentDigest& d, std::span<std::byte> out);
  // The same for consecutive pages: out holds digests.size() pages; pages that
  // lie one after another in one file are read with one pread. results[k] says
  // what became of page k.
  void FillRun(std::span<const ContentDigest> digests, std::span<std::byte> out, std::vector<FillResult>& results);

  // Counters of Fill since Open.
  uint64_t filled() const { return filled_.load(); }
  uint64_t missed() const { return missed_.load(); }
  uint64_t refused() const { return refused_.load(); }  // changed file or content

  struct File {
    std::string path;  // relative to dir
    uint64_t size = 0;
    int64_t mtime_ns = 0;
  };
  struct Entry {
    ContentDigest digest;
    uint64_t xxh3;  // of the page's bytes when indexed
    uint32_t file;
    uint32_t page;
  };

 private:
  ContentStore() = default;
  int FileFd(uint32_t file, bool* changed);
  const Entry* Find(const ContentDigest& d) const;
  // Reads entries [first, first + n) (consecutive pages of one file) into out
  // and checks each page; fills results.
  void ReadRun(const Entry* const* run, size_t n, std::span<std::byte> out, FillResult* results);

  std::string dir_;
  uint32_t page_size_ = 0;
  std::vector<File> files_;
  std::vector<Entry> entries_;  // sorted by digest, digests distinct
  ContentStoreStats stats_;
  std::mutex mu_;
  std::vector<int> fds_;            // per file, -1: not open yet
  std::vector<uint8_t> stale_;      // per file: found changed at a Fill
  std::atomic<uint64_t> filled_{0}, missed_{0}, refused_{0};
};

// The models a store at `dir` holds, by name, for a host's inventory
// ("models"): each directory at its top (DIR/llama-3-70b/ with its shards)
// and each file at its top up to its first '.' (DIR/<name>.<region>.raw, as
// `content-store add --name` writes them); names starting with '.' (the
// index) are skipped. Sorted, each once. An error names the directory.
Result<std::vector<std::string>> ContentStoreModels(const std::string& dir);

// Seeds a store: writes the regions of `device` (only its static ones, the
// weights, when `static_only`) to DIR/<name>.<region>.raw, each whole or not at
// all (written aside, then renamed). Returns the paths written.
Result<std::vector<std::string>> DumpRegions(Device& device, const std::string& dir, const std::string& name,
                                             bool static_only,
                                             const std::function<void(uint64_t done, uint64_t total)>& on_progress);

// The index file's form (engine/content/index_file.cc): exposed for its tests.
std::vector<std::byte> EncodeContentIndex(uint32_t page_size, const std::vector<ContentStore::File>& files,
                                          const std::vector<ContentStore::Entry>& entries);
struct DecodedContentIndex {
  std::vector<ContentStore::File> files;
  std::vector<ContentStore::Entry> entries;
};
// Corrupt, naming what is wrong and at which offset, for anything but a whole,
// consistent index of `page_size`.
Result<DecodedContentIndex> DecodeContentIndex(std::span<const std::byte> bytes, uint32_t page_size);

}  // namespace gpumigrate
