// Raw uAPI helpers for tests that drive the fake VFIO device through the fake
// kernel exactly as a VMM would (no engine code in between).
#pragma once

#include <cstring>
#include <vector>

#include "engine/devices/vfio/vfio_compat.h"
#include "tests/support/vfio/fake_kernel.h"

namespace gpumigrate::vfio::fake {

// One VFIO_DEVICE_FEATURE call: `payload` bytes after the header, argsz as
// given (default: header + payload). Returns the ioctl's result; the payload
// comes back in `out`.
template <typename Payload>
int Feature(Kernel& k, int fd, uint32_t flags, Payload& out, int argsz = -1) {
  alignas(8) std::byte buf[sizeof(vfio_device_feature) + sizeof(Payload)] = {};
  vfio_device_feature h{};
  h.argsz = argsz < 0 ? sizeof(buf) : static_cast<uint32_t>(argsz);
  h.flags = flags;
  std::memcpy(buf, &h, sizeof(h));
  std::memcpy(buf + sizeof(h), &out, sizeof(out));
  int r = k.Ioctl(fd, VFIO_DEVICE_FEATURE, buf);
  std::memcpy(&out, buf + sizeof(h), sizeof(out));
  return r;
}

// SET MIG_DEVICE_STATE: the ioctl's result; *data_fd the fd it returned (-1: none).
inline int SetMig(Kernel& k, int fd, uint32_t state, int* data_fd = nullptr) {
  vfio_device_feature_mig_state st{state, -1};
  int r = Feature(k, fd, VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE, st);
  if (data_fd) *data_fd = st.data_fd;
  return r;
}

// Binds a cdev fd to a fresh iommufd (/dev/iommu must be registered): the
// iommufd's fd, or the ioctl's -errno.
inline int Bind(Kernel& k, int fd) {
  int iommufd = k.Open("/dev/iommu", 0);
  vfio_device_bind_iommufd b{sizeof(b), 0, iommufd, 0};
  int r = k.Ioctl(fd, VFIO_DEVICE_BIND_IOMMUFD, &b);
  return r < 0 ? r : iommufd;
}

inline uint32_t GetMig(Kernel& k, int fd) {
  vfio_device_feature_mig_state st{~0u, -1};
  Feature(k, fd, VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE, st);
  return st.device_state;
}

// Reads a data fd until `stop` (0, -ENOMSG or an error): the bytes and the last result.
inline std::vector<std::byte> Drain(Kernel& k, int fd, ssize_t* last) {
  std::vector<std::byte> out;
  std::byte buf[4096];
  for (;;) {
    ssize_t r = k.Read(fd, buf, sizeof buf);
    if (r <= 0) {
      *last = r;
      return out;
    }
    out.insert(out.end(), buf, buf + r);
  }
}

}  // namespace gpumigrate::vfio::fake

#include <memory>
#include <string>

#include "tests/support/vfio/fake_vfio_device.h"

namespace gpumigrate::vfio::fake {

// A fake device registered at a path of a fake kernel: what a vfio: test opens.
struct FakeHost {
  FakeKernel kernel;
  std::shared_ptr<FakeVfioDevice> dev;
  std::string path = "/dev/vfio/devices/vfio0";
  explicit FakeHost(FakeVfioConfig cfg) : dev(FakeVfioDevice::Create(cfg)) {
    kernel.Add(path, [d = dev] { return d->OpenFile(); });
    // A stand-in iommufd that answers no ioctl: bind only needs an open one.
    kernel.Add("/dev/iommu", [] { return std::make_shared<File>(); });
  }
};

}  // namespace gpumigrate::vfio::fake
