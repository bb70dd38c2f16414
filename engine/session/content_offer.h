// The source's side of content-addressed pre-copy: which page runs to offer by
// SHA-256 rather than send, and the destination's answers.
//
// Offering costs the source a SHA-256 per page (OpenSSL, SHA-NI: ~1.5 GB/s per
// core) and costs a round trip for pages the destination does not hold (they go
// with data in the next round), so a region is offered only while offers fill:
//   probing   no answers yet: runs are offered while at most `probe_window`
//             pages wait for an answer, the rest are sent as usual;
//   offering  at least half of the recent answers filled: every run is offered;
//   off       fewer filled: one run in `reprobe_every` is offered, so a region
//             whose later part is held is found again.
// "Recent": counts halve once they pass 1024 pages, so the state follows the
// region as the round goes through it. Answers arrive on the control reader's
// thread; everything else runs on the session thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate {

class ContentOffer {
 public:
  struct Missed {
    size_t region;  // index in the regions given to the constructor
    uint64_t page;
  };
  enum class State { kProbing, kOffering, kOff };

  explicit ContentOffer(const std::vector<RegionInfo>& regions, uint64_t probe_window_pages = 256,
                        uint32_t reprobe_every = 256);

  // The destination listed `content-store` and the source may offer.
  void Enable() { enabled_.store(true); }
  bool enabled() const { return enabled_.load(); }

  // Whether to offer the next run of `pages` pages of region `index` (session thread).
  bool ShouldOffer(size_t index, uint64_t pages);
  // The run was offered (after ShouldOffer said yes and the frame went out).
  void Offered(size_t index, uint64_t pages);
  // One ContentAnswer (control reader thread). Corrupt when it names pages
  // that were never offered in that shape (a region that does not exist, pages
  // outside it, misses out of order).
  Status Answer(const wire::v1::ContentAnswer& a);
  // A new connection: offers of the old one will not be answered.
  void LinkRestarted() {
    std::lock_guard lk(mu_);
    for (Region& r : state_) r.outstanding = 0;
  }
  // The pages missed since the last call (session thread, after a RoundApplied).
  std::vector<Missed> TakeMissed();

  State state(size_t index) const;
  uint64_t offered_pages() const { return offered_total_.load(); }
  uint64_t missed_pages() const { return missed_total_.load(); }

 private:
  struct Region {
    uint64_t outstanding = 0;  // offered, not answered
    uint64_t answered = 0, filled = 0;  // recent (halved past 1024)
    uint64_t runs_off = 0;     // runs seen while off
  };
  State StateLocked(const Region& r) const;

  std::vector<RegionInfo> regions_;
  const uint64_t probe_window_;
  const uint32_t reprobe_every_;
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  std::vector<Region> state_;
  std::vector<Missed> missed_;
  std::atomic<uint64_t> offered_total_{0}, missed_total_{0};
};

}  // namespace gpumigrate
