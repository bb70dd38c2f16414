// Seeding a content store from a device: its regions written as raw files.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "gpumigrate/content/content_store.h"

namespace gpumigrate {

Result<std::vector<std::string>> DumpRegions(Device& device, const std::string& dir, const std::string& name,
                                             bool static_only,
                                             const std::function<void(uint64_t done, uint64_t total)>& on_progress) {
  if (name.empty() || name.find('/') != std::string::npos || name.front() == '.') {
    return InvalidArgument(fmt::format("content store: '{}' is not a file name (no '/', not starting with '.')", name));
  }
  std::vector<const RegionInfo*> chosen;
  uint64_t total = 0;
  for (const RegionInfo& r : device.Regions()) {
    if (static_only && r.hint != RegionHint::kStatic) continue;
    chosen.push_back(&r);
    total += r.size_bytes;
  }
  if (chosen.empty()) {
    return InvalidArgument(fmt::format("{}: no {}region to add", device.Describe(), static_only ? "static " : ""));
  }
  std::vector<std::string> written;
  std::vector<std::byte> buf(8u << 20);
  uint64_t done = 0;
  for (const RegionInfo* r : chosen) {
    const std::string path = fmt::format("{}/{}.{}.raw", dir, name, r->name);
    const std::string tmp = fmt::format("{}/.{}.{}.raw.tmp", dir, name, r->name);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Unavailable(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
    Status st;
    for (uint64_t off = 0; off < r->size_bytes && st.ok(); off += buf.size()) {
      auto chunk = std::span<std::byte>(buf).first(std::min<uint64_t>(buf.size(), r->size_bytes - off));
      st = device.Read(r->id, off, chunk).WithContext(fmt::format("read region {}", r->name));
      if (st.ok() && ::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) {
        st = Unavailable(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
      }
      done += chunk.size();
      if (on_progress) on_progress(done, total);
    }
    if (::close(fd) != 0 && st.ok()) st = Unavailable(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
      st = Unavailable(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
    }
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st;
    }
    written.push_back(path);
  }
  return written;
}

}  // namespace gpumigrate
