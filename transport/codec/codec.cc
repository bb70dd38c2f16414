#include "gpumigrate/codec/codec.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <iterator>
#include <optional>

#include <fmt/format.h>

#include "gpumigrate/common/units.h"
#include "transport/codec/bf16_codec.h"
#include "transport/codec/codec_context.h"

namespace gpumigrate {

namespace {

// Byte planes of 16-bit values: low bytes first, then high bytes; an odd last
// byte stays at the end.
void Shuffle16(std::span<const std::byte> in, std::byte* out) {
  size_t n = in.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    out[i] = in[2 * i];
    out[n + i] = in[2 * i + 1];
  }
  if (in.size() % 2) out[in.size() - 1] = in.back();
}

void Unshuffle16(std::span<const std::byte> in, std::byte* out) {
  size_t n = in.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = in[i];
    out[2 * i + 1] = in[n + i];
  }
  if (in.size() % 2) out[in.size() - 1] = in.back();
}

}  // namespace

namespace codec_internal {

// Decodes a zstd frame into exactly dst.size() bytes; `name` is the codec's, for messages.
Status ZstdDecompress(CodecContext& ctx, std::string_view name, std::span<const std::byte> payload,
                      std::span<std::byte> dst) {
  // The content size in the zstd frame must match the header before anything is decoded.
  unsigned long long declared = ZSTD_getFrameContentSize(payload.data(), payload.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN) {
    return Corrupt(fmt::format("{} payload is not a zstd frame with a known size", name));
  }
  if (declared != dst.size()) {
    return Corrupt(fmt::format("{} payload decodes to {} bytes, the header says {}", name, declared, dst.size()));
  }
  if (ctx.dctx == nullptr) ctx.dctx = ZSTD_createDCtx();
  size_t n = ZSTD_decompressDCtx(ctx.dctx, dst.data(), dst.size(), payload.data(), payload.size());
  if (ZSTD_isError(n)) {
    // "zstd: Corrupted block detected", "bf16 exponent plane: zstd: ..."
    return Corrupt(name == "zstd" ? fmt::format("zstd: {}", ZSTD_getErrorName(n))
                                  : fmt::format("{}: zstd: {}", name, ZSTD_getErrorName(n)));
  }
  if (n != dst.size()) {
    return Corrupt(fmt::format("{} payload decoded to {} bytes, the header says {}", name, n, dst.size()));
  }
  return Status::Ok();
}

}  // namespace codec_internal

namespace {

using codec_internal::ZstdDecompress;

bool ZstdCompress(CodecContext& ctx, int level, std::span<const std::byte> src, std::vector<std::byte>& out) {
  if (ctx.cctx == nullptr) ctx.cctx = ZSTD_createCCtx();
  out.resize(ZSTD_compressBound(src.size()));
  // Content checksum on: a damaged payload fails to decode instead of decoding
  // to other bytes (the frame tag catches wire damage; this catches the rest).
  ZSTD_CCtx_setParameter(ctx.cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(ctx.cctx, ZSTD_c_checksumFlag, 1);
  size_t n = ZSTD_compress2(ctx.cctx, out.data(), out.size(), src.data(), src.size());
  if (ZSTD_isError(n)) return false;
  out.resize(n);
  return true;
}

Status DecodeNone(CodecContext&, std::span<const std::byte> payload, std::span<std::byte> raw) {
  if (payload.size() != raw.size()) {
    return Corrupt(fmt::format("none payload is {} bytes, the header says {}", payload.size(), raw.size()));
  }
  if (!raw.empty()) std::memcpy(raw.data(), payload.data(), raw.size());
  return Status::Ok();
}

bool EncodeZstd(CodecContext& ctx, int level, std::span<const std::byte> raw, std::vector<std::byte>& out) {
  return ZstdCompress(ctx, level, raw, out);
}

Status DecodeZstd(CodecContext& ctx, std::span<const std::byte> payload, std::span<std::byte> raw) {
  return ZstdDecompress(ctx, "zstd", payload, raw);
}

bool EncodeShuffleZstd(CodecContext& ctx, int level, std::span<const std::byte> raw, std::vector<std::byte>& out) {
  ctx.planes.resize(raw.size());
  Shuffle16(raw, ctx.planes.data());
  return ZstdCompress(ctx, level, ctx.planes, out);
}

Status DecodeShuffleZstd(CodecContext& ctx, std::span<const std::byte> payload, std::span<std::byte> raw) {
  ctx.planes.resize(raw.size());
  GM_RETURN_IF_ERROR(ZstdDecompress(ctx, "shuffle-zstd", payload, ctx.planes));
  Unshuffle16(ctx.planes, raw.data());
  return Status::Ok();
}

// The registry. Index == codec_flags; names, capabilities and values are wire
// and report bytes (transport/wire/FORMAT.md, the golden files): never change one.
constexpr CodecInfo kCodecs[] = {
    {CodecKind::kNone, "none", "none", CodecChoice::Mode::kNone, "", nullptr, nullptr, nullptr, DecodeNone, false},
    {CodecKind::kZstd, "zstd", "zstd", CodecChoice::Mode::kZstd, "codec:zstd", &CodecSample::zstd_ratio,
     &CodecSample::zstd_bytes_per_s, EncodeZstd, DecodeZstd, true},
    {CodecKind::kShuffleZstd, "shuffle-zstd", "shuffle", CodecChoice::Mode::kShuffleZstd, "codec:shuffle16-zstd",
     &CodecSample::shuffle_ratio, &CodecSample::shuffle_bytes_per_s, EncodeShuffleZstd, DecodeShuffleZstd, true},
    {CodecKind::kBf16, "bf16", "bf16", CodecChoice::Mode::kBf16, "codec:bf16-exp-zstd", &CodecSample::bf16_ratio,
     &CodecSample::bf16_bytes_per_s, codec_internal::EncodeBf16, codec_internal::DecodeBf16, /*takes_level=*/false},
};

constexpr bool FlagsAreIndices() {
  for (size_t i = 0; i < std::size(kCodecs); ++i) {
    if (static_cast<size_t>(kCodecs[i].kind) != i) return false;
  }
  return true;
}
static_assert(FlagsAreIndices(), "kCodecs[i] must be the codec whose codec_flags is i");

}  // namespace

std::span<const CodecInfo> Codecs() { return kCodecs; }

const CodecInfo* FindCodec(uint8_t codec_flags) {
  return codec_flags < std::size(kCodecs) ? &kCodecs[codec_flags] : nullptr;
}

Result<CodecKind> CodecFromFlags(uint8_t codec_flags) {
  const CodecInfo* c = FindCodec(codec_flags);
  if (c == nullptr) return Corrupt(fmt::format("codec flags 0x{:x} are not a known codec", codec_flags));
  return c->kind;
}

const CodecInfo* FindCodecByName(std::string_view name) {
  for (const CodecInfo& c : kCodecs) {
    if (name == c.name || name == c.flag_name) return &c;
  }
  return nullptr;
}

const CodecInfo& CodecOf(CodecKind k) {
  const CodecInfo* c = FindCodec(static_cast<uint8_t>(k));
  return c != nullptr ? *c : kCodecs[0];
}

std::optional<CodecKind> FixedCodec(const CodecChoice& choice) {
  for (const CodecInfo& c : kCodecs) {
    if (c.mode == choice.mode) return c.kind;
  }
  return std::nullopt;
}

std::vector<std::string> DecodeCapabilities() {
  std::vector<std::string> caps;
  for (const CodecInfo& c : kCodecs) {
    if (!c.capability.empty()) caps.emplace_back(c.capability);
  }
  return caps;
}

bool PeerDecodes(const std::vector<std::string>& peer_capabilities, CodecKind k) {
  const CodecInfo* c = FindCodec(static_cast<uint8_t>(k));
  if (c == nullptr) return false;
  if (c->capability.empty()) return true;
  return std::find(peer_capabilities.begin(), peer_capabilities.end(), c->capability) != peer_capabilities.end();
}

bool PeerDecodes(const std::vector<std::string>& peer_capabilities, const CodecChoice& choice) {
  if (std::optional<CodecKind> k = FixedCodec(choice)) return PeerDecodes(peer_capabilities, *k);
  for (const CodecInfo& c : kCodecs) {
    if (!PeerDecodes(peer_capabilities, c.kind)) return false;
  }
  return true;
}

bool IsZeroPage(std::span<const std::byte> page) {
  const std::byte* p = page.data();
  size_t n = page.size(), i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w) return false;
  }
  for (; i < n; ++i) {
    if (p[i] != std::byte{0}) return false;
  }
  return true;
}

std::string_view CodecKindName(CodecKind k) {
  const CodecInfo* c = FindCodec(static_cast<uint8_t>(k));
  return c != nullptr ? c->name : "unknown";
}

std::string CodecChoice::ToString() const {
  if (mode == Mode::kAuto) return fmt::format("auto:{}", level);
  const CodecInfo& c = CodecOf(FixedCodec(*this).value_or(CodecKind::kNone));
  // A codec with a level carries it; none and bf16 have none.
  return c.takes_level ? fmt::format("{}:{}", c.flag_name, level) : std::string(c.flag_name);
}

Result<CodecChoice> ParseCodecChoice(std::string_view text) {
  CodecChoice c;
  std::string_view name = text.substr(0, text.find(':'));
  if (name == "auto") {
    c.mode = CodecChoice::Mode::kAuto;
  } else if (const CodecInfo* info = FindCodecByName(name)) {
    c.mode = info->mode;
  } else {
    std::string names;
    for (const CodecInfo& k : kCodecs) {
      names += fmt::format("{}{}, ", k.flag_name, k.takes_level ? "[:LEVEL]" : "");
    }
    return InvalidArgument(fmt::format("codec: '{}' is not one of {}auto", text, names));
  }
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    std::string_view level = text.substr(colon + 1);
    if (const CodecInfo* info = FindCodecByName(name); info != nullptr && !info->takes_level) {
      return InvalidArgument(fmt::format("codec: {} takes no level ('{}')", info->flag_name, text));
    }
    auto parsed = ParseInt(level, INT_MIN, INT_MAX);
    if (!parsed.ok()) return InvalidArgument(fmt::format("codec: level '{}' in '{}' is not a number", level, text));
    c.level = static_cast<int>(*parsed);
    if (c.level < 1 || c.level > ZSTD_maxCLevel()) {
      return InvalidArgument(fmt::format("codec: level {} is outside 1..{}", c.level, ZSTD_maxCLevel()));
    }
  }
  return c;
}

FrameEncoder::FrameEncoder() : ctx_(std::make_unique<CodecContext>()) {}
FrameEncoder::~FrameEncoder() = default;

CodecKind FrameEncoder::Encode(CodecKind kind, int level, std::span<const std::byte> raw, std::vector<std::byte>& out) {
  const CodecInfo* c = FindCodec(static_cast<uint8_t>(kind));
  if (c == nullptr || !c->compresses() || raw.empty()) return CodecKind::kNone;
  if (!c->encode(*ctx_, level, raw, out) || out.size() >= raw.size()) return CodecKind::kNone;
  return kind;
}

FrameDecoder::FrameDecoder() : ctx_(std::make_unique<CodecContext>()) {}
FrameDecoder::~FrameDecoder() = default;

Status FrameDecoder::Decode(CodecKind kind, std::span<const std::byte> payload, std::span<std::byte> raw) {
  const CodecInfo* c = FindCodec(static_cast<uint8_t>(kind));
  if (c == nullptr) return Corrupt(fmt::format("codec flags {} are not a known codec", static_cast<int>(kind)));
  return c->decode(*ctx_, payload, raw);
}

CodecSample SampleCodecs(std::span<const std::byte> pages, int level) {
  CodecSample s;
  if (pages.empty()) return s;
  FrameEncoder enc;
  std::vector<std::byte> out;
  auto pass = [&](CodecKind k) {
    size_t wire = 0;
    for (size_t off = 0; off < pages.size(); off += 1 << 20) {
      auto chunk = pages.subspan(off, std::min<size_t>(1 << 20, pages.size() - off));
      wire += enc.Encode(k, level, chunk, out) == CodecKind::kNone ? chunk.size() : out.size();
    }
    return wire;
  };
  auto measure = [&](CodecKind k, double* ratio, double* speed) {
    // The first pass warms caches and contexts (measured here: a cold 1 MiB
    // sample runs at a quarter of the steady speed); the speed is taken over
    // further passes worth at least 8 MiB and 20 ms.
    size_t wire = pass(k);
    *ratio = static_cast<double>(pages.size()) / static_cast<double>(std::max<size_t>(1, wire));
    auto t0 = std::chrono::steady_clock::now();
    size_t done = 0;
    double secs = 0;
    do {
      pass(k);
      done += pages.size();
      secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (done < (8u << 20) || secs < 0.02);
    *speed = static_cast<double>(done) / secs;
  };
  for (const CodecInfo& c : Codecs()) {
    if (c.compresses()) measure(c.kind, &(s.*c.sampled_ratio), &(s.*c.sampled_bytes_per_s));
  }
  return s;
}

double EffectiveRatio(const CodecSample& s, CodecKind k, double link) {
  const CodecInfo& c = CodecOf(k);
  if (!c.compresses() || link <= 0) return 1.0;
  return std::min(s.*c.sampled_ratio, s.*c.sampled_bytes_per_s / link);
}

CodecKind ChooseCodec(const CodecSample& s, double link) {
  if (link <= 0) return CodecKind::kNone;
  // Demand a clear gain: a few percent is within the noise of the speed sample.
  constexpr double kClearGain = 1.05;
  double best_ratio = 0;
  for (const CodecInfo& c : Codecs()) {
    if (c.compresses()) best_ratio = std::max(best_ratio, EffectiveRatio(s, c.kind, link));
  }
  if (best_ratio <= kClearGain) return CodecKind::kNone;
  // Among the codecs that move a byte as fast as the sample can tell apart, the
  // one that costs the least CPU (on a slow link zstd, shuffle and bf16 are all
  // ratio-bound: bf16's slightly better ratio comes at a fraction of shuffle's CPU).
  CodecKind best = CodecKind::kNone;
  double best_speed = -1;
  for (const CodecInfo& c : Codecs()) {
    if (!c.compresses()) continue;
    const double r = EffectiveRatio(s, c.kind, link);
    if (r <= kClearGain || r * kClearGain < best_ratio) continue;
    if (s.*c.sampled_bytes_per_s > best_speed) {
      best = c.kind;
      best_speed = s.*c.sampled_bytes_per_s;
    }
  }
  return best;
}

}  // namespace gpumigrate
