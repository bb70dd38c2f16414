// A fake /dev/iommu (an iommufd context) for the IOMMU dirty tracker: IOAS
// allocation and fixed-IOVA maps, HWPT allocation, hardware info and the dirty
// tracking commands, with "DMA writes" from test threads standing for the
// device. One device (dev_id 1) is bound to the context; AttachDevice() stands
// for VFIO_DEVICE_ATTACH_IOMMUFD_PT, which belongs to the VFIO device file.
// IOPTEs are 4 KiB: a DMA write dirties the 4 KiB pages it touches.
//
// Rules enforced, and where they come from (torvalds/linux, 6.7+):
//   rule                                                     source
//   size < the struct's 6.7 minimum -> -EINVAL                iommufd/main.c iommufd_fops_ioctl (op->min_size)
//   unknown command -> -ENOTTY                                iommufd/main.c (-ENOIOCTLCMD, ENOTTY to users)
//   unknown object id (ioas, hwpt, device) -> -ENOENT         iommufd/main.c iommufd_get_object
//   GET_HW_INFO: flags/__reserved set -> -EOPNOTSUPP;          iommufd/device.c iommufd_get_hw_info;
//     out_capabilities has IOMMU_HW_CAP_DIRTY_TRACKING only    uapi iommufd.h enum iommufd_hw_capabilities
//     when the IOMMU can (configurable)
//   IOAS_MAP: FIXED_IOVA only here; iova/length/user_va not   iommufd/ioas.c iommufd_ioas_map,
//     4 KiB aligned -> -EINVAL; overlap -> -EEXIST             io_pagetable.c iopt_alloc_iova/iopt_insert_area
//   HWPT_ALLOC: flags beyond NEST_PARENT|DIRTY_TRACKING ->     iommufd/hw_pagetable.c iommufd_hwpt_alloc,
//     -EOPNOTSUPP; DIRTY_TRACKING on an IOMMU without the     iommufd_hwpt_paging_alloc ("!device_iommu_capable(
//     capability -> -EOPNOTSUPP                                ..IOMMU_CAP_DIRTY_TRACKING)")
//   SET_DIRTY_TRACKING: unknown flags/__reserved ->            hw_pagetable.c iommufd_hwpt_set_dirty_tracking;
//     -EOPNOTSUPP; HWPT without dirty ops -> -EOPNOTSUPP;     io_pagetable.c iopt_set_dirty_tracking
//     enabling clears stale dirty bits first                  (iopt_clear_dirty_data before enable)
//   GET_DIRTY_BITMAP: flags beyond NO_CLEAR or __reserved ->  hw_pagetable.c iommufd_hwpt_get_dirty_bitmap
//     -EOPNOTSUPP; HWPT without dirty ops -> -EOPNOTSUPP;     io_pagetable.c iopt_read_and_clear_dirty_data
//     tracking not enabled -> -EINVAL;                        intel/iommu.c intel_iommu_read_and_clear_dirty
//                                                              ("!dirty_tracking && dirty->bitmap")
//     page_size 0 or not a power of two >= 4 KiB, iova or     io_pagetable.c iommufd_check_iova_range
//     iova+length not aligned to it (or 4 KiB) -> -EINVAL;
//     length 0 or iova+length overflowing -> -EOVERFLOW/-EINVAL
//     range not fully mapped -> -EINVAL                        io_pagetable.c __iommu_read_and_clear_dirty
//                                                              (iopt_area_contig_done)
//     bit for addr = (addr - iova) / page_size; bits are only  uapi iommufd.h struct iommu_hwpt_get_dirty_bitmap;
//     set, never cleared, in the user's bitmap                iova_bitmap.c iova_bitmap_set
//     read-and-clear unless NO_CLEAR                           uapi iommufd.h IOMMU_HWPT_GET_DIRTY_BITMAP_NO_CLEAR
//   DMA write: an unmapped IOVA faults and dirties nothing;   the IOMMU's translation (no IOPTE, no A/D bit);
//     a mapped one sets dirty bits only while tracking is on  VT-d SSADS / AMD HD / SMMU HTTU behaviour
// Documented only, not modelled: IOAS_UNMAP, DESTROY, IOVA ranges reserved by
// the IOMMU, nested HWPTs, IOPTEs larger than 4 KiB (a huge IOPTE is dirtied whole).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <vector>

#include "tests/support/vfio/fake_dirty_log.h"
#include "tests/support/vfio/fake_kernel.h"

namespace gpumigrate::vfio::fake {

class FakeIommufd final : public File {
 public:
  static constexpr uint32_t kDevId = 1;
  explicit FakeIommufd(bool dirty_capable) : dirty_capable_(dirty_capable) {}

  int Ioctl(FakeKernel& k, unsigned long request, void* arg) override;

  // The device's DMA through the HWPT it is attached to: dirties the mapped
  // 4 KiB pages of [iova, iova + len) while tracking is on. Returns the number
  // of pages that faulted (not mapped, or no HWPT attached). Any thread.
  uint64_t DmaWrite(uint64_t iova, uint64_t len);
  // VFIO_DEVICE_ATTACH_IOMMUFD_PT: 0, or -ENOENT for an unknown HWPT.
  int AttachDevice(uint32_t hwpt_id);
  uint64_t faults() const { return faults_.load(); }

 private:
  struct Area {
    uint64_t iova, length;
  };
  struct Ioas {
    std::map<uint64_t, Area> areas;  // by iova
  };
  struct Hwpt {
    uint32_t ioas_id;
    bool dirty_ops;
    std::atomic<bool> tracking{false};
    std::map<uint64_t, std::unique_ptr<DirtyLog>> logs;  // one per area, by iova
  };

  int IoasAlloc(void* arg);
  int IoasMap(void* arg);
  int HwptAlloc(void* arg);
  int GetHwInfo(void* arg);
  int SetDirtyTracking(void* arg);
  int GetDirtyBitmap(void* arg);
  // Whether [iova, iova + len) is covered by contiguous areas of `ioas`.
  static bool Covered(const Ioas& ioas, uint64_t iova, uint64_t len);

  const bool dirty_capable_;
  std::shared_mutex mu_;  // exclusive: object changes; shared: DMA writes and bitmap reads
  uint32_t next_id_ = kDevId + 1;
  std::map<uint32_t, Ioas> ioas_;
  std::map<uint32_t, std::unique_ptr<Hwpt>> hwpts_;
  uint32_t attached_ = 0;
  std::atomic<uint64_t> faults_{0};
};

// Setting up an IO address space through the seam, as a VMM does before the
// tracker sees it (tests and perf/vfio_bitmap): 0 or -errno, as the ioctl.
int IoasAlloc(Kernel& k, int iommufd, uint32_t* ioas_id);
// IOMMU_IOAS_MAP with FIXED_IOVA of [iova, iova + length), readable and writeable.
int IoasMapFixed(Kernel& k, int iommufd, uint32_t ioas_id, uint64_t iova, uint64_t length);

}  // namespace gpumigrate::vfio::fake
