#include "engine/session/content_offer.h"

#include <fmt/format.h>

namespace gpumigrate {

ContentOffer::ContentOffer(const std::vector<RegionInfo>& regions, uint64_t probe_window_pages, uint32_t reprobe_every)
    : regions_(regions), probe_window_(probe_window_pages), reprobe_every_(reprobe_every), state_(regions.size()) {}

ContentOffer::State ContentOffer::StateLocked(const Region& r) const {
  if (r.answered < 64) return State::kProbing;
  return 2 * r.filled >= r.answered ? State::kOffering : State::kOff;
}

ContentOffer::State ContentOffer::state(size_t index) const {
  std::lock_guard lk(mu_);
  return StateLocked(state_[index]);
}

bool ContentOffer::ShouldOffer(size_t index, uint64_t pages) {
  if (!enabled()) return false;
  std::lock_guard lk(mu_);
  Region& r = state_[index];
  switch (StateLocked(r)) {
    case State::kOffering: return true;
    case State::kProbing: return r.outstanding + pages <= probe_window_ || r.outstanding == 0;
    case State::kOff: return ++r.runs_off % reprobe_every_ == 0;
  }
  return false;
}

void ContentOffer::Offered(size_t index, uint64_t pages) {
  std::lock_guard lk(mu_);
  state_[index].outstanding += pages;
  offered_total_.fetch_add(pages);
}

Status ContentOffer::Answer(const wire::v1::ContentAnswer& a) {
  size_t idx = 0;
  while (idx < regions_.size() && regions_[idx].id != a.region()) ++idx;
  if (idx == regions_.size()) return Corrupt(fmt::format("ContentAnswer: region {} does not exist", a.region()));
  const RegionInfo& info = regions_[idx];
  if (a.pages() == 0 || a.first_page() > info.pages() || a.pages() > info.pages() - a.first_page()) {
    return Corrupt(fmt::format("ContentAnswer: pages [{}, +{}) are outside region {} ({} pages)", a.first_page(),
                               a.pages(), info.name, info.pages()));
  }
  int64_t prev = -1;
  for (uint32_t m : a.missed()) {
    if (m >= a.pages() || static_cast<int64_t>(m) <= prev) {
      return Corrupt(fmt::format("ContentAnswer: missed page {} of {} out of order or outside the offer", m, a.pages()));
    }
    prev = m;
  }
  std::lock_guard lk(mu_);
  Region& r = state_[idx];
  if (r.outstanding < a.pages()) {
    return Corrupt(fmt::format("ContentAnswer: {} pages of region {} answered, {} were offered and unanswered",
                               a.pages(), info.name, r.outstanding));
  }
  r.outstanding -= a.pages();
  r.answered += a.pages();
  r.filled += a.pages() - static_cast<uint64_t>(a.missed_size());
  if (r.answered > 1024) {
    r.answered /= 2;
    r.filled /= 2;
  }
  for (uint32_t m : a.missed()) missed_.push_back({idx, a.first_page() + m});
  missed_total_.fetch_add(static_cast<uint64_t>(a.missed_size()));
  return Status::Ok();
}

std::vector<ContentOffer::Missed> ContentOffer::TakeMissed() {
  std::lock_guard lk(mu_);
  return std::exchange(missed_, {});
}

}  // namespace gpumigrate
