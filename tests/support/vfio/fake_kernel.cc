#include "tests/support/vfio/fake_kernel.h"

#include <sys/mman.h>

#include <unistd.h>

#include <cerrno>
#include <string>

namespace gpumigrate::vfio::fake {

int File::Ioctl(FakeKernel&, unsigned long, void*) { return -ENOTTY; }
ssize_t File::Read(FakeKernel&, void*, size_t) { return -EINVAL; }
ssize_t File::Write(FakeKernel&, const void*, size_t) { return -EINVAL; }
void* File::Mmap(FakeKernel&, size_t, int, int, off_t, int* err) {
  *err = ENODEV;
  return nullptr;
}

void FakeKernel::Add(const std::string& path, std::function<std::shared_ptr<File>()> factory) {
  std::lock_guard lk(mu_);
  paths_[path] = std::move(factory);
}

int FakeKernel::Install(std::shared_ptr<File> file) {
  std::lock_guard lk(mu_);
  int fd = next_fd_++;
  fds_[fd] = std::move(file);
  return fd;
}

std::shared_ptr<File> FakeKernel::Find(int fd) {
  std::lock_guard lk(mu_);
  auto it = fds_.find(fd);
  return it == fds_.end() ? nullptr : it->second;
}

size_t FakeKernel::OpenFds() {
  std::lock_guard lk(mu_);
  return fds_.size();
}

int FakeKernel::Open(const char* path, int) {
  std::function<std::shared_ptr<File>()> factory;
  {
    std::lock_guard lk(mu_);
    auto it = paths_.find(path);
    if (it == paths_.end()) return -ENOENT;
    factory = it->second;
  }
  std::shared_ptr<File> file = factory();
  if (!file) return -EBUSY;  // a factory that refuses a second open (a VFIO device is exclusive)
  return Install(std::move(file));
}

// The file is looked up under the lock and called outside it: a call may
// Install() new fds (a state change that returns a data fd).
int FakeKernel::Ioctl(int fd, unsigned long request, void* arg) {
  auto f = Find(fd);
  return f ? f->Ioctl(*this, request, arg) : -EBADF;
}

ssize_t FakeKernel::Read(int fd, void* buf, size_t len) {
  auto f = Find(fd);
  return f ? f->Read(*this, buf, len) : -EBADF;
}

ssize_t FakeKernel::Write(int fd, const void* buf, size_t len) {
  auto f = Find(fd);
  return f ? f->Write(*this, buf, len) : -EBADF;
}

int FakeKernel::Close(int fd) {
  std::shared_ptr<File> f;
  {
    std::lock_guard lk(mu_);
    auto it = fds_.find(fd);
    if (it == fds_.end()) return -EBADF;
    f = std::move(it->second);
    fds_.erase(it);
  }
  f->OnClose(*this);
  return 0;
}

void* FakeKernel::Mmap(size_t len, int prot, int flags, int fd, off_t offset, int* err) {
  auto f = Find(fd);
  if (!f) {
    *err = EBADF;
    return nullptr;
  }
  return f->Mmap(*this, len, prot, flags, offset, err);
}

int FakeKernel::Munmap(void* addr, size_t len) { return ::munmap(addr, len) == 0 ? 0 : -errno; }

void FakeKernel::AddReceivable(const std::string& memfd_name, std::shared_ptr<File> file) {
  std::lock_guard lk(mu_);
  receivable_[memfd_name] = std::move(file);
}

// A memfd's /proc/self/fd link reads "/memfd:NAME (deleted)".
int FakeKernel::Adopt(int received_fd) {
  char link[256];
  const std::string path = "/proc/self/fd/" + std::to_string(received_fd);
  ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  (void)close(received_fd);
  if (n <= 0) return -EBADF;
  std::string target(link, static_cast<size_t>(n));
  const std::string prefix = "/memfd:", suffix = " (deleted)";
  if (target.rfind(prefix, 0) != 0) return -EBADF;
  target = target.substr(prefix.size());
  if (target.size() > suffix.size() && target.compare(target.size() - suffix.size(), suffix.size(), suffix) == 0) {
    target.resize(target.size() - suffix.size());
  }
  std::shared_ptr<File> file;
  {
    std::lock_guard lk(mu_);
    auto it = receivable_.find(target);
    if (it == receivable_.end()) return -EBADF;
    file = it->second;
  }
  return Install(std::move(file));
}

}  // namespace gpumigrate::vfio::fake
