// The VFIO migration v2 calls the vfio: device makes, each one a typed wrapper
// over vfio::Kernel that turns a -errno into a Status naming the call, the
// state arc (when there is one) and the errno ("... failed: Input/output error
// (EIO)").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/devices/vfio/kernel.h"
#include "engine/devices/vfio/vfio_compat.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::vfio {

// "what failed: Input/output error (EIO)", status kUnavailable.
Status KernelError(std::string_view what, int neg_errno);

struct PrecopyInfo {
  uint64_t initial_bytes = 0;
  uint64_t dirty_bytes = 0;
};

class Calls {
 public:
  Calls(Kernel& k, std::string name) : k_(k), name_(std::move(name)) {}
  Kernel& kernel() const { return k_; }
  const std::string& name() const { return name_; }

  // Opens /dev/iommu: the iommufd, which must stay open while devices bound to it are used.
  Result<int> OpenIommufd() const;
  // Binds the cdev `fd` to `iommufd` (VFIO_DEVICE_BIND_IOMMUFD).
  Status Bind(int fd, int iommufd) const;
  // VFIO_DEVICE_FEATURE GET MIGRATION: the VFIO_MIGRATION_* flags.
  Result<uint64_t> MigrationFlags(int fd) const;
  // GET MIG_DEVICE_STATE.
  Result<uint32_t> GetState(int fd) const;
  // SET MIG_DEVICE_STATE `from` -> `to`: the new data fd, or -1 when the arc opens none.
  Result<int> SetState(int fd, uint32_t from, uint32_t to) const;
  // GET MIG_DATA_SIZE: what STOP_COPY would produce now.
  Result<uint64_t> DataSize(int fd) const;
  // VFIO_DEVICE_RESET (ERROR -> RUNNING).
  Status Reset(int fd) const;
  // VFIO_MIG_GET_PRECOPY_INFO on a data fd.
  Result<PrecopyInfo> Precopy(int data_fd) const;

 private:
  Kernel& k_;
  std::string name_;
};

// The kernel's name of a state number ("PRE_COPY").
std::string_view StateName(uint32_t s);

}  // namespace gpumigrate::vfio
