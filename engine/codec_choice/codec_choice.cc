#include "engine/codec_choice/codec_choice.h"

#include <algorithm>
#include <vector>

namespace gpumigrate {

RegionSampleOptions SessionSampleOptions(const RegionInfo& region, int level) {
  const uint64_t want_pages = std::max<uint64_t>(1, (1u << 20) / region.page_size);
  RegionSampleOptions o;
  o.spread_pages = 4 * want_pages;
  o.sample_bytes = want_pages * region.page_size;
  o.stop_when_full = true;
  o.level = level;
  return o;
}

Result<RegionSample> SampleRegion(Device& device, const RegionInfo& r, const RegionSampleOptions& o) {
  RegionSample s;
  const uint64_t n = std::min<uint64_t>(r.pages(), o.spread_pages);
  std::vector<std::byte> page, kept;
  for (uint64_t i = 0; i < n; ++i) {
    if (o.stop_when_full && kept.size() >= o.sample_bytes) break;
    const uint64_t p = i * r.pages() / n;
    page.resize(std::min<uint64_t>(r.page_size, r.size_bytes - p * r.page_size));
    GM_RETURN_IF_ERROR(device.Read(r.id, p * r.page_size, page));
    ++s.pages_read;
    if (IsZeroPage(page)) continue;
    ++s.nonzero_pages;
    if (kept.size() < o.sample_bytes) kept.insert(kept.end(), page.begin(), page.end());
  }
  s.sampled_bytes = kept.size();
  s.codecs = SampleCodecs(kept, o.level);
  return s;
}

CodecKind ChooseRegionCodec(const CodecChoice& choice, const CodecSample& sample, double link_bytes_per_s) {
  if (std::optional<CodecKind> fixed = FixedCodec(choice)) return *fixed;
  return ChooseCodec(sample, link_bytes_per_s);
}

Result<RegionCodecChoice> SampleAndChooseCodec(Device& device, const RegionInfo& region, const CodecChoice& choice,
                                               double link_bytes_per_s, const RegionSampleOptions& options) {
  RegionCodecChoice out;
  if (std::optional<CodecKind> fixed = FixedCodec(choice)) {
    out.codec = *fixed;
    return out;
  }
  GM_ASSIGN_OR_RETURN(out.sample, SampleRegion(device, region, options));
  out.codec = ChooseRegionCodec(choice, out.sample->codecs, link_bytes_per_s);
  return out;
}

}  // namespace gpumigrate
