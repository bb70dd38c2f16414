// What Debian 12's linux-libc-dev (6.1) lacks of the VFIO migration v2 uAPI
// that kernels >= 6.2 have (and the cdev bind of 6.6), with upstream's values from include/uapi/linux/vfio.h
// (docs/qemu-facts.md §7.2). Each piece is guarded so that newer headers
// win: build against 6.2+ headers and these vanish.
//
// The two PRE_COPY states are enum vfio_device_mig_state members upstream, not
// macros, so they cannot be guarded by #ifndef; they are constants in
// gpumigrate::vfio instead (a macro named like the enum member would break
// newer headers).
#pragma once

#include <linux/ioctl.h>
#include <linux/types.h>
#include <linux/vfio.h>

#include <cstddef>
#include <cstdint>

#ifndef VFIO_MIGRATION_PRE_COPY
#define VFIO_MIGRATION_PRE_COPY (1 << 2)
#endif

#ifndef VFIO_MIG_GET_PRECOPY_INFO
// Issued on the migration data fd (not the device fd) in PRE_COPY states only.
struct vfio_precopy_info {
  __u32 argsz;
  __u32 flags;
  __aligned_u64 initial_bytes;
  __aligned_u64 dirty_bytes;
};
#define VFIO_MIG_GET_PRECOPY_INFO _IO(VFIO_TYPE, VFIO_BASE + 21)
#endif

#ifndef VFIO_DEVICE_FEATURE_MIG_DATA_SIZE
// GET, in any state: the bytes STOP_COPY would produce now.
struct vfio_device_feature_mig_data_size {
  __aligned_u64 stop_copy_length;
};
#define VFIO_DEVICE_FEATURE_MIG_DATA_SIZE 9
#endif

#ifndef VFIO_DEVICE_BIND_IOMMUFD
// A VFIO device cdev (/dev/vfio/devices/vfioN, kernel >= 6.6) answers nothing
// but this until it is bound to an iommufd (/dev/iommu): then its feature
// ioctls work. out_devid names it in that iommufd.
struct vfio_device_bind_iommufd {
  __u32 argsz;
  __u32 flags;
  __s32 iommufd;
  __u32 out_devid;
};
#define VFIO_DEVICE_BIND_IOMMUFD _IO(VFIO_TYPE, VFIO_BASE + 18)
#endif

namespace gpumigrate::vfio {

// enum vfio_device_mig_state's members, including the two 6.1 lacks.
inline constexpr uint32_t kStateError = 0;
inline constexpr uint32_t kStateStop = 1;
inline constexpr uint32_t kStateRunning = 2;
inline constexpr uint32_t kStateStopCopy = 3;
inline constexpr uint32_t kStateResuming = 4;
inline constexpr uint32_t kStateRunningP2P = 5;
inline constexpr uint32_t kStatePreCopy = 6;
inline constexpr uint32_t kStatePreCopyP2P = 7;
inline constexpr uint32_t kStateCount = 8;

}  // namespace gpumigrate::vfio

// The layouts docs/qemu-facts.md §7.1/§7.2 give; a header that disagrees fails here.
static_assert(VFIO_DEVICE_FEATURE == 0x3b75);
static_assert(VFIO_DEVICE_RESET == 0x3b6f);
static_assert(VFIO_MIG_GET_PRECOPY_INFO == 0x3b79);
static_assert(VFIO_DEVICE_BIND_IOMMUFD == 0x3b76);
// Newer kernels append fields (token_uuid_ptr in 2025): the start is what must match.
static_assert(sizeof(struct vfio_device_bind_iommufd) >= 16 && offsetof(struct vfio_device_bind_iommufd, out_devid) == 12);
static_assert(VFIO_DEVICE_FEATURE_GET == (1 << 16) && VFIO_DEVICE_FEATURE_SET == (1 << 17) &&
              VFIO_DEVICE_FEATURE_PROBE == (1 << 18) && VFIO_DEVICE_FEATURE_MASK == 0xffff);
static_assert(VFIO_DEVICE_FEATURE_MIGRATION == 1 && VFIO_DEVICE_FEATURE_MIG_DEVICE_STATE == 2 &&
              VFIO_DEVICE_FEATURE_MIG_DATA_SIZE == 9);
static_assert(VFIO_MIGRATION_STOP_COPY == 1 && VFIO_MIGRATION_P2P == 2 && VFIO_MIGRATION_PRE_COPY == 4);
static_assert(sizeof(struct vfio_device_feature) == 8);
static_assert(sizeof(struct vfio_device_feature_migration) == 8);
static_assert(sizeof(struct vfio_device_feature_mig_state) == 8);
static_assert(offsetof(struct vfio_device_feature_mig_state, data_fd) == 4);
static_assert(sizeof(struct vfio_precopy_info) == 24);
static_assert(offsetof(struct vfio_precopy_info, initial_bytes) == 8);
static_assert(offsetof(struct vfio_precopy_info, dirty_bytes) == 16);
static_assert(sizeof(struct vfio_device_feature_mig_data_size) == 8);
static_assert(VFIO_DEVICE_STATE_ERROR == gpumigrate::vfio::kStateError &&
              VFIO_DEVICE_STATE_STOP == gpumigrate::vfio::kStateStop &&
              VFIO_DEVICE_STATE_RUNNING == gpumigrate::vfio::kStateRunning &&
              VFIO_DEVICE_STATE_STOP_COPY == gpumigrate::vfio::kStateStopCopy &&
              VFIO_DEVICE_STATE_RESUMING == gpumigrate::vfio::kStateResuming &&
              VFIO_DEVICE_STATE_RUNNING_P2P == gpumigrate::vfio::kStateRunningP2P);
