#include "engine/session/content_fill.h"

#include <fmt/format.h>

namespace gpumigrate {

Result<std::unique_ptr<ContentFill>> ContentFill::Open(const std::string& dir, const std::vector<RegionInfo>& regions,
                                                       const std::function<void(uint64_t)>& worked) {
  auto f = std::make_unique<ContentFill>();
  for (const RegionInfo& r : regions) {
    if (f->stores_.count(r.page_size)) continue;
    ContentStoreOptions o;
    o.page_size = r.page_size;
    uint64_t last = 0;
    o.on_progress = [&](uint64_t done, uint64_t) {
      if (worked) worked(done - last);
      last = done;
    };
    auto s = ContentStore::Open(dir, o);
    if (!s.ok()) return s.status().WithContext(fmt::format("content store for {}-byte pages", r.page_size));
    f->stores_[r.page_size] = std::move(*s);
  }
  return f;
}

thread_local std::vector<FillResult> ContentFill::results_;

void ContentFill::FillRun(uint32_t page_size, std::span<const ContentDigest> digests, std::span<std::byte> out,
                          std::vector<bool>& filled) {
  filled.assign(digests.size(), false);
  auto it = stores_.find(page_size);
  if (it == stores_.end()) return;
  it->second->FillRun(digests, out, results_);
  for (size_t k = 0; k < digests.size(); ++k) {
    if (results_[k] != FillResult::kFilled) continue;
    filled[k] = true;
    filled_pages_.fetch_add(1);
    filled_bytes_.fetch_add(page_size);
  }
}

uint64_t ContentFill::indexed_pages() const {
  uint64_t n = 0;
  for (const auto& [ps, s] : stores_) n += s->stats().pages;
  return n;
}

}  // namespace gpumigrate
