#include "engine/devices/cuda/digest_tracker.h"

#include <algorithm>

#include <fmt/format.h>

namespace gpumigrate::cuda {
namespace {

class DigestTracker : public DirtyTracker {
 public:
  DigestTracker(std::string name, DigestSource source, std::vector<DigestRegion> regions, uint64_t max_pages)
      : name_(std::move(name)),
        source_(std::move(source)),
        regions_(std::move(regions)),
        digests_(regions_.size()),
        max_pages_(std::max<uint64_t>(1, max_pages)) {}

  std::string Name() const override { return name_; }

  Status Start() override {
    for (size_t i = 0; i < regions_.size(); ++i) {
      digests_[i].assign(regions_[i].pages(), 0);
      GM_RETURN_IF_ERROR(Scan(i, nullptr).WithContext(fmt::format("{}: start", name_)));
    }
    started_ = true;
    return Status::Ok();
  }

  Status Sync(uint32_t region, DirtyBitmap& out) override {
    for (size_t i = 0; i < regions_.size(); ++i) {
      if (regions_[i].id != region) continue;
      if (out.pages() != regions_[i].pages()) {
        return InvalidArgument(fmt::format("{}: sync failed: bitmap of {} pages for region {} of {} pages", name_,
                                           out.pages(), region, regions_[i].pages()));
      }
      if (!started_) return FailedPrecondition(fmt::format("{}: sync failed: Sync before Start", name_));
      return Scan(i, &out).WithContext(fmt::format("{}: sync of region {}", name_, region));
    }
    return InvalidArgument(fmt::format("{}: sync failed: region {} is not tracked", name_, region));
  }

  Status Stop() override {
    for (auto& d : digests_) d = {};
    started_ = false;
    return Status::Ok();
  }

 private:
  // Takes the digest of every page of region i; with `out`, marks those that changed.
  Status Scan(size_t i, DirtyBitmap* out) {
    const DigestRegion& r = regions_[i];
    std::vector<uint64_t>& old = digests_[i];
    for (uint64_t p = 0; p < r.pages(); p += max_pages_) {
      const uint64_t n = std::min(max_pages_, r.pages() - p);
      fresh_.resize(n);
      GM_RETURN_IF_ERROR(source_(r.id, r.page_size, p, std::span(fresh_)));
      for (uint64_t k = 0; k < n; ++k) {
        if (out != nullptr && fresh_[k] != old[p + k]) out->Set(p + k);
        old[p + k] = fresh_[k];
      }
    }
    return Status::Ok();
  }

  std::string name_;
  DigestSource source_;
  std::vector<DigestRegion> regions_;
  std::vector<std::vector<uint64_t>> digests_;
  std::vector<uint64_t> fresh_;
  uint64_t max_pages_;
  bool started_ = false;
};

}  // namespace

std::unique_ptr<DirtyTracker> MakeDigestTracker(std::string name, DigestSource source,
                                                std::vector<DigestRegion> regions, uint64_t max_pages_per_call) {
  return std::make_unique<DigestTracker>(std::move(name), std::move(source), std::move(regions), max_pages_per_call);
}

}  // namespace gpumigrate::cuda
