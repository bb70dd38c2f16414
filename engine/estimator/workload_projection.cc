// ProjectWorkload: the measured device standing for a larger GPU VM, by size
// (scale, same), per GPU (per-gpu), or from explicit per-GPU figures.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/estimator/projection.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {

std::string_view WorkloadModeName(WorkloadProjection::Mode m) {
  switch (m) {
    case WorkloadProjection::Mode::kScale: return "scale";
    case WorkloadProjection::Mode::kSame: return "same";
    case WorkloadProjection::Mode::kPerGpu: return "per-gpu";
    case WorkloadProjection::Mode::kExplicit: return "explicit";
  }
  return "unknown";
}

namespace {

uint64_t TotalBytes(const DeviceProfile& p) {
  uint64_t t = 0;
  for (const auto& r : p.regions) t += r.info.size_bytes;
  return t;
}

void ScaleCurve(WorkingSetCurve& c, double f) {
  for (auto* v : {&c.low_bytes, &c.mid_bytes, &c.high_bytes}) {
    for (double& x : *v) x *= f;
  }
}

// W(t) = rate * t for every bound.
WorkingSetCurve Linear(double rate) {
  WorkingSetCurve c;
  c.window_s = {1.0, 2.0};
  c.low_bytes = c.mid_bytes = c.high_bytes = {rate, 2 * rate};
  return c;
}

DeviceProfile PerGpu(const DeviceProfile& m, const WorkloadProjection& w, std::vector<std::string>* a) {
  const uint64_t measured = TotalBytes(m);
  const double f = static_cast<double>(w.bytes_per_gpu) / static_cast<double>(measured);
  DeviceProfile out = m;
  out.device = fmt::format("{} GPU{} x {}, each like {}", w.gpus, w.gpus == 1 ? "" : "s",
                           FormatBytes(static_cast<double>(w.bytes_per_gpu)), m.device);
  for (auto& r : out.regions) {
    r.info.size_bytes = static_cast<uint64_t>(std::llround(static_cast<double>(r.info.size_bytes) * f * w.gpus));
    ScaleCurve(r.dirty, w.gpus);
  }
  out.device_state_bytes = m.device_state_bytes * w.gpus;
  if (a) {
    a->push_back(fmt::format("the measured device ({}) is one GPU: each region keeps its share of {} per GPU "
                             "(x{:.3g}), times {} GPUs",
                             FormatBytes(static_cast<double>(measured)),
                             FormatBytes(static_cast<double>(w.bytes_per_gpu)), f, w.gpus));
    a->push_back(fmt::format("each GPU dirties memory at the measured device's rate, so {} GPUs dirty {} times it; "
                             "the rate does not grow with memory size (KV cache appends and activations are per "
                             "request and per step, not per byte held)",
                             w.gpus, w.gpus));
    a->push_back(fmt::format("device state: {} per GPU as measured", FormatBytes(
                                                                           static_cast<double>(m.device_state_bytes))));
  }
  return out;
}

// The measured region whose codec figures stand for projected data: the largest.
const RegionProfile* LargestRegion(const DeviceProfile& m) {
  const RegionProfile* best = nullptr;
  for (const auto& r : m.regions) {
    if (!best || r.info.size_bytes > best->info.size_bytes) best = &r;
  }
  return best;
}

DeviceProfile Explicit(const DeviceProfile& m, const WorkloadProjection& w, std::vector<std::string>* a) {
  DeviceProfile out;
  out.device = fmt::format("{} GPU{} x {}: {:.0f}% static, KV cache appended at {} per GPU", w.gpus,
                           w.gpus == 1 ? "" : "s", FormatBytes(static_cast<double>(w.bytes_per_gpu)),
                           w.static_fraction * 100, FormatRate(w.kv_rate_per_gpu));
  out.sample_s = m.sample_s;
  out.syncs = m.syncs;
  out.sync_ms = m.sync_ms;
  out.device_state_bytes = m.device_state_bytes * w.gpus;
  const double total = static_cast<double>(w.bytes_per_gpu) * w.gpus;
  const RegionProfile* like = LargestRegion(m);
  RegionProfile st;
  st.info = {0, "static", static_cast<uint64_t>(std::llround(total * w.static_fraction)), 65536, RegionHint::kStatic};
  RegionProfile kv;
  kv.info = {1, "kv-cache", static_cast<uint64_t>(std::llround(total * (1 - w.static_fraction))), 65536,
             RegionHint::kDynamic};
  kv.dirty = Linear(w.kv_rate_per_gpu * w.gpus);
  for (RegionProfile* r : {&st, &kv}) {
    if (like) r->codecs = like->codecs;
    out.regions.push_back(*r);
  }
  out.regions.erase(std::remove_if(out.regions.begin(), out.regions.end(),
                                   [](const RegionProfile& r) { return r.info.size_bytes == 0; }),
                    out.regions.end());
  if (a) {
    a->push_back(fmt::format("per GPU: {:.0f}% of {} is never written during the migration (weights), the rest is a "
                             "KV cache written at {} (given, not measured), so {} GPUs write {}",
                             w.static_fraction * 100, FormatBytes(static_cast<double>(w.bytes_per_gpu)),
                             FormatRate(w.kv_rate_per_gpu), w.gpus, FormatRate(w.kv_rate_per_gpu * w.gpus)));
    a->push_back("every page holds data (none is zero); compression figures as sampled on the measured device's "
                 "largest region" + (like ? fmt::format(" ({})", like->info.name) : std::string()));
    a->push_back(fmt::format("device state: {} per GPU as measured",
                             FormatBytes(static_cast<double>(m.device_state_bytes))));
  }
  return out;
}

}  // namespace

Result<DeviceProfile> ProjectWorkload(const DeviceProfile& m, const WorkloadProjection& w,
                                      std::vector<std::string>* a) {
  using M = WorkloadProjection::Mode;
  if (w.gpus == 0 || w.bytes_per_gpu == 0) return InvalidArgument("a projection needs at least one GPU of some size");
  if (TotalBytes(m) == 0 && w.mode != M::kExplicit) {
    return InvalidArgument("the measured device has no memory to project from");
  }
  switch (w.mode) {
    case M::kScale:
    case M::kSame:
      return ProjectProfile(m, w.bytes_per_gpu * w.gpus, w.mode == M::kScale, a);
    case M::kPerGpu:
      return PerGpu(m, w, a);
    case M::kExplicit:
      if (!(w.static_fraction >= 0 && w.static_fraction <= 1)) {
        return InvalidArgument(fmt::format("--static-fraction {} is not between 0 and 1", w.static_fraction));
      }
      if (!(w.kv_rate_per_gpu >= 0) || !std::isfinite(w.kv_rate_per_gpu)) {
        return InvalidArgument("--kv-rate-per-gpu must be a rate of 0 or more");
      }
      return Explicit(m, w, a);
  }
  return InvalidArgument("unknown projection mode");
}

}  // namespace gpumigrate
