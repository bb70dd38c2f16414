// A fake kernel behind the vfio::Kernel seam: a table of file descriptors,
// each an object that answers ioctl/read/write/mmap by the rules of the uAPI it
// stands for (a VFIO device, a migration data fd, an iommufd). Paths are
// registered with Add(); Open() of a registered path returns a new fd whose
// object the path's factory makes. The file types themselves live beside this
// (fake_vfio_device.h, fake_iommufd.h); each documents the rules it enforces
// and where they come from.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/devices/vfio/kernel.h"

namespace gpumigrate::vfio::fake {

class FakeKernel;

// One open file. Defaults: the call is not supported by this kind of file.
class File {
 public:
  virtual ~File() = default;
  virtual int Ioctl(FakeKernel& k, unsigned long request, void* arg);  // -ENOTTY
  virtual ssize_t Read(FakeKernel& k, void* buf, size_t len);          // -EINVAL
  virtual ssize_t Write(FakeKernel& k, const void* buf, size_t len);   // -EINVAL
  virtual void* Mmap(FakeKernel& k, size_t len, int prot, int flags, off_t offset, int* err);  // ENODEV
  virtual void OnClose(FakeKernel&) {}
};

class FakeKernel final : public Kernel {
 public:
  // Open(path) then calls `factory` for the new file.
  void Add(const std::string& path, std::function<std::shared_ptr<File>()> factory);
  // Installs `file` at a new fd (what an ioctl that returns an fd does).
  int Install(std::shared_ptr<File> file);
  std::shared_ptr<File> Find(int fd);
  size_t OpenFds();  // leak checks in tests

  int Open(const char* path, int flags) override;
  int Ioctl(int fd, unsigned long request, void* arg) override;
  ssize_t Read(int fd, void* buf, size_t len) override;
  ssize_t Write(int fd, const void* buf, size_t len) override;
  int Close(int fd) override;
  void* Mmap(size_t len, int prot, int flags, int fd, off_t offset, int* err) override;
  int Munmap(void* addr, size_t len) override;
  // Received descriptors: a test stands a memfd named `memfd_name` in for the
  // real file (the workload passes it over the shim socket); Adopt() of a
  // descriptor of such a memfd closes it and installs `file` at a new fd.
  void AddReceivable(const std::string& memfd_name, std::shared_ptr<File> file);
  int Adopt(int received_fd) override;  // -EBADF for anything else

 private:
  std::mutex mu_;
  std::map<std::string, std::function<std::shared_ptr<File>()>> paths_;
  std::map<int, std::shared_ptr<File>> fds_;
  std::map<std::string, std::shared_ptr<File>> receivable_;
  int next_fd_ = 100;  // far from real fds, so a fake fd used with the real kernel fails loudly
};

}  // namespace gpumigrate::vfio::fake
