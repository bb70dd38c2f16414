// Choosing a region's codec: read a sample of its pages from the device, measure
// every codec on the non-zero ones, and pick (the one --codec fixes, or with
// `auto` the one that moves a raw byte fastest over the link). The source picks
// each region's codec here before round 0; the estimator samples here while it
// profiles and picks here while it models, so both see the same figures.
//
// Depends only on the Device interface and the codec registry; no I/O of its own
// beyond Device::Read. Not thread-safe per device beyond what Device::Read is.
#pragma once

#include <cstdint>
#include <optional>

#include "gpumigrate/codec/codec.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

// Which pages a sample reads and how much of them it measures.
struct RegionSampleOptions {
  // Pages read, evenly spread over the region (all of them when it has fewer).
  uint64_t spread_pages = 512;
  // Non-zero bytes kept for measuring the codecs: whole pages, in region order,
  // until this many are kept.
  uint64_t sample_bytes = 1 << 20;
  // Stop reading once sample_bytes are kept (the counts below then cover only
  // the pages read); otherwise every spread page is read and counted.
  bool stop_when_full = false;
  int level = 1;  // the zstd level the codecs are measured at
};

// The source's sample before round 0: 1 MiB of non-zero pages out of four times
// as many pages spread over the region, read only until the sample is full.
RegionSampleOptions SessionSampleOptions(const RegionInfo& region, int level);

struct RegionSample {
  uint64_t pages_read = 0;
  uint64_t nonzero_pages = 0;
  uint64_t sampled_bytes = 0;  // non-zero bytes the codecs were measured on
  CodecSample codecs;          // all ratios 1 when nothing non-zero was read
  double nonzero_fraction() const {
    return pages_read ? static_cast<double>(nonzero_pages) / static_cast<double>(pages_read) : 0;
  }
};

// Reads the sample and measures every compressing codec on it. A read error is
// returned as the device gave it (the caller says what it was sampling for).
Result<RegionSample> SampleRegion(Device& device, const RegionInfo& region, const RegionSampleOptions& options);

// The codec a region gets from `choice` given its sample: the fixed one, or with
// auto ChooseCodec over the link (link_bytes_per_s <= 0: unknown, no compression).
CodecKind ChooseRegionCodec(const CodecChoice& choice, const CodecSample& sample, double link_bytes_per_s);

struct RegionCodecChoice {
  CodecKind codec = CodecKind::kNone;
  std::optional<RegionSample> sample;  // present when the choice needed one (auto)
};

// Samples (only when `choice` is auto) and chooses: SampleRegion, then ChooseRegionCodec.
Result<RegionCodecChoice> SampleAndChooseCodec(Device& device, const RegionInfo& region, const CodecChoice& choice,
                                               double link_bytes_per_s, const RegionSampleOptions& options);

}  // namespace gpumigrate
