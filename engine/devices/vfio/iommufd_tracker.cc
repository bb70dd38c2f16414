// The IOMMU's own dirty bits through iommufd (kernel >= 6.7): tracking is
// switched on for the device's HWPT at Start (which clears stale bits), each
// Sync reads-and-clears the region's IOVA range, Stop switches it off.
#include <fmt/format.h>

#include "engine/devices/vfio/iommufd_compat.h"
#include "engine/devices/vfio/iova_bitmap.h"
#include "engine/devices/vfio/kernel.h"

namespace gpumigrate {
namespace {

using vfio::HwRegion;

class IommufdTracker : public DirtyTracker {
 public:
  IommufdTracker(vfio::Kernel& k, IommufdTarget t, std::vector<HwRegion> regions)
      : k_(k), t_(t), regions_(std::move(regions)) {}
  ~IommufdTracker() override {
    if (started_) (void)SetTracking(false);
  }

  std::string Name() const override { return "iommufd"; }

  Status Start() override {
    GM_RETURN_IF_ERROR(SetTracking(true));
    started_ = true;
    return Status::Ok();
  }

  Status Sync(uint32_t region, DirtyBitmap& out) override {
    GM_ASSIGN_OR_RETURN(const HwRegion* h, vfio::SyncTarget(regions_, region, out, started_, "iommufd"));
    auto read = [&](uint64_t iova, uint64_t length, uint64_t page_size, uint64_t* data) {
      iommu_hwpt_get_dirty_bitmap g{};
      g.size = sizeof g;
      g.hwpt_id = t_.hwpt_id;
      g.flags = 0;  // read and clear
      g.iova = iova;
      g.length = length;
      g.page_size = page_size;
      g.data = reinterpret_cast<uint64_t>(data);
      int rc = k_.Ioctl(t_.iommufd, IOMMU_HWPT_GET_DIRTY_BITMAP, &g);
      if (rc >= 0) return Status::Ok();
      return Status::FromErrno(rc, fmt::format("iommufd: IOMMU_HWPT_GET_DIRTY_BITMAP of HWPT {} for region {} "
                                               "(iova {:#x}, length {:#x}, page {:#x})",
                                               t_.hwpt_id, region, iova, length, page_size));
    };
    return vfio::ReadRegionBitmap(*h, read, scratch_, out);
  }

  Status Stop() override {
    if (!started_) return Status::Ok();
    started_ = false;
    return SetTracking(false);
  }

 private:
  Status SetTracking(bool on) {
    iommu_hwpt_set_dirty_tracking s{};
    s.size = sizeof s;
    s.flags = on ? IOMMU_HWPT_DIRTY_TRACKING_ENABLE : 0;
    s.hwpt_id = t_.hwpt_id;
    int rc = k_.Ioctl(t_.iommufd, IOMMU_HWPT_SET_DIRTY_TRACKING, &s);
    if (rc >= 0) return Status::Ok();
    return Status::FromErrno(rc, fmt::format("iommufd: IOMMU_HWPT_SET_DIRTY_TRACKING ({}) on HWPT {}",
                                             on ? "enable" : "disable", t_.hwpt_id));
  }

  vfio::Kernel& k_;
  const IommufdTarget t_;
  const std::vector<HwRegion> regions_;
  std::vector<uint64_t> scratch_;
  bool started_ = false;
};

}  // namespace

Result<uint32_t> AllocDirtyTrackingHwpt(vfio::Kernel& k, int iommufd, uint32_t dev_id, uint32_t ioas_id) {
  iommu_hwpt_alloc a{};
  a.size = sizeof a;
  a.flags = IOMMU_HWPT_ALLOC_DIRTY_TRACKING;
  a.dev_id = dev_id;
  a.pt_id = ioas_id;
  a.data_type = IOMMU_HWPT_DATA_NONE;
  int rc = k.Ioctl(iommufd, IOMMU_HWPT_ALLOC, &a);
  if (rc < 0) {
    return Status::FromErrno(rc, fmt::format("iommufd: IOMMU_HWPT_ALLOC with DIRTY_TRACKING for device {} on IOAS {}",
                                             dev_id, ioas_id));
  }
  return a.out_hwpt_id;
}

Result<std::unique_ptr<DirtyTracker>> MakeIommufdTracker(vfio::Kernel& k, IommufdTarget target,
                                                         std::vector<IovaRegion> regions) {
  GM_ASSIGN_OR_RETURN(auto hw, vfio::PrepareRegions(std::move(regions), "iommufd"));
  iommu_hw_info info{};
  info.size = sizeof info;
  info.dev_id = target.dev_id;
  int rc = k.Ioctl(target.iommufd, IOMMU_GET_HW_INFO, &info);
  if (rc < 0) {
    return Status::FromErrno(rc, fmt::format("iommufd: IOMMU_GET_HW_INFO for device {}", target.dev_id));
  }
  if ((info.out_capabilities & IOMMU_HW_CAP_DIRTY_TRACKING) == 0) {
    return Unavailable(fmt::format(
        "iommufd: the IOMMU of device {} does not report IOMMU_HW_CAP_DIRTY_TRACKING (capabilities {:#x}): it "
        "keeps no dirty bits (that needs Intel VT-d with SSADS, an AMD IOMMU with HD, or an ARM SMMUv3 with HTTU)",
        target.dev_id, static_cast<uint64_t>(info.out_capabilities)));
  }
  return std::unique_ptr<DirtyTracker>(std::make_unique<IommufdTracker>(k, target, std::move(hw)));
}

}  // namespace gpumigrate
