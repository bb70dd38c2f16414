#include "gpumigrate/codec.h"

#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace gpumigrate {

std::string_view CodecKindName(CodecKind k) {
  switch (k) {
    case CodecKind::kNone: return "none";
    case CodecKind::kZstd: return "zstd";
    case CodecKind::kShuffleZstd: return "shuffle-zstd";
  }
  return "unknown";
}

std::string CodecChoice::ToString() const {
  switch (mode) {
    case Mode::kNone: return "none";
    case Mode::kZstd: return fmt::format("zstd:{}", level);
    case Mode::kShuffleZstd: return fmt::format("shuffle:{}", level);
    case Mode::kAuto: return fmt::format("auto:{}", level);
  }
  return "none";
}

Result<CodecChoice> ParseCodecChoice(std::string_view text) {
  CodecChoice c;
  std::string_view name = text.substr(0, text.find(':'));
  if (name == "none") c.mode = CodecChoice::Mode::kNone;
  else if (name == "zstd") c.mode = CodecChoice::Mode::kZstd;
  else if (name == "shuffle" || name == "shuffle-zstd") c.mode = CodecChoice::Mode::kShuffleZstd;
  else if (name == "auto") c.mode = CodecChoice::Mode::kAuto;
  else {
    return InvalidArgument(fmt::format("codec: '{}' is not one of none, zstd[:LEVEL], shuffle[:LEVEL], auto", text));
  }
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    std::string level(text.substr(colon + 1));
    try {
      size_t used = 0;
      c.level = std::stoi(level, &used);
      if (used != level.size()) throw std::invalid_argument("trailing");
    } catch (...) {
      return InvalidArgument(fmt::format("codec: level '{}' in '{}' is not a number", level, text));
    }
    if (c.level < 1 || c.level > ZSTD_maxCLevel()) {
      return InvalidArgument(fmt::format("codec: level {} is outside 1..{}", c.level, ZSTD_maxCLevel()));
    }
  }
  return c;
}

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

struct FrameEncoder::Impl {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  std::vector<std::byte> planes;
  ~Impl() { ZSTD_freeCCtx(cctx); }
};

FrameEncoder::FrameEncoder() : impl_(std::make_unique<Impl>()) {}
FrameEncoder::~FrameEncoder() = default;

CodecKind FrameEncoder::Encode(CodecKind kind, int level, std::span<const std::byte> raw, std::vector<std::byte>& out) {
  if (kind == CodecKind::kNone || raw.empty()) return CodecKind::kNone;
  std::span<const std::byte> src = raw;
  if (kind == CodecKind::kShuffleZstd) {
    impl_->planes.resize(raw.size());
    Shuffle16(raw, impl_->planes.data());
    src = impl_->planes;
  }
  out.resize(ZSTD_compressBound(src.size()));
  // Content checksum on: a damaged payload fails to decode instead of decoding
  // to other bytes (the frame tag catches wire damage; this catches the rest).
  ZSTD_CCtx_setParameter(impl_->cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(impl_->cctx, ZSTD_c_checksumFlag, 1);
  size_t n = ZSTD_compress2(impl_->cctx, out.data(), out.size(), src.data(), src.size());
  if (ZSTD_isError(n) || n >= raw.size()) return CodecKind::kNone;
  out.resize(n);
  return kind;
}

struct FrameDecoder::Impl {
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  std::vector<std::byte> planes;
  ~Impl() { ZSTD_freeDCtx(dctx); }
};

FrameDecoder::FrameDecoder() : impl_(std::make_unique<Impl>()) {}
FrameDecoder::~FrameDecoder() = default;

Status FrameDecoder::Decode(CodecKind kind, std::span<const std::byte> payload, std::span<std::byte> raw) {
  if (kind != CodecKind::kZstd && kind != CodecKind::kShuffleZstd) {
    return Corrupt(fmt::format("codec flags {} are not a known codec", static_cast<int>(kind)));
  }
  // The content size in the zstd frame must match the header before anything is decoded.
  unsigned long long declared = ZSTD_getFrameContentSize(payload.data(), payload.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN) {
    return Corrupt(fmt::format("{} payload is not a zstd frame with a known size", CodecKindName(kind)));
  }
  if (declared != raw.size()) {
    return Corrupt(fmt::format("{} payload decodes to {} bytes, the header says {}", CodecKindName(kind), declared,
                               raw.size()));
  }
  std::byte* dst = raw.data();
  if (kind == CodecKind::kShuffleZstd) {
    impl_->planes.resize(raw.size());
    dst = impl_->planes.data();
  }
  size_t n = ZSTD_decompressDCtx(impl_->dctx, dst, raw.size(), payload.data(), payload.size());
  if (ZSTD_isError(n)) return Corrupt(fmt::format("zstd: {}", ZSTD_getErrorName(n)));
  if (n != raw.size()) {
    return Corrupt(fmt::format("{} payload decoded to {} bytes, the header says {}", CodecKindName(kind), n, raw.size()));
  }
  if (kind == CodecKind::kShuffleZstd) Unshuffle16(impl_->planes, raw.data());
  return Status::Ok();
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
  measure(CodecKind::kZstd, &s.zstd_ratio, &s.zstd_bytes_per_s);
  measure(CodecKind::kShuffleZstd, &s.shuffle_ratio, &s.shuffle_bytes_per_s);
  return s;
}

double EffectiveRatio(const CodecSample& s, CodecKind k, double link) {
  if (k == CodecKind::kNone || link <= 0) return 1.0;
  double ratio = k == CodecKind::kZstd ? s.zstd_ratio : s.shuffle_ratio;
  double speed = k == CodecKind::kZstd ? s.zstd_bytes_per_s : s.shuffle_bytes_per_s;
  return std::min(ratio, speed / link);
}

CodecKind ChooseCodec(const CodecSample& s, double link) {
  if (link <= 0) return CodecKind::kNone;
  CodecKind best = CodecKind::kNone;
  double best_ratio = 1.0;
  for (CodecKind k : {CodecKind::kZstd, CodecKind::kShuffleZstd}) {
    double r = EffectiveRatio(s, k, link);
    // Demand a clear gain: a few percent is within the noise of the speed sample.
    if (r > best_ratio * 1.05) {
      best = k;
      best_ratio = r;
    }
  }
  return best;
}

}  // namespace gpumigrate
