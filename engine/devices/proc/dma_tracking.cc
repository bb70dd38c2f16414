#include "engine/devices/proc/dma_tracking.h"

#include <map>
#include <tuple>

#include <fmt/format.h>

#include "gpumigrate/devices/iommu_tracking.h"

namespace gpumigrate::proc {
namespace {

namespace w = shimwire;

std::string Names(const std::vector<const DmaRegion*>& group) {
  std::string s;
  for (const DmaRegion* r : group) s += fmt::format("{}'{}'", s.empty() ? "" : ", ", r->name);
  return s;
}

Result<std::unique_ptr<DirtyTracker>> MakeFor(vfio::Kernel& k, const std::vector<const DmaRegion*>& group) {
  std::vector<IovaRegion> iova;
  for (const DmaRegion* r : group) iova.push_back(IovaRegion{r->id, r->iova, r->size, r->page_size});
  const DmaRegion& first = *group.front();
  if (first.kind == w::DmaKind::kIommufd) {
    return MakeIommufdTracker(k, IommufdTarget{first.fd, first.dev_id, first.hwpt_id}, std::move(iova));
  }
  return MakeDmaLoggingTracker(k, first.fd, std::move(iova));
}

}  // namespace

DmaTracking MakeDmaTracking(vfio::Kernel& kernel, const std::vector<DmaRegion>& regions) {
  DmaTracking out;
  // One tracker per (kind, fd, device, HWPT): the regions one IOMMU context or
  // one device's log covers, in the order the shim listed them.
  std::map<std::tuple<w::DmaKind, int, uint32_t, uint32_t>, std::vector<const DmaRegion*>> groups;
  std::vector<const DmaRegion*> undeclared;
  for (const DmaRegion& r : regions) {
    if (r.kind == w::DmaKind::kNone) {
      undeclared.push_back(&r);
      out.hashed.push_back(r.id);
      continue;
    }
    groups[{r.kind, r.fd, r.dev_id, r.hwpt_id}].push_back(&r);
  }
  std::vector<std::string> said;
  for (auto& [key, group] : groups) {
    const bool iommu = std::get<0>(key) == w::DmaKind::kIommufd;
    auto t = MakeFor(kernel, group);
    if (t.ok()) {
      std::vector<uint32_t> ids;
      for (const DmaRegion* r : group) ids.push_back(r->id);
      out.parts.emplace_back(std::move(ids), std::move(*t));
      said.push_back(iommu ? fmt::format("{} tracked by the IOMMU's dirty bits (iommufd HWPT {}): hardware bits "
                                         "cost one bitmap read per sync, hashing reads every page",
                                         Names(group), std::get<3>(key))
                           : fmt::format("{} tracked by the device's DMA log (VFIO DMA logging): hardware bits cost "
                                         "one bitmap read per sync, hashing reads every page",
                                         Names(group)));
      continue;
    }
    for (const DmaRegion* r : group) out.hashed.push_back(r->id);
    said.push_back(fmt::format("{} hashed: {} unusable ({})", Names(group),
                               iommu ? "the IOMMU's dirty bits are" : "the device's DMA log is", t.status().message()));
  }
  if (!undeclared.empty()) {
    said.push_back(fmt::format("{} hashed (written by DMA; the workload did not say through which IOMMU or device: "
                               "gm_shim_dma_iommufd / gm_shim_dma_logging)",
                               Names(undeclared)));
  }
  for (const std::string& s : said) out.reason += (out.reason.empty() ? "" : "; ") + s;
  return out;
}

}  // namespace gpumigrate::proc
