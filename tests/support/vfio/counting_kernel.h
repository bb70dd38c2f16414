// A vfio::Kernel decorator that counts what goes through it, so a test can say
// how large each data fd write was (a stream moved in bounded chunks) without
// trusting the engine's own bookkeeping.
#pragma once

#include <algorithm>
#include <atomic>

#include "engine/devices/vfio/kernel.h"

namespace gpumigrate::vfio::fake {

class CountingKernel final : public Kernel {
 public:
  explicit CountingKernel(Kernel& k) : k_(k) {}
  int Open(const char* path, int flags) override { return k_.Open(path, flags); }
  int Ioctl(int fd, unsigned long request, void* arg) override { return k_.Ioctl(fd, request, arg); }
  ssize_t Read(int fd, void* buf, size_t len) override { return k_.Read(fd, buf, len); }
  ssize_t Write(int fd, const void* buf, size_t len) override {
    ++writes;
    size_t m = max_write.load();
    while (len > m && !max_write.compare_exchange_weak(m, len)) {
    }
    return k_.Write(fd, buf, len);
  }
  int Close(int fd) override { return k_.Close(fd); }
  void* Mmap(size_t len, int prot, int flags, int fd, off_t offset, int* err) override {
    return k_.Mmap(len, prot, flags, fd, offset, err);
  }
  int Munmap(void* addr, size_t len) override { return k_.Munmap(addr, len); }
  int Adopt(int received_fd) override { return k_.Adopt(received_fd); }

  std::atomic<size_t> writes{0};
  std::atomic<size_t> max_write{0};  // the largest single write(2) asked for

 private:
  Kernel& k_;
};

}  // namespace gpumigrate::vfio::fake
