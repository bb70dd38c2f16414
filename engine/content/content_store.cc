// The content store: scan, index (kept up to date across opens), fill.
#include "gpumigrate/content/content_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <xxhash.h>

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kHashChunk = 8ull << 20;

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

bool AllZero(std::span<const std::byte> b) {
  for (std::byte x : b) {
    if (x != std::byte{0}) return false;
  }
  return true;
}

Result<std::vector<ContentStore::File>> ScanFiles(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return InvalidArgument(fmt::format("content store {}: not a directory", dir));
  std::vector<ContentStore::File> files;
  fs::recursive_directory_iterator it(dir, fs::directory_options::none, ec);
  if (ec) return Unavailable(fmt::format("content store {}: cannot read: {}", dir, ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) return Unavailable(fmt::format("content store {}: cannot read: {}", dir, ec.message()));
    const fs::path& p = it->path();
    if (p.filename().string().starts_with(".")) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // links to files are followed
    ContentStore::File f;
    f.path = fs::relative(p, dir, ec).string();
    if (ec || f.path.starts_with("..")) continue;
    f.size = static_cast<uint64_t>(st.st_size);
    f.mtime_ns = MtimeNs(st);
    files.push_back(std::move(f));
  }
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return files;
}

Result<std::vector<std::byte>> ReadWhole(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Unavailable(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  std::vector<std::byte> out;
  std::byte buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      ::close(fd);
      return Unavailable(fmt::format("cannot read {}: {}", path, std::strerror(e)));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  ::close(fd);
  return out;
}

Status PreadAll(int fd, std::span<std::byte> out, uint64_t off) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Unavailable(std::strerror(errno));
    if (n == 0) return Unavailable(fmt::format("the file ended at byte {}", off + done));
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Hashes every whole page of `f` (file number `id`) into `out`.
Status HashFile(const std::string& dir, const ContentStore::File& f, uint32_t id, uint32_t page_size,
                ContentStoreStats& stats, uint64_t total, const ContentStoreOptions& opt,
                std::vector<ContentStore::Entry>& out) {
  const std::string path = dir + "/" + f.path;
  const uint64_t pages = f.size / page_size;
  if (pages > UINT32_MAX) {
    return InvalidArgument(fmt::format("content store: {} has {} pages of {} bytes, more than this index holds", path,
                                       pages, page_size));
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Unavailable(fmt::format("content store: cannot open {}: {}", path, std::strerror(errno)));
  Sha256Hasher h;
  const uint64_t chunk_pages = std::max<uint64_t>(1, kHashChunk / page_size);
  std::vector<std::byte> buf(chunk_pages * page_size);
  for (uint64_t p = 0; p < pages; p += chunk_pages) {
    const uint64_t n = std::min(chunk_pages, pages - p);
    auto span = std::span<std::byte>(buf).first(n * page_size);
    if (Status st = PreadAll(fd, span, p * page_size); !st.ok()) {
      ::close(fd);
      return Unavailable(fmt::format("content store: cannot read {}: {}", path, st.message()));
    }
    for (uint64_t k = 0; k < n; ++k) {
      auto page = span.subspan(k * page_size, page_size);
      if (AllZero(page)) {
        ++stats.zero_pages;
        continue;
      }
      out.push_back({h.Digest(page), XXH3_64bits(page.data(), page.size()), id, static_cast<uint32_t>(p + k)});
    }
    stats.bytes_hashed += span.size();
    if (opt.on_progress) opt.on_progress(stats.bytes_hashed, total);
  }
  ::close(fd);
  ++stats.files_hashed;
  return Status::Ok();
}

// The stored index, where it reads and decodes: what may be reused. Why it
// could not be is left in `rebuilt`.
bool LoadOldIndex(const std::string& index_path, uint32_t page_size, DecodedContentIndex& old, std::string& rebuilt) {
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    auto bytes = ReadWhole(index_path);
    auto decoded = bytes.ok() ? DecodeContentIndex(*bytes, page_size) : Result<DecodedContentIndex>(bytes.status());
    if (decoded.ok()) {
      old = std::move(*decoded);
      return true;
    }
    rebuilt = decoded.status().message();
  }
  return false;
}

// Every file's entries: an unchanged file's from the old index, a changed one's hashed again.
Result<std::vector<ContentStore::Entry>> CollectEntries(const std::string& dir, const ContentStoreOptions& opt,
                                                        const std::vector<ContentStore::File>& files,
                                                        const std::vector<bool>& reuse, const DecodedContentIndex& old,
                                                        std::map<std::string, uint32_t>& old_by_path,
                                                        uint64_t to_hash, ContentStoreStats& st) {
  std::vector<std::vector<ContentStore::Entry>> old_entries(old.files.size());
  for (const ContentStore::Entry& e : old.entries) old_entries[e.file].push_back(e);
  std::vector<ContentStore::Entry> entries;
  for (size_t i = 0; i < files.size(); ++i) {
    const uint32_t id = static_cast<uint32_t>(i);
    if (reuse[i]) {
      const uint32_t was = old_by_path[files[i].path];
      for (ContentStore::Entry e : old_entries[was]) {
        e.file = id;
        entries.push_back(e);
      }
      continue;
    }
    GM_RETURN_IF_ERROR(HashFile(dir, files[i], id, opt.page_size, st, to_hash, opt, entries));
  }
  return entries;
}

// Sorts the entries by digest and keeps one per digest (the first file's, then page's).
void SortDistinct(std::vector<ContentStore::Entry>& entries, ContentStoreStats& st) {
  using Entry = ContentStore::Entry;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.digest != b.digest) return a.digest < b.digest;
    return a.file != b.file ? a.file < b.file : a.page < b.page;
  });
  auto last = std::unique(entries.begin(), entries.end(),
                          [](const Entry& a, const Entry& b) { return a.digest == b.digest; });
  st.duplicate_pages = static_cast<uint64_t>(entries.end() - last);
  entries.erase(last, entries.end());
  entries.shrink_to_fit();
}

// Writes the index atomically: a reader (another receive opening the store) sees the old index or the new.
Status WriteIndexAtomically(const std::string& dir, const std::string& index_path, uint32_t page_size,
                            const std::vector<ContentStore::File>& files,
                            const std::vector<ContentStore::Entry>& entries) {
  auto encoded = EncodeContentIndex(page_size, files, entries);
  const std::string tmp = index_path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, encoded.data(), encoded.size()) == static_cast<ssize_t>(encoded.size());
  if (fd >= 0) ::close(fd);
  ok = ok && ::rename(tmp.c_str(), index_path.c_str()) == 0;
  if (!ok) {
    ::unlink(tmp.c_str());
    return Unavailable(fmt::format("content store {}: cannot write its index {}: {}", dir, index_path,
                                   std::strerror(errno)));
  }
  return Status::Ok();
}

}  // namespace

const char* FillResultName(FillResult r) {
  switch (r) {
    case FillResult::kFilled: return "filled";
    case FillResult::kNotHeld: return "not held";
    case FillResult::kFileChanged: return "file changed";
    case FillResult::kBadContent: return "content changed";
    case FillResult::kReadError: return "read error";
  }
  return "?";
}

Result<std::unique_ptr<ContentStore>> ContentStore::Open(const std::string& dir, const ContentStoreOptions& opt) {
  if (opt.page_size < 512 || (opt.page_size & (opt.page_size - 1)) != 0) {
    return InvalidArgument(fmt::format("content store: page size {} is not a power of two of at least 512", opt.page_size));
  }
  GM_ASSIGN_OR_RETURN(std::vector<File> files, ScanFiles(dir));
  std::unique_ptr<ContentStore> s(new ContentStore());
  s->dir_ = dir;
  s->page_size_ = opt.page_size;
  const std::string index_path =
      opt.index_path.empty() ? fmt::format("{}/.gpumigrate-index-{}", dir, opt.page_size) : opt.index_path;

  // The stored index, by file path: what may be reused.
  DecodedContentIndex old;
  const bool have_old = LoadOldIndex(index_path, opt.page_size, old, s->stats_.rebuilt);
  std::map<std::string, uint32_t> old_by_path;
  for (uint32_t i = 0; i < old.files.size(); ++i) old_by_path[old.files[i].path] = i;

  ContentStoreStats& st = s->stats_;
  uint64_t to_hash = 0;
  std::vector<bool> reuse(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    auto it = old_by_path.find(files[i].path);
    reuse[i] = it != old_by_path.end() && old.files[it->second].size == files[i].size &&
               old.files[it->second].mtime_ns == files[i].mtime_ns;
    if (!reuse[i]) to_hash += files[i].size;
    st.file_bytes += files[i].size;
  }
  // Nothing changed since the index was written: its entries are already
  // sorted, distinct and checked (DecodeContentIndex), and the files' order
  // (by path) is the same, so they are used as they are. Splitting and sorting
  // them again cost 0.6 s for a 2.4 GiB store at 4 KiB pages, paid by every
  // receive before its session could start.
  bool unchanged = have_old && old.files.size() == files.size();
  for (size_t i = 0; unchanged && i < files.size(); ++i) unchanged = reuse[i] && old.files[i].path == files[i].path;
  if (unchanged) {
    st.files = files.size();
    st.pages = old.entries.size();
    st.index_bytes_in_memory = old.entries.size() * sizeof(Entry);
    s->files_ = std::move(files);
    s->entries_ = std::move(old.entries);
    s->fds_.assign(s->files_.size(), -1);
    s->stale_.assign(s->files_.size(), 0);
    return s;
  }
  GM_ASSIGN_OR_RETURN(std::vector<Entry> entries,
                      CollectEntries(dir, opt, files, reuse, old, old_by_path, to_hash, st));
  SortDistinct(entries, st);

  st.files = files.size();
  st.pages = entries.size();
  st.index_bytes_in_memory = entries.capacity() * sizeof(Entry);
  const bool changed = !have_old || st.files_hashed > 0 || old.files.size() != files.size();
  if (changed) {
    GM_RETURN_IF_ERROR(WriteIndexAtomically(dir, index_path, opt.page_size, files, entries));
    st.index_written = true;
  }
  s->files_ = std::move(files);
  s->entries_ = std::move(entries);
  s->fds_.assign(s->files_.size(), -1);
  s->stale_.assign(s->files_.size(), 0);
  return s;
}

ContentStore::~ContentStore() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

const ContentStore::Entry* ContentStore::Find(const ContentDigest& d) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), d,
                             [](const Entry& e, const ContentDigest& x) { return e.digest < x; });
  return it != entries_.end() && it->digest == d ? &*it : nullptr;
}

bool ContentStore::Contains(const ContentDigest& d) const { return Find(d) != nullptr; }

// The file's descriptor, opened at first use; *changed when it is no longer the
// file that was indexed (size or mtime), then or at an earlier use.
int ContentStore::FileFd(uint32_t file, bool* changed) {
  std::lock_guard lk(mu_);
  *changed = stale_[file] != 0;
  if (*changed) return -1;
  if (fds_[file] >= 0) return fds_[file];
  int fd = ::open((dir_ + "/" + files_[file].path).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != files_[file].size ||
      MtimeNs(st) != files_[file].mtime_ns) {
    ::close(fd);
    stale_[file] = 1;
    *changed = true;
    return -1;
  }
  fds_[file] = fd;
  return fd;
}

FillResult ContentStore::Fill(const ContentDigest& d, std::span<std::byte> out) {
  std::vector<FillResult> r;
  FillRun(std::span<const ContentDigest>(&d, 1), out, r);
  return r[0];
}

void ContentStore::FillRun(std::span<const ContentDigest> digests, std::span<std::byte> out,
                           std::vector<FillResult>& results) {
  results.assign(digests.size(), FillResult::kNotHeld);
  if (out.size() != digests.size() * page_size_) {
    missed_ += digests.size();
    return;
  }
  std::vector<const Entry*> found(digests.size());
  for (size_t k = 0; k < digests.size(); ++k) found[k] = Find(digests[k]);
  for (size_t k = 0; k < digests.size();) {
    if (found[k] == nullptr) {
      ++missed_;
      ++k;
      continue;
    }
    // The longest run of pages that follow one another in the same file.
    size_t n = 1;
    while (k + n < digests.size() && found[k + n] != nullptr && found[k + n]->file == found[k]->file &&
           found[k + n]->page == found[k]->page + n) {
      ++n;
    }
    ReadRun(&found[k], n, out.subspan(k * page_size_, n * page_size_), &results[k]);
    k += n;
  }
}

void ContentStore::ReadRun(const Entry* const* run, size_t n, std::span<std::byte> out, FillResult* results) {
  const uint32_t file = run[0]->file;
  bool changed = false;
  const int fd = FileFd(file, &changed);
  auto all = [&](FillResult r) {
    for (size_t k = 0; k < n; ++k) results[k] = r;
    refused_ += n;
  };
  if (fd < 0) return all(changed ? FillResult::kFileChanged : FillResult::kReadError);
  if (!PreadAll(fd, out, static_cast<uint64_t>(run[0]->page) * page_size_).ok()) return all(FillResult::kReadError);
  bool bad = false;
  for (size_t k = 0; k < n; ++k) {
    auto page = out.subspan(k * page_size_, page_size_);
    if (XXH3_64bits(page.data(), page.size()) != run[k]->xxh3) {
      results[k] = FillResult::kBadContent;
      ++refused_;
      bad = true;
    } else {
      results[k] = FillResult::kFilled;
      ++filled_;
    }
  }
  if (bad) {
    // Rewritten in place (mtime kept, or changed since the first use): this
    // file is not used again in this store's life.
    std::lock_guard lk(mu_);
    stale_[file] = 1;
  }
}

}  // namespace gpumigrate
