#include "tests/support/vfio/fake_iommufd.h"

#include <cerrno>
#include <cstring>
#include <mutex>

#include "engine/devices/vfio/iommufd_compat.h"

namespace gpumigrate::vfio::fake {
namespace {

constexpr uint64_t kIoPage = 4096;

bool PowerOfTwo(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// The kernel reads `size` (the struct's first u32) and refuses less than the
// command's minimum.
bool SizeOk(const void* arg, size_t min) {
  uint32_t size;
  std::memcpy(&size, arg, sizeof size);
  return size >= min;
}

}  // namespace

int FakeIommufd::Ioctl(FakeKernel&, unsigned long request, void* arg) {
  using namespace iommufd_abi;
  switch (request) {
    case IOMMU_IOAS_ALLOC: return SizeOk(arg, kIoasAllocMin) ? IoasAlloc(arg) : -EINVAL;
    case IOMMU_IOAS_MAP: return SizeOk(arg, kIoasMapMin) ? IoasMap(arg) : -EINVAL;
    case IOMMU_HWPT_ALLOC: return SizeOk(arg, kHwptAllocMin) ? HwptAlloc(arg) : -EINVAL;
    case IOMMU_GET_HW_INFO: return SizeOk(arg, kHwInfoMin) ? GetHwInfo(arg) : -EINVAL;
    case IOMMU_HWPT_SET_DIRTY_TRACKING: return SizeOk(arg, kSetDirtyMin) ? SetDirtyTracking(arg) : -EINVAL;
    case IOMMU_HWPT_GET_DIRTY_BITMAP: return SizeOk(arg, kGetDirtyMin) ? GetDirtyBitmap(arg) : -EINVAL;
    default: return -ENOTTY;
  }
}

int FakeIommufd::IoasAlloc(void* arg) {
  auto* a = static_cast<iommu_ioas_alloc*>(arg);
  if (a->flags != 0) return -EOPNOTSUPP;
  std::unique_lock lk(mu_);
  a->out_ioas_id = next_id_++;
  ioas_[a->out_ioas_id];
  return 0;
}

int FakeIommufd::IoasMap(void* arg) {
  auto* m = static_cast<iommu_ioas_map*>(arg);
  if (m->__reserved != 0 || (m->flags & ~(IOMMU_IOAS_MAP_FIXED_IOVA | IOMMU_IOAS_MAP_WRITEABLE |
                                          IOMMU_IOAS_MAP_READABLE)) != 0) {
    return -EOPNOTSUPP;
  }
  if (!(m->flags & IOMMU_IOAS_MAP_FIXED_IOVA)) return -EOPNOTSUPP;  // the fake allocates no IOVA
  if (m->length == 0 || ((m->iova | m->length | m->user_va) & (kIoPage - 1)) != 0) return -EINVAL;
  if (m->iova + m->length < m->iova) return -EOVERFLOW;
  std::unique_lock lk(mu_);
  auto it = ioas_.find(m->ioas_id);
  if (it == ioas_.end()) return -ENOENT;
  auto& areas = it->second.areas;
  auto next = areas.lower_bound(m->iova);
  if (next != areas.end() && next->first < m->iova + m->length) return -EEXIST;
  if (next != areas.begin() && std::prev(next)->second.iova + std::prev(next)->second.length > m->iova) return -EEXIST;
  areas[m->iova] = Area{m->iova, m->length};
  for (auto& [id, h] : hwpts_) {
    if (h->ioas_id == m->ioas_id) h->logs[m->iova] = std::make_unique<DirtyLog>(m->iova, m->length, kIoPage);
  }
  return 0;
}

int FakeIommufd::HwptAlloc(void* arg) {
  auto* a = static_cast<iommu_hwpt_alloc*>(arg);
  if ((a->flags & ~(IOMMU_HWPT_ALLOC_NEST_PARENT | IOMMU_HWPT_ALLOC_DIRTY_TRACKING)) != 0 || a->__reserved != 0) {
    return -EOPNOTSUPP;
  }
  std::unique_lock lk(mu_);
  if (a->dev_id != kDevId) return -ENOENT;
  auto it = ioas_.find(a->pt_id);
  if (it == ioas_.end()) return -ENOENT;
  const bool dirty = (a->flags & IOMMU_HWPT_ALLOC_DIRTY_TRACKING) != 0;
  if (dirty && !dirty_capable_) return -EOPNOTSUPP;
  auto h = std::make_unique<Hwpt>();
  h->ioas_id = a->pt_id;
  h->dirty_ops = dirty;
  for (const auto& [iova, area] : it->second.areas) h->logs[iova] = std::make_unique<DirtyLog>(iova, area.length, kIoPage);
  a->out_hwpt_id = next_id_++;
  hwpts_[a->out_hwpt_id] = std::move(h);
  return 0;
}

int FakeIommufd::GetHwInfo(void* arg) {
  auto* i = static_cast<iommu_hw_info*>(arg);
  // The 4 bytes after out_data_type: a u32 __reserved in 6.7, out_max_pasid_log2
  // and u8 __reserved[3] in newer headers; read as bytes so both compile.
  uint32_t reserved = 0;
  std::memcpy(&reserved, reinterpret_cast<const std::byte*>(i) + offsetof(iommu_hw_info, out_data_type) + 4, 4);
  if (i->flags != 0 || reserved != 0) return -EOPNOTSUPP;
  if (i->dev_id != kDevId) return -ENOENT;
  i->data_len = 0;  // no driver-specific data in the fake
  i->out_data_type = IOMMU_HW_INFO_TYPE_NONE;
  i->out_capabilities = dirty_capable_ ? IOMMU_HW_CAP_DIRTY_TRACKING : 0;
  return 0;
}

int FakeIommufd::SetDirtyTracking(void* arg) {
  auto* s = static_cast<iommu_hwpt_set_dirty_tracking*>(arg);
  if ((s->flags & ~uint32_t{IOMMU_HWPT_DIRTY_TRACKING_ENABLE}) != 0 || s->__reserved != 0) return -EOPNOTSUPP;
  std::unique_lock lk(mu_);
  auto it = hwpts_.find(s->hwpt_id);
  if (it == hwpts_.end()) return -ENOENT;
  Hwpt& h = *it->second;
  if (!h.dirty_ops) return -EOPNOTSUPP;
  const bool enable = (s->flags & IOMMU_HWPT_DIRTY_TRACKING_ENABLE) != 0;
  if (enable) {
    for (auto& [iova, log] : h.logs) log->ClearAll();
  }
  h.tracking.store(enable);
  return 0;
}

bool FakeIommufd::Covered(const Ioas& ioas, uint64_t iova, uint64_t len) {
  uint64_t at = iova;
  auto it = ioas.areas.upper_bound(iova);
  if (it == ioas.areas.begin()) return false;
  for (--it; it != ioas.areas.end() && at < iova + len; ++it) {
    if (it->second.iova > at || it->second.iova + it->second.length <= at) return false;
    at = it->second.iova + it->second.length;
  }
  return at >= iova + len;
}

int FakeIommufd::GetDirtyBitmap(void* arg) {
  auto* g = static_cast<iommu_hwpt_get_dirty_bitmap*>(arg);
  if ((g->flags & ~uint32_t{IOMMU_HWPT_GET_DIRTY_BITMAP_NO_CLEAR}) != 0 || g->__reserved != 0) return -EOPNOTSUPP;
  if (g->length == 0) return -EINVAL;
  if (g->iova + g->length < g->iova) return -EOVERFLOW;
  if (!PowerOfTwo(g->page_size) || g->page_size < kIoPage) return -EINVAL;
  if (((g->iova | g->length) & (g->page_size - 1)) != 0) return -EINVAL;
  std::shared_lock lk(mu_);
  auto it = hwpts_.find(g->hwpt_id);
  if (it == hwpts_.end()) return -ENOENT;
  Hwpt& h = *it->second;
  if (!h.dirty_ops) return -EOPNOTSUPP;
  if (!h.tracking.load()) return -EINVAL;
  if (!Covered(ioas_.at(h.ioas_id), g->iova, g->length)) return -EINVAL;
  if (g->data == 0) return -EFAULT;
  auto* data = reinterpret_cast<uint64_t*>(g->data);
  const bool clear = (g->flags & IOMMU_HWPT_GET_DIRTY_BITMAP_NO_CLEAR) == 0;
  const uint64_t end = g->iova + g->length;
  auto log = h.logs.upper_bound(g->iova);
  if (log != h.logs.begin()) --log;
  for (; log != h.logs.end() && log->second->iova() < end; ++log) {
    log->second->Report(g->iova, end, g->iova, g->page_size, clear, data);
  }
  return 0;
}

int FakeIommufd::AttachDevice(uint32_t hwpt_id) {
  std::unique_lock lk(mu_);
  if (!hwpts_.contains(hwpt_id)) return -ENOENT;
  attached_ = hwpt_id;
  return 0;
}

uint64_t FakeIommufd::DmaWrite(uint64_t iova, uint64_t len) {
  std::shared_lock lk(mu_);
  auto it = hwpts_.find(attached_);
  if (len == 0) return 0;  // a zero-length write touches no page
  const uint64_t first = iova / kIoPage, last = (iova + len - 1) / kIoPage;
  uint64_t faulted = 0;
  for (uint64_t p = first; p <= last; ++p) {
    const uint64_t at = p * kIoPage;
    const Ioas* ioas = it == hwpts_.end() ? nullptr : &ioas_.at(it->second->ioas_id);
    if (ioas == nullptr || !Covered(*ioas, at, kIoPage)) {
      ++faulted;
      continue;
    }
    if (!it->second->tracking.load(std::memory_order_acquire)) continue;
    auto log = std::prev(it->second->logs.upper_bound(at));
    log->second->Mark(at, kIoPage);
  }
  faults_ += faulted;
  return faulted;
}

int IoasAlloc(Kernel& k, int iommufd, uint32_t* ioas_id) {
  iommu_ioas_alloc a{};
  a.size = sizeof a;
  int rc = k.Ioctl(iommufd, IOMMU_IOAS_ALLOC, &a);
  *ioas_id = a.out_ioas_id;
  return rc;
}

int IoasMapFixed(Kernel& k, int iommufd, uint32_t ioas_id, uint64_t iova, uint64_t length) {
  iommu_ioas_map m{};
  m.size = sizeof m;
  m.flags = IOMMU_IOAS_MAP_FIXED_IOVA | IOMMU_IOAS_MAP_READABLE | IOMMU_IOAS_MAP_WRITEABLE;
  m.ioas_id = ioas_id;
  m.user_va = 0x7f0000000000;  // the fake maps no memory: any page-aligned address
  m.length = length;
  m.iova = iova;
  return k.Ioctl(iommufd, IOMMU_IOAS_MAP, &m);
}

}  // namespace gpumigrate::vfio::fake
