// ProfileDevice: the dry run's measurements. Syncs the device's dirty tracker
// every interval; level j ORs 2^j consecutive syncs, so each full accumulator is
// one sample of W(2^j * interval) (its window measured on the clock); the long
// windows, of which the sample holds few, are placed at several offsets.
#include <algorithm>

#include <fmt/format.h>

#include "engine/codec_choice/codec_choice.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/common/stats.h"

namespace gpumigrate {
namespace {

// One placement of a level's window: it ORs 2^j consecutive syncs starting
// `offset` syncs into the sample, then the next 2^j, and so on.
struct Phase {
  std::vector<DirtyBitmap> acc;  // per region
  uint32_t offset = 0;
  uint32_t syncs = 0;
  Clock::TimePoint start{};
};

struct Level {
  std::vector<Phase> phases;
  std::vector<std::vector<double>> samples;  // per region: bytes
  std::vector<double> windows_s;
};

// Placements of level j's window: one where the sample holds 8 or more of them;
// else up to 4, a quarter of the window apart, so that a long window (of which
// the sample holds one or two) is seen at several places: one placed in a
// workload's pause is a sample as much as one placed on its burst.
uint32_t PhasesOf(uint32_t j, uint64_t total_syncs) {
  const uint64_t len = uint64_t{1} << j;
  if (total_syncs / len >= 8) return 1;
  return static_cast<uint32_t>(std::min<uint64_t>(4, len));
}

// Syncs the tracker every opt.interval for opt.sample; level j ORs 2^j syncs
// together, so each level measures the dirty set over a window twice as long.
Result<std::vector<Level>> SampleWorkingSets(DirtyTracker* tracker, const std::vector<RegionInfo>& regions,
                                             const SampleOptions& opt, Clock& clock, DeviceProfile& prof) {
  // Levels 0..L-1 with 2^(L-1) intervals fitting the window at least once.
  const uint64_t total_syncs = static_cast<uint64_t>(opt.sample / opt.interval);
  uint32_t levels = 1;
  while ((uint64_t{1} << levels) <= total_syncs && levels < 16) ++levels;
  std::vector<Level> lv(levels);
  GM_RETURN_IF_ERROR(tracker->Start().WithContext("estimator: start dirty tracking"));
  Clock::TimePoint t0 = clock.Now();
  for (uint32_t j = 0; j < levels; ++j) {
    Level& l = lv[j];
    const uint32_t n = PhasesOf(j, total_syncs);
    for (uint32_t k = 0; k < n; ++k) {
      Phase ph;
      for (const RegionInfo& r : regions) ph.acc.emplace_back(r.pages());
      ph.offset = static_cast<uint32_t>((uint64_t{k} << j) / n);
      ph.start = t0;
      l.phases.push_back(std::move(ph));
    }
    l.samples.resize(regions.size());
  }
  std::vector<DirtyBitmap> fresh;
  for (const RegionInfo& r : regions) fresh.emplace_back(r.pages());
  std::vector<double> sync_ms;
  Clock::TimePoint next = t0;
  for (uint64_t s = 0; s < total_syncs; ++s) {
    next += opt.interval;
    clock.SleepUntil(next);
    Clock::TimePoint now = clock.Now();
    for (size_t i = 0; i < regions.size(); ++i) {
      fresh[i].ClearAll();
      Status st = tracker->Sync(regions[i].id, fresh[i]);
      if (!st.ok()) {
        (void)tracker->Stop();
        return st.WithContext("estimator: dirty sync");
      }
    }
    sync_ms.push_back(std::chrono::duration<double, std::milli>(clock.Now() - now).count());
    for (uint32_t j = 0; j < levels; ++j) {
      Level& l = lv[j];
      for (Phase& ph : l.phases) {
        if (s < ph.offset) {
          if (s + 1 == ph.offset) ph.start = now;  // it starts after this sync
          continue;
        }
        for (size_t i = 0; i < regions.size(); ++i) ph.acc[i].OrWith(fresh[i]);
        if (++ph.syncs == (uint32_t{1} << j)) {
          l.windows_s.push_back(std::chrono::duration<double>(now - ph.start).count());
          for (size_t i = 0; i < regions.size(); ++i) {
            l.samples[i].push_back(static_cast<double>(ph.acc[i].Count()) * regions[i].page_size);
            ph.acc[i].ClearAll();
          }
          ph.syncs = 0;
          ph.start = now;
        }
      }
    }
  }
  GM_RETURN_IF_ERROR(tracker->Stop().WithContext("estimator: stop dirty tracking"));
  prof.sample_s = std::chrono::duration<double>(clock.Now() - t0).count();
  prof.syncs = static_cast<uint32_t>(total_syncs);
  prof.sync_ms = sync_ms.empty() ? 0 : Median(sync_ms);

  return lv;
}

// Per region and level: the median window and the low/median/high bytes dirtied in it.
void FillCurves(const std::vector<Level>& lv, DeviceProfile& prof) {
  const size_t n = prof.regions.size();
  for (size_t i = 0; i < n; ++i) {
    WorkingSetCurve& c = prof.regions[i].dirty;
    for (const Level& l : lv) {
      if (l.samples[i].empty()) continue;
      const auto& v = l.samples[i];
      c.window_s.push_back(Median(l.windows_s));
      c.low_bytes.push_back(*std::min_element(v.begin(), v.end()));
      c.mid_bytes.push_back(Median(v));
      c.high_bytes.push_back(*std::max_element(v.begin(), v.end()));
    }
  }
}

}  // namespace

Result<DeviceProfile> ProfileDevice(Device& device, const SampleOptions& opt, Clock& clock) {
  if (device.State() != DeviceState::kRunning) {
    return FailedPrecondition(fmt::format("estimator: dry run failed: device is {}, expected RUNNING",
                                          DeviceStateName(device.State())));
  }
  DirtyTracker* tracker = device.Tracker();
  if (tracker == nullptr) return Unimplemented("estimator: dry run failed: the device has no dirty tracker");
  if (opt.interval.count() <= 0 || opt.sample < opt.interval) {
    return InvalidArgument("estimator: the sampling window must be at least one sync interval long");
  }
  const auto& regions = device.Regions();
  DeviceProfile prof;
  prof.device = device.Describe();
  GM_ASSIGN_OR_RETURN(PendingBytes pending, device.PendingExact());
  prof.device_state_bytes = pending.stop_copy_bytes;

  // Non-zero fraction and codec figures from evenly spread pages: the same
  // sample-and-measure the source runs before choosing a codec.
  RegionSampleOptions so;
  so.spread_pages = opt.pages_sampled_per_region;
  so.sample_bytes = opt.codec_sample_bytes;
  so.level = opt.codec_level;
  for (const RegionInfo& r : regions) {
    RegionProfile rp;
    rp.info = r;
    auto sample = SampleRegion(device, r, so);
    if (!sample.ok()) return sample.status().WithContext("estimator: sample pages");
    rp.nonzero_fraction = sample->nonzero_fraction();
    rp.codecs = sample->codecs;
    prof.regions.push_back(std::move(rp));
  }

  GM_ASSIGN_OR_RETURN(std::vector<Level> lv, SampleWorkingSets(tracker, regions, opt, clock, prof));
  FillCurves(lv, prof);
  return prof;
}

}  // namespace gpumigrate
