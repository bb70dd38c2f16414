// The kernel seam of the VFIO backend: the few system calls that the vfio:
// device and the IOMMU dirty trackers make on device, data and iommufd file
// descriptors. RealKernel() calls the kernel; tests pass a fake kernel
// (tests/support/vfio/fake_kernel.h) that enforces the uAPI's rules, because
// this machine kind has neither CONFIG_VFIO nor CONFIG_IOMMUFD.
//
// Every call returns what the system call returns on success and -errno on
// failure (never -1 with errno), so that a fake needs no thread-local state and
// callers cannot read a stale errno.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace gpumigrate::vfio {

class Kernel {
 public:
  virtual ~Kernel() = default;
  // open(2): a file descriptor, or -errno.
  virtual int Open(const char* path, int flags) = 0;
  // ioctl(2) with a pointer argument: >= 0, or -errno.
  virtual int Ioctl(int fd, unsigned long request, void* arg) = 0;
  // read(2)/write(2): bytes moved (0 at end of stream), or -errno.
  virtual ssize_t Read(int fd, void* buf, size_t len) = 0;
  virtual ssize_t Write(int fd, const void* buf, size_t len) = 0;
  // close(2): 0, or -errno.
  virtual int Close(int fd) = 0;
  // mmap(2) of a device region: the address, or nullptr with *err = errno.
  virtual void* Mmap(size_t len, int prot, int flags, int fd, off_t offset, int* err) = 0;
  virtual int Munmap(void* addr, size_t len) = 0;
  // A descriptor received from another process (SCM_RIGHTS: a workload's
  // iommufd or VFIO device fd), owned from now on: the descriptor to use with
  // this kernel, or -errno. The real kernel uses it as it is; a fake finds the
  // file the test set up for it.
  virtual int Adopt(int received_fd) = 0;
};

// The process's real kernel (thread-safe, stateless).
Kernel& RealKernel();

}  // namespace gpumigrate::vfio
