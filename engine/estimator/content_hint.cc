// What the destination's content store holds, for the estimate: which regions'
// pages round 0 offers by SHA-256 instead of sending, and what offering costs
// the source (reading and hashing), measured on the device.
#include <algorithm>

#include <fmt/format.h>

#include "gpumigrate/content/content_store.h"
#include "gpumigrate/estimator/estimator.h"

namespace gpumigrate {

Status ApplyContentHint(const std::map<std::string, double>& hint, DeviceProfile& p) {
  for (const auto& [name, fraction] : hint) {
    if (!(fraction >= 0 && fraction <= 1)) {
      return InvalidArgument(fmt::format("--content-store-hint {}={}: a share between 0 and 1", name, fraction));
    }
    bool found = false;
    for (RegionProfile& r : p.regions) {
      if (name == r.info.name || (name == "static" && r.info.hint == RegionHint::kStatic)) {
        r.held_fraction = fraction;
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (const RegionProfile& r : p.regions) names += (names.empty() ? "" : ", ") + r.info.name;
      return InvalidArgument(fmt::format("--content-store-hint: no region '{}' (the regions: {}; or 'static')", name,
                                         names));
    }
  }
  return Status::Ok();
}

Result<double> MeasureOfferRate(Device& device, const DeviceProfile& p, Clock& clock, uint64_t max_bytes) {
  Sha256Hasher sha;
  std::vector<std::byte> buf;
  uint64_t done = 0;
  const auto t0 = clock.Now();
  for (const RegionProfile& r : p.regions) {
    if (r.held_fraction <= 0 || done >= max_bytes) continue;
    const uint64_t ps = r.info.page_size;
    const uint64_t chunk = std::max<uint64_t>(ps, (1u << 20) / ps * ps);
    for (uint64_t off = 0; off + ps <= r.info.size_bytes && done < max_bytes; off += chunk) {
      buf.resize(std::min(chunk, (r.info.size_bytes - off) / ps * ps));
      GM_RETURN_IF_ERROR(device.Read(r.info.id, off, buf).WithContext("estimator: read pages to time the offer"));
      for (uint64_t k = 0; k + ps <= buf.size(); k += ps) sha.Digest(std::span<const std::byte>(buf).subspan(k, ps));
      done += buf.size();
    }
  }
  const double s = std::chrono::duration<double>(clock.Now() - t0).count();
  return done > 0 && s > 0 ? static_cast<double>(done) / s : 0.0;
}

}  // namespace gpumigrate
