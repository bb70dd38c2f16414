#include "shim/dma_regions.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace gpumigrate::shimdma {
namespace {

namespace w = shimwire;

struct Table {
  std::mutex mu;
  std::map<std::string, Declared> regions;  // fd: our duplicate
  std::vector<std::pair<dev_t, ino_t>> ids;  // the open file behind each duplicate ...
  std::vector<int> dups;                      // ... and the duplicate
};

Table& T() {
  static Table* t = new Table;  // never destroyed, like the shim's own state
  return *t;
}

}  // namespace

int Declare(const std::string& name, const Declared& d, std::string* why) {
  if (d.kind == w::DmaKind::kNone || d.fd < 0) {
    *why = "a DMA declaration needs a file descriptor";
    return -EBADF;
  }
  if (d.iova % 4096 != 0) {
    *why = "region '" + name + "': the IOVA must be a multiple of 4 KiB";
    return -EINVAL;
  }
  struct stat st {};
  if (fstat(d.fd, &st) != 0) {
    int e = errno;
    *why = "region '" + name + "': file descriptor " + std::to_string(d.fd) + ": " + std::strerror(e);
    return -e;
  }
  Table& t = T();
  std::lock_guard lk(t.mu);
  if (t.regions.count(name) != 0) {
    *why = "region '" + name + "' already has a DMA declaration";
    return -EEXIST;
  }
  // The same open file named again (the same descriptor, or a dup of it): share
  // one duplicate, so gpumigrate sees one IOMMU context, one tracker.
  Declared ours = d;
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  auto at = std::find(t.ids.begin(), t.ids.end(), id);
  if (at != t.ids.end()) {
    ours.fd = t.dups[static_cast<size_t>(at - t.ids.begin())];
  } else {
    ours.fd = fcntl(d.fd, F_DUPFD_CLOEXEC, 0);
    if (ours.fd < 0) {
      int e = errno;
      *why = std::string("duplicating the file descriptor: ") + std::strerror(e);
      return -e;
    }
    t.ids.push_back(id);
    t.dups.push_back(ours.fd);
  }
  t.regions.emplace(name, ours);
  return 0;
}

void Describe(const std::string& name, w::RegionDesc& desc, std::vector<int>& fds) {
  Table& t = T();
  std::lock_guard lk(t.mu);
  auto it = t.regions.find(name);
  if (it == t.regions.end()) return;
  const Declared& d = it->second;
  auto at = std::find(fds.begin(), fds.end(), d.fd);
  desc.dma_kind = static_cast<uint32_t>(d.kind);
  desc.dma_fd_index = static_cast<int32_t>(at - fds.begin());
  if (at == fds.end()) fds.push_back(d.fd);
  desc.dma_dev_id = d.dev_id;
  desc.dma_hwpt_id = d.hwpt_id;
  desc.dma_iova = d.iova;
}

void Reset() {
  Table& t = T();
  std::lock_guard lk(t.mu);
  for (int fd : t.dups) close(fd);
  t.dups.clear();
  t.ids.clear();
  t.regions.clear();
}

}  // namespace gpumigrate::shimdma
