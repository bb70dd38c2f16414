// Payload codecs for data frames, and how one is chosen.
//
//   none          raw bytes
//   zstd[:L]      zstd at level L (default 1)
//   shuffle[:L]   byte-plane shuffle for 16-bit values (bf16/fp16: all low bytes,
//                 then all high bytes), then zstd: the exponent bytes of model
//                 weights compress far better on their own
//   bf16          bfloat16 planes: the exponent byte of each value entropy-coded
//                 (zstd's Huffman literal coder, no match search), sign and
//                 mantissa raw: a better ratio than shuffle at several times its speed
//                 (transport/codec/bf16_codec.h)
//   auto          per region, from a sample of its pages: the codec that moves a
//                 raw byte fastest given the compressor's measured speed and the
//                 link's rate; none when the link is not known to be slower than
//                 the compressor (compression only pays where it is)
//
// Every codec is one entry of a registry (Codecs()), keyed by the frame header's
// codec_flags value: its names, its Hello capability, where its figures sit in a
// CodecSample, and its encode and decode functions. Everything else (parsing
// --codec, the destination's frame check and Hello, the source's peer check,
// sampling and choosing) walks the registry, so a codec is added in one place.
// Zero pages are not a codec: they travel as kZeroPages frames with no payload
// (IsZeroPage says which pages those are).
//
// The codec value travels in each frame header (codec_flags); a frame that did
// not shrink is sent raw. Encoders and decoders hold zstd contexts: one per
// thread. The registry itself is immutable and may be read from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

// Values are the frame header's codec_flags.
enum class CodecKind : uint8_t { kNone = 0, kZstd = 1, kShuffleZstd = 2, kBf16 = 3 };
std::string_view CodecKindName(CodecKind k);  // "none", "zstd", "shuffle-zstd", "bf16"

struct CodecChoice {
  enum class Mode { kNone, kZstd, kShuffleZstd, kBf16, kAuto } mode = Mode::kNone;
  int level = 1;  // for the codecs that take one (zstd, shuffle), and those auto may pick
  std::string ToString() const;
};
Result<CodecChoice> ParseCodecChoice(std::string_view text);

// What a sample of a region's pages says about each codec.
struct CodecSample {
  double zstd_ratio = 1, zstd_bytes_per_s = 0;        // raw bytes per second compressed
  double shuffle_ratio = 1, shuffle_bytes_per_s = 0;
  double bf16_ratio = 1, bf16_bytes_per_s = 0;
};

// A codec's per-thread working state (zstd contexts, a byte-plane buffer); each
// FrameEncoder and FrameDecoder owns one. Defined in transport/codec.
struct CodecContext;

// One registry entry.
struct CodecInfo {
  CodecKind kind;                // the frame header's codec_flags value
  std::string_view name;         // in reports and JSON: "none", "zstd", "shuffle-zstd", "bf16"
  std::string_view flag_name;    // in --codec: "none", "zstd", "shuffle", "bf16"
  CodecChoice::Mode mode;        // the --codec mode that fixes this codec
  std::string_view capability;   // in Hello; empty for none (every peer reads raw bytes)
  // Where this codec's figures sit in a CodecSample; null for none.
  double CodecSample::*sampled_ratio;
  double CodecSample::*sampled_bytes_per_s;
  // Encodes `raw` into `out`; false when it cannot. Null for none (never smaller).
  bool (*encode)(CodecContext& ctx, int level, std::span<const std::byte> raw, std::vector<std::byte>& out);
  // Decodes `payload` into exactly `raw.size()` bytes; anything else is kCorrupt.
  Status (*decode)(CodecContext& ctx, std::span<const std::byte> payload, std::span<std::byte> raw);
  // Whether --codec NAME:LEVEL means something (zstd levels); bf16 has one setting.
  bool takes_level;

  bool compresses() const { return encode != nullptr; }
};

// Every codec, in codec_flags order (none first).
std::span<const CodecInfo> Codecs();
// The entry for a frame's codec_flags; null when no codec has that value.
const CodecInfo* FindCodec(uint8_t codec_flags);
// The same as a check: kCorrupt "codec flags 0x9 are not a known codec" when unknown.
Result<CodecKind> CodecFromFlags(uint8_t codec_flags);
// The entry a name or --codec name means ("shuffle" and "shuffle-zstd" alike); null when none.
const CodecInfo* FindCodecByName(std::string_view name);
// The entry for a kind that exists (any CodecKind value but a forged one).
const CodecInfo& CodecOf(CodecKind k);
// The codec a choice fixes; nullopt for auto.
std::optional<CodecKind> FixedCodec(const CodecChoice& c);
// The Hello capabilities of a peer that decodes every codec (what a destination advertises).
std::vector<std::string> DecodeCapabilities();
// Whether a peer that advertised `peer_capabilities` decodes codec `k`.
bool PeerDecodes(const std::vector<std::string>& peer_capabilities, CodecKind k);
// Whether it decodes every codec `c` may put on the wire (with auto: every codec).
bool PeerDecodes(const std::vector<std::string>& peer_capabilities, const CodecChoice& c);

// True when every byte of `page` is zero: such pages travel as kZeroPages frames.
bool IsZeroPage(std::span<const std::byte> page);

class FrameEncoder {
 public:
  FrameEncoder();
  ~FrameEncoder();
  // Encodes `raw` into `out` with `kind` at `level`. Returns the kind actually
  // used: kNone (send `raw`; `out` holds nothing useful) when the encoding would
  // not be smaller or `kind` is not a compressing codec.
  CodecKind Encode(CodecKind kind, int level, std::span<const std::byte> raw, std::vector<std::byte>& out);

 private:
  std::unique_ptr<CodecContext> ctx_;
};

class FrameDecoder {
 public:
  FrameDecoder();
  ~FrameDecoder();
  // Decodes `payload` into exactly `raw.size()` bytes; any other outcome
  // (corrupt input, a different size, a kind no codec has) is an error. kNone
  // copies a payload of exactly that size.
  Status Decode(CodecKind kind, std::span<const std::byte> payload, std::span<std::byte> raw);

 private:
  std::unique_ptr<CodecContext> ctx_;
};

// Measures ratio and speed of every compressing codec at `level` on `pages` (concatenated raw pages).
CodecSample SampleCodecs(std::span<const std::byte> pages, int level);

// The codec that moves a raw byte fastest: each candidate takes
// max(1 / compress_speed, 1 / (ratio * link)) per raw byte, raw takes 1 / link.
// A codec must beat raw by 5% (the noise of a speed sample); among those within
// 5% of the fastest, the one that compresses fastest (the least CPU) wins.
// link_bytes_per_s <= 0 means unknown or unlimited: no compression.
CodecKind ChooseCodec(const CodecSample& s, double link_bytes_per_s);
// The ratio that codec effectively achieves on that link: min(ratio, speed / link).
double EffectiveRatio(const CodecSample& s, CodecKind k, double link_bytes_per_s);

}  // namespace gpumigrate
