#include "engine/devices/vfio/kernel.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace gpumigrate::vfio {
namespace {

// Retries EINTR: none of these calls has a partial effect when interrupted.
template <typename F>
auto Retry(F call) {
  for (;;) {
    auto r = call();
    if (r >= 0) return r;
    if (errno != EINTR) return static_cast<decltype(r)>(-errno);
  }
}

class Real final : public Kernel {
 public:
  int Open(const char* path, int flags) override { return Retry([&] { return ::open(path, flags | O_CLOEXEC); }); }
  int Ioctl(int fd, unsigned long request, void* arg) override {
    return Retry([&] { return ::ioctl(fd, request, arg); });
  }
  ssize_t Read(int fd, void* buf, size_t len) override { return Retry([&] { return ::read(fd, buf, len); }); }
  ssize_t Write(int fd, const void* buf, size_t len) override {
    return Retry([&] { return ::write(fd, buf, len); });
  }
  int Close(int fd) override { return ::close(fd) == 0 ? 0 : -errno; }  // never retried: the fd is gone either way
  void* Mmap(size_t len, int prot, int flags, int fd, off_t offset, int* err) override {
    void* p = ::mmap(nullptr, len, prot, flags, fd, offset);
    if (p != MAP_FAILED) return p;
    *err = errno;
    return nullptr;
  }
  int Munmap(void* addr, size_t len) override { return ::munmap(addr, len) == 0 ? 0 : -errno; }
  int Adopt(int received_fd) override { return received_fd; }
};

}  // namespace

Kernel& RealKernel() {
  static Real real;
  return real;
}

}  // namespace gpumigrate::vfio
