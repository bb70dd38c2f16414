#include "engine/devices/vfio/vfio_calls.h"

#include <fcntl.h>

#include <cstring>

#include <fmt/format.h>

namespace gpumigrate::vfio {
namespace {

// The header and its payload in one buffer, as VFIO_DEVICE_FEATURE wants (the
// header ends in a flexible array, so the pair is bytes, not a struct).
template <typename Payload>
struct Feature {
  alignas(8) std::byte buf[sizeof(vfio_device_feature) + sizeof(Payload)] = {};
  Payload data{};
};

template <typename Payload>
int FeatureCall(Kernel& k, int fd, uint32_t flags, Feature<Payload>& f) {
  vfio_device_feature hdr{};
  hdr.argsz = sizeof(f.buf);
  hdr.flags = flags;
  std::memcpy(f.buf, &hdr, sizeof(hdr));
  std::memcpy(f.buf + sizeof(hdr), &f.data, sizeof(Payload));
  int r = k.Ioctl(fd, VFIO_DEVICE_FEATURE, f.buf);
  std::memcpy(&f.data, f.buf + sizeof(hdr), sizeof(Payload));
  return r;
}

}  // namespace

Status KernelError(std::string_view what, int neg_errno) {
  const int e = -neg_errno;
  const char* name = strerrorname_np(e);
  // The code follows the errno, but never kUnavailable: the session reads that
  // as "the peer closed the connection", and this is the local device's error.
  StatusCode code = Status::FromErrno(e, what).code();
  if (code == StatusCode::kUnavailable) code = StatusCode::kInternal;
  return Status(code, fmt::format("{} failed: {} ({})", what, std::strerror(e), name ? name : std::to_string(e)));
}

std::string_view StateName(uint32_t s) {
  return DeviceStateName(static_cast<DeviceState>(s));
}

Result<int> Calls::OpenIommufd() const {
  int iommufd = k_.Open("/dev/iommu", O_RDWR);
  if (iommufd < 0) {
    return KernelError(fmt::format("{}: open /dev/iommu (a VFIO cdev is used through an iommufd: kernel >= 6.6 "
                                   "with CONFIG_IOMMUFD)",
                                   name_),
                       iommufd);
  }
  return iommufd;
}

Status Calls::Bind(int fd, int iommufd) const {
  vfio_device_bind_iommufd b{};
  b.argsz = sizeof(b);
  b.iommufd = iommufd;
  int r = k_.Ioctl(fd, VFIO_DEVICE_BIND_IOMMUFD, &b);
  if (r < 0) return KernelError(fmt::format("{}: VFIO_DEVICE_BIND_IOMMUFD", name_), r);
  return Status::Ok();
}

Result<uint64_t> Calls::MigrationFlags(int fd) const {
  Feature<vfio_device_feature_migration> f{};
  int r = FeatureCall(k_, fd, VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIGRATION, f);
  if (r == -ENOTTY) {
    return Unimplemented(fmt::format("{}: the device does not support VFIO migration (VFIO_DEVICE_FEATURE "
                                     "GET MIGRATION: ENOTTY)",
                                     name_));
  }
  if (r < 0) return KernelError(fmt::format("{}: VFIO_DEVICE_FEATURE GET MIGRATION", name_), r);
  return static_cast<uint64_t>(f.data.flags);
}

Result<uint32_t> Calls::GetState(int fd) const {
  Feature<vfio_device_feature_mig_state> f{};
  int r = FeatureCall(k_, fd, VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE, f);
  if (r < 0) return KernelError(fmt::format("{}: VFIO_DEVICE_FEATURE GET MIG_DEVICE_STATE", name_), r);
  return f.data.device_state;
}

Result<int> Calls::SetState(int fd, uint32_t from, uint32_t to) const {
  Feature<vfio_device_feature_mig_state> f{};
  f.data.device_state = to;
  f.data.data_fd = -1;
  int r = FeatureCall(k_, fd, VFIO_DEVICE_FEATURE_SET | VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE, f);
  if (r < 0) {
    return KernelError(fmt::format("{}: VFIO_DEVICE_FEATURE SET MIG_DEVICE_STATE {} -> {}", name_, StateName(from),
                                   StateName(to)),
                       r);
  }
  return f.data.data_fd;
}

Result<uint64_t> Calls::DataSize(int fd) const {
  Feature<vfio_device_feature_mig_data_size> f{};
  int r = FeatureCall(k_, fd, VFIO_DEVICE_FEATURE_GET | VFIO_DEVICE_FEATURE_MIG_DATA_SIZE, f);
  if (r < 0) return KernelError(fmt::format("{}: VFIO_DEVICE_FEATURE GET MIG_DATA_SIZE", name_), r);
  return static_cast<uint64_t>(f.data.stop_copy_length);
}

Status Calls::Reset(int fd) const {
  int r = k_.Ioctl(fd, VFIO_DEVICE_RESET, nullptr);
  if (r < 0) return KernelError(fmt::format("{}: VFIO_DEVICE_RESET", name_), r);
  return Status::Ok();
}

Result<PrecopyInfo> Calls::Precopy(int data_fd) const {
  vfio_precopy_info info{};
  info.argsz = sizeof(info);
  int r = k_.Ioctl(data_fd, VFIO_MIG_GET_PRECOPY_INFO, &info);
  if (r < 0) return KernelError(fmt::format("{}: VFIO_MIG_GET_PRECOPY_INFO", name_), r);
  return PrecopyInfo{info.initial_bytes, info.dirty_bytes};
}

}  // namespace gpumigrate::vfio
