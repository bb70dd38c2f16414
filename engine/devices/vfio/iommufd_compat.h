// The part of the iommufd uAPI (upstream include/uapi/linux/iommufd.h, kernel
// >= 6.7) that the IOMMU dirty tracker and the fake iommufd use. Debian 12's
// linux-libc-dev (6.1) has no linux/iommufd.h at all, so everything below is
// defined here with upstream's values (docs/qemu-facts.md §7.4). A real header wins:
// where <linux/iommufd.h> exists and already has dirty tracking, this file only
// checks it. A real header older than 6.7 (6.2-6.6: iommufd without dirty
// tracking) would clash with these definitions, so that case stops the build
// with the reason instead of mixing two layouts.
//
// The iommufd ABI grows structs at their end (the kernel copies `size` bytes),
// so the checks are on offsets and minimum sizes, which newer headers keep.
#pragma once

#include <linux/ioctl.h>
#include <linux/types.h>

#include <cstddef>

#if __has_include(<linux/iommufd.h>)
#include <linux/iommufd.h>
#endif

#ifndef IOMMU_HWPT_GET_DIRTY_BITMAP
#ifdef IOMMU_IOAS_ALLOC
#error "linux/iommufd.h predates kernel 6.7 (no dirty tracking); build with 6.7+ headers or without linux/iommufd.h"
#endif

#define IOMMUFD_TYPE (';')

enum {
  IOMMUFD_CMD_BASE = 0x80,
  IOMMUFD_CMD_DESTROY = IOMMUFD_CMD_BASE,
  IOMMUFD_CMD_IOAS_ALLOC = 0x81,
  IOMMUFD_CMD_IOAS_ALLOW_IOVAS = 0x82,
  IOMMUFD_CMD_IOAS_COPY = 0x83,
  IOMMUFD_CMD_IOAS_IOVA_RANGES = 0x84,
  IOMMUFD_CMD_IOAS_MAP = 0x85,
  IOMMUFD_CMD_IOAS_UNMAP = 0x86,
  IOMMUFD_CMD_OPTION = 0x87,
  IOMMUFD_CMD_VFIO_IOAS = 0x88,
  IOMMUFD_CMD_HWPT_ALLOC = 0x89,
  IOMMUFD_CMD_GET_HW_INFO = 0x8a,
  IOMMUFD_CMD_HWPT_SET_DIRTY_TRACKING = 0x8b,
  IOMMUFD_CMD_HWPT_GET_DIRTY_BITMAP = 0x8c,
};

struct iommu_ioas_alloc {
  __u32 size;
  __u32 flags;
  __u32 out_ioas_id;
};
#define IOMMU_IOAS_ALLOC _IO(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_ALLOC)

enum iommufd_ioas_map_flags {
  IOMMU_IOAS_MAP_FIXED_IOVA = 1 << 0,
  IOMMU_IOAS_MAP_WRITEABLE = 1 << 1,
  IOMMU_IOAS_MAP_READABLE = 1 << 2,
};

struct iommu_ioas_map {
  __u32 size;
  __u32 flags;
  __u32 ioas_id;
  __u32 __reserved;
  __aligned_u64 user_va;
  __aligned_u64 length;
  __aligned_u64 iova;
};
#define IOMMU_IOAS_MAP _IO(IOMMUFD_TYPE, IOMMUFD_CMD_IOAS_MAP)

enum iommufd_hwpt_alloc_flags {
  IOMMU_HWPT_ALLOC_NEST_PARENT = 1 << 0,
  IOMMU_HWPT_ALLOC_DIRTY_TRACKING = 1 << 1,
};

enum iommu_hwpt_data_type {
  IOMMU_HWPT_DATA_NONE = 0,
  IOMMU_HWPT_DATA_VTD_S1 = 1,
};

struct iommu_hwpt_alloc {
  __u32 size;
  __u32 flags;
  __u32 dev_id;
  __u32 pt_id;
  __u32 out_hwpt_id;
  __u32 __reserved;
  __u32 data_type;
  __u32 data_len;
  __aligned_u64 data_uptr;
};
#define IOMMU_HWPT_ALLOC _IO(IOMMUFD_TYPE, IOMMUFD_CMD_HWPT_ALLOC)

enum iommu_hw_info_type {
  IOMMU_HW_INFO_TYPE_NONE = 0,
  IOMMU_HW_INFO_TYPE_INTEL_VTD = 1,
};

enum iommufd_hw_capabilities {
  IOMMU_HW_CAP_DIRTY_TRACKING = 1 << 0,
};

struct iommu_hw_info {
  __u32 size;
  __u32 flags;
  __u32 dev_id;
  __u32 data_len;
  __aligned_u64 data_uptr;
  __u32 out_data_type;
  __u32 __reserved;
  __aligned_u64 out_capabilities;
};
#define IOMMU_GET_HW_INFO _IO(IOMMUFD_TYPE, IOMMUFD_CMD_GET_HW_INFO)

enum iommufd_hwpt_set_dirty_tracking_flags {
  IOMMU_HWPT_DIRTY_TRACKING_ENABLE = 1,
};

struct iommu_hwpt_set_dirty_tracking {
  __u32 size;
  __u32 flags;
  __u32 hwpt_id;
  __u32 __reserved;
};
#define IOMMU_HWPT_SET_DIRTY_TRACKING _IO(IOMMUFD_TYPE, IOMMUFD_CMD_HWPT_SET_DIRTY_TRACKING)

enum iommufd_hwpt_get_dirty_bitmap_flags {
  IOMMU_HWPT_GET_DIRTY_BITMAP_NO_CLEAR = 1,
};

// The bit for `addr` is bit (addr - iova) / page_size of `data` (u64 words,
// little bit first); the kernel only ever sets bits in `data`.
struct iommu_hwpt_get_dirty_bitmap {
  __u32 size;
  __u32 hwpt_id;
  __u32 flags;
  __u32 __reserved;
  __aligned_u64 iova;
  __aligned_u64 length;
  __aligned_u64 page_size;
  __aligned_u64 data;
};
#define IOMMU_HWPT_GET_DIRTY_BITMAP _IO(IOMMUFD_TYPE, IOMMUFD_CMD_HWPT_GET_DIRTY_BITMAP)
#endif  // IOMMU_HWPT_GET_DIRTY_BITMAP

namespace gpumigrate::vfio::iommufd_abi {
// The first bytes of each struct as of 6.7: what the kernel requires (its
// min_size) and what the fake checks `size` against.
inline constexpr size_t kIoasAllocMin = offsetof(iommu_ioas_alloc, out_ioas_id) + 4;
inline constexpr size_t kIoasMapMin = offsetof(iommu_ioas_map, iova) + 8;
inline constexpr size_t kHwptAllocMin = offsetof(iommu_hwpt_alloc, __reserved) + 4;
inline constexpr size_t kHwInfoMin = offsetof(iommu_hw_info, out_data_type) + 8;  // 6.6: up to __reserved
inline constexpr size_t kSetDirtyMin = offsetof(iommu_hwpt_set_dirty_tracking, __reserved) + 4;
inline constexpr size_t kGetDirtyMin = offsetof(iommu_hwpt_get_dirty_bitmap, data) + 8;
}  // namespace gpumigrate::vfio::iommufd_abi

static_assert(IOMMU_IOAS_ALLOC == 0x3b81 && IOMMU_IOAS_MAP == 0x3b85, "_IO(';', 0x80 + n): docs/qemu-facts.md §7.4");
static_assert(IOMMU_HWPT_ALLOC == 0x3b89 && IOMMU_GET_HW_INFO == 0x3b8a, "_IO(';', 0x89/0x8a): docs/qemu-facts.md §7.4");
static_assert(IOMMU_HWPT_SET_DIRTY_TRACKING == 0x3b8b && IOMMU_HWPT_GET_DIRTY_BITMAP == 0x3b8c,
              "_IO(';', 0x8b/0x8c): docs/qemu-facts.md §7.4");
static_assert(IOMMU_HWPT_ALLOC_DIRTY_TRACKING == 2 && IOMMU_HW_CAP_DIRTY_TRACKING == 1);
static_assert(IOMMU_HWPT_DIRTY_TRACKING_ENABLE == 1 && IOMMU_HWPT_GET_DIRTY_BITMAP_NO_CLEAR == 1);
static_assert(sizeof(iommu_ioas_alloc) >= 12 && sizeof(iommu_ioas_map) >= 40);
static_assert(offsetof(iommu_ioas_map, user_va) == 16 && offsetof(iommu_ioas_map, iova) == 32);
static_assert(sizeof(iommu_hwpt_alloc) >= 40 && offsetof(iommu_hwpt_alloc, out_hwpt_id) == 16 &&
                  offsetof(iommu_hwpt_alloc, data_uptr) == 32,
              "iommu_hwpt_alloc: eight u32 then data_uptr (40 B in 6.7)");
static_assert(sizeof(iommu_hw_info) >= 40 && offsetof(iommu_hw_info, out_capabilities) == 32,
              "iommu_hw_info: out_capabilities at 32 (40 B in 6.7)");
static_assert(sizeof(iommu_hwpt_set_dirty_tracking) >= 16 && offsetof(iommu_hwpt_set_dirty_tracking, hwpt_id) == 8);
static_assert(sizeof(iommu_hwpt_get_dirty_bitmap) >= 48 && offsetof(iommu_hwpt_get_dirty_bitmap, iova) == 16 &&
                  offsetof(iommu_hwpt_get_dirty_bitmap, page_size) == 32 &&
                  offsetof(iommu_hwpt_get_dirty_bitmap, data) == 40,
              "iommu_hwpt_get_dirty_bitmap: 48 B, data at 40 (docs/qemu-facts.md §7.4)");
