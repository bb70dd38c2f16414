// Payload codecs for data frames, and how one is chosen.
//
//   none          raw bytes
//   zstd[:L]      zstd at level L (default 1)
//   shuffle[:L]   byte-plane shuffle for 16-bit values (bf16/fp16: all low bytes,
//                 then all high bytes), then zstd: the exponent bytes of model
//                 weights compress far better on their own
//   auto          per region, from a sample of its pages: the codec that moves a
//                 raw byte fastest given the compressor's measured speed and the
//                 link's rate; none when the link is not known to be slower than
//                 the compressor (compression only pays where it is)
//
// The codec value travels in each frame header (codec_flags); a frame that did
// not shrink is sent raw. Encoders and decoders hold zstd contexts: one per
// thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumigrate/status.h"

namespace gpumigrate {

// Values are the frame header's codec_flags.
enum class CodecKind : uint8_t { kNone = 0, kZstd = 1, kShuffleZstd = 2 };
std::string_view CodecKindName(CodecKind k);  // "none", "zstd", "shuffle-zstd"

struct CodecChoice {
  enum class Mode { kNone, kZstd, kShuffleZstd, kAuto } mode = Mode::kNone;
  int level = 1;
  std::string ToString() const;
};
Result<CodecChoice> ParseCodecChoice(std::string_view text);

class FrameEncoder {
 public:
  FrameEncoder();
  ~FrameEncoder();
  // Encodes `raw` into `out` with `kind` at `level`. Returns the kind actually
  // used: kNone (and `out` untouched) when the encoding would not be smaller.
  CodecKind Encode(CodecKind kind, int level, std::span<const std::byte> raw, std::vector<std::byte>& out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class FrameDecoder {
 public:
  FrameDecoder();
  ~FrameDecoder();
  // Decodes `payload` into exactly `raw.size()` bytes; any other outcome
  // (corrupt input, a different size) is an error.
  Status Decode(CodecKind kind, std::span<const std::byte> payload, std::span<std::byte> raw);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a sample of a region's pages says about each codec.
struct CodecSample {
  double zstd_ratio = 1, zstd_bytes_per_s = 0;        // raw bytes per second compressed
  double shuffle_ratio = 1, shuffle_bytes_per_s = 0;
};
// Measures ratio and speed of both codecs at `level` on `pages` (concatenated raw pages).
CodecSample SampleCodecs(std::span<const std::byte> pages, int level);

// The codec that moves a raw byte fastest: each candidate takes
// max(1 / compress_speed, 1 / (ratio * link)) per raw byte, raw takes 1 / link.
// link_bytes_per_s <= 0 means unknown or unlimited: no compression.
CodecKind ChooseCodec(const CodecSample& s, double link_bytes_per_s);
// The ratio that codec effectively achieves on that link: min(ratio, speed / link).
double EffectiveRatio(const CodecSample& s, CodecKind k, double link_bytes_per_s);

}  // namespace gpumigrate
