// Page hashing: the fallback that sees every change, however it was written, at
// the price of reading all tracked memory at each sync (XXH3-64, ~8 GB/s a core).
// A write that lands while a page is hashed shows up in this sync or the next
// (the stored hash is of whatever was read, so any later change differs from it).
// Once the session has sent a page (NoteSent), the stored hash is that of what it
// sent: a write back to the content of an earlier sync is still a change.
#include <algorithm>

#include <fmt/format.h>
#include <xxhash.h>

#include "engine/devices/proc/trackers.h"

namespace gpumigrate::proc {
namespace {

constexpr uint64_t kChunk = 1 << 20;

class HashTracker : public DirtyTracker {
 public:
  HashTracker(PageReader read, std::vector<TrackedRegion> regions)
      : read_(std::move(read)), regions_(std::move(regions)), hashes_(regions_.size()), buf_(kChunk) {}

  std::string Name() const override { return "hash"; }

  Status Start() override {
    for (size_t i = 0; i < regions_.size(); ++i) {
      hashes_[i].assign(regions_[i].pages(), 0);
      GM_RETURN_IF_ERROR(Scan(i, nullptr));
    }
    return Status::Ok();
  }

  Status Sync(uint32_t region, DirtyBitmap& out) override {
    for (size_t i = 0; i < regions_.size(); ++i) {
      if (regions_[i].id != region) continue;
      if (out.pages() != regions_[i].pages()) return InvalidArgument("hash: bitmap size does not match the region");
      if (hashes_[i].size() != regions_[i].pages()) return FailedPrecondition("hash: Sync before Start");
      return Scan(i, &out);
    }
    return InvalidArgument(fmt::format("hash: region {} is not tracked", region));
  }

  // What was sent becomes the comparison point: a later write that restores
  // the content hashed at the previous sync is then still a change.
  void NoteSent(uint32_t region, uint64_t first_page, std::span<const uint64_t> xxh3) override {
    for (size_t i = 0; i < regions_.size(); ++i) {
      if (regions_[i].id != region) continue;
      std::vector<uint64_t>& h = hashes_[i];
      for (size_t k = 0; k < xxh3.size() && first_page + k < h.size(); ++k) h[first_page + k] = xxh3[k];
      return;
    }
  }

  Status Stop() override {
    for (auto& h : hashes_) h = {};
    return Status::Ok();
  }

 private:
  // Hashes every page of region i; with `out`, marks those whose hash changed.
  Status Scan(size_t i, DirtyBitmap* out) {
    const TrackedRegion& r = regions_[i];
    const uint64_t per_chunk = std::max<uint64_t>(1, kChunk / r.page_size);
    if (buf_.size() < per_chunk * r.page_size) buf_.resize(per_chunk * r.page_size);
    for (uint64_t p = 0; p < r.pages(); p += per_chunk) {
      uint64_t off = p * r.page_size;
      uint64_t len = std::min<uint64_t>(per_chunk * r.page_size, r.size - off);
      GM_RETURN_IF_ERROR(read_(r.id, off, std::span(buf_.data(), len)));
      for (uint64_t k = 0; k * r.page_size < len; ++k) {
        uint64_t n = std::min<uint64_t>(r.page_size, len - k * r.page_size);
        uint64_t h = XXH3_64bits(buf_.data() + k * r.page_size, n);
        uint64_t& old = hashes_[i][p + k];
        if (out != nullptr && h != old) out->Set(p + k);
        old = h;
      }
    }
    return Status::Ok();
  }

  PageReader read_;
  std::vector<TrackedRegion> regions_;
  std::vector<std::vector<uint64_t>> hashes_;
  std::vector<std::byte> buf_;
};

}  // namespace

std::unique_ptr<DirtyTracker> MakeHashTracker(PageReader read, std::vector<TrackedRegion> regions) {
  return std::make_unique<HashTracker>(std::move(read), std::move(regions));
}

}  // namespace gpumigrate::proc
