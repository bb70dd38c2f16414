// The bf16 codec: exponent plane through zstd's Huffman literal coder,
// sign+mantissa plane raw (the layout and the choice: bf16_codec.h).

// For ZSTD_c_literalCompressionMode and ZSTD_ps_enable: values of the public
// ZSTD_CCtx_setParameter (the parameter is ZSTD_c_experimentalParam5 of its
// public enum); no experimental function is called, no internal symbol linked.
#define ZSTD_STATIC_LINKING_ONLY
#include "transport/codec/bf16_codec.h"

#include <zstd.h>

#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "transport/codec/codec_context.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace gpumigrate::codec_internal {
namespace {

// One value's planes: the whole exponent in one byte, the sign beside the mantissa.
inline void SplitOne(uint16_t v, std::byte* e, std::byte* sm) {
  *e = static_cast<std::byte>((v >> 7) & 0xff);
  *sm = static_cast<std::byte>(((v >> 8) & 0x80) | (v & 0x7f));
}

inline uint16_t JoinOne(std::byte e, std::byte sm) {
  const unsigned s = static_cast<unsigned>(sm);
  return static_cast<uint16_t>(((s & 0x80) << 8) | (static_cast<unsigned>(e) << 7) | (s & 0x7f));
}

// The exponent coder's parameters (bf16_codec.h says why these). False when
// this libzstd refuses one: the codec then never encodes and frames go raw.
bool SetExponentCoderParameters(ZSTD_CCtx* c) {
  const ZSTD_bounds accel = ZSTD_cParam_getBounds(ZSTD_c_targetLength);
  if (ZSTD_isError(accel.error)) return false;
  const std::pair<ZSTD_cParameter, int> params[] = {
      {ZSTD_c_compressionLevel, 1},
      {ZSTD_c_strategy, ZSTD_fast},
      {ZSTD_c_windowLog, 17},  // 128 KiB blocks, zstd's largest: one Huffman table per 64 Ki exponents
      {ZSTD_c_hashLog, 10},
      {ZSTD_c_minMatch, 7},
      {ZSTD_c_targetLength, accel.upperBound},  // for strategy fast: the acceleration
      {ZSTD_c_literalCompressionMode, ZSTD_ps_enable},
      // As for the zstd codecs: a damaged exponent stream fails instead of decoding to other bytes.
      {ZSTD_c_checksumFlag, 1},
      {ZSTD_c_contentSizeFlag, 1},
  };
  for (auto [p, v] : params) {
    if (ZSTD_isError(ZSTD_CCtx_setParameter(c, p, v))) return false;
  }
  return true;
}

void PutU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

uint32_t GetU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

void SplitBf16(std::span<const std::byte> raw, std::byte* exponents, std::byte* sign_mantissa) {
  const size_t n = raw.size() / 2;
  const std::byte* in = raw.data();
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i low = _mm_set1_epi16(0xff), mant = _mm_set1_epi16(0x7f), sign = _mm_set1_epi16(0x80);
  for (; i + 16 <= n; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i + 16));
    const __m128i ea = _mm_and_si128(_mm_srli_epi16(a, 7), low), eb = _mm_and_si128(_mm_srli_epi16(b, 7), low);
    const __m128i sa = _mm_or_si128(_mm_and_si128(a, mant), _mm_and_si128(_mm_srli_epi16(a, 8), sign));
    const __m128i sb = _mm_or_si128(_mm_and_si128(b, mant), _mm_and_si128(_mm_srli_epi16(b, 8), sign));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(exponents + i), _mm_packus_epi16(ea, eb));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(sign_mantissa + i), _mm_packus_epi16(sa, sb));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t v = static_cast<uint16_t>(static_cast<unsigned>(in[2 * i]) | static_cast<unsigned>(in[2 * i + 1]) << 8);
    SplitOne(v, exponents + i, sign_mantissa + i);
  }
}

void JoinBf16(std::span<const std::byte> exponents, std::span<const std::byte> sign_mantissa, std::byte* raw) {
  const size_t n = exponents.size();
  const std::byte* e = exponents.data();
  const std::byte* sm = sign_mantissa.data();
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i mant = _mm_set1_epi16(0x7f), sign = _mm_set1_epi16(0x80), zero = _mm_setzero_si128();
  auto join8 = [&](__m128i e16, __m128i s16) {
    return _mm_or_si128(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(s16, sign), 8), _mm_slli_epi16(e16, 7)),
                        _mm_and_si128(s16, mant));
  };
  for (; i + 16 <= n; i += 16) {
    const __m128i ev = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e + i));
    const __m128i sv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sm + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + 2 * i),
                     join8(_mm_unpacklo_epi8(ev, zero), _mm_unpacklo_epi8(sv, zero)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(raw + 2 * i + 16),
                     join8(_mm_unpackhi_epi8(ev, zero), _mm_unpackhi_epi8(sv, zero)));
  }
#endif
  for (; i < n; ++i) {
    const uint16_t v = JoinOne(e[i], sm[i]);
    raw[2 * i] = static_cast<std::byte>(v & 0xff);
    raw[2 * i + 1] = static_cast<std::byte>(v >> 8);
  }
}

bool EncodeBf16(CodecContext& ctx, int /*level: the exponent coder has one setting*/, std::span<const std::byte> raw,
                std::vector<std::byte>& out) {
  const size_t n = raw.size() / 2, odd = raw.size() % 2;
  if (n == 0) return false;
  if (ctx.bf16_cctx == nullptr) {
    ctx.bf16_cctx = ZSTD_createCCtx();
    ctx.bf16_cctx_ok = ctx.bf16_cctx != nullptr && SetExponentCoderParameters(ctx.bf16_cctx);
  }
  if (!ctx.bf16_cctx_ok) return false;
  // The raw plane goes straight to its place in `out`; the exponents go through
  // the scratch plane into the zstd frame that follows.
  const size_t head = kBf16HeaderBytes + n + odd;
  out.resize(head + ZSTD_compressBound(n));
  ctx.planes.resize(n);
  SplitBf16(raw, ctx.planes.data(), out.data() + kBf16HeaderBytes);
  if (odd) out[kBf16HeaderBytes + n] = raw.back();
  const size_t e = ZSTD_compress2(ctx.bf16_cctx, out.data() + head, out.size() - head, ctx.planes.data(), n);
  if (ZSTD_isError(e) || e > UINT32_MAX) return false;
  PutU32(out.data(), static_cast<uint32_t>(e));
  out.resize(head + e);
  return true;
}

Status DecodeBf16(CodecContext& ctx, std::span<const std::byte> payload, std::span<std::byte> raw) {
  const size_t n = raw.size() / 2, odd = raw.size() % 2;
  if (payload.size() < kBf16HeaderBytes) {
    return Corrupt(fmt::format("bf16 payload is {} bytes, shorter than its {}-byte header", payload.size(),
                               kBf16HeaderBytes));
  }
  const size_t stream_bytes = GetU32(payload.data());
  const size_t body = payload.size() - kBf16HeaderBytes;
  if (body < n + odd) {
    return Corrupt(fmt::format("bf16 payload of {} bytes cannot hold the {}-byte raw plane of a {}-byte frame",
                               payload.size(), n + odd, raw.size()));
  }
  if (stream_bytes != body - n - odd) {
    return Corrupt(fmt::format(
        "bf16 lengths do not add up: the header says a {}-byte exponent stream, the {}-byte payload leaves {} "
        "after the header and the {}-byte raw plane of a {}-byte frame",
        stream_bytes, payload.size(), body - n - odd, n + odd, raw.size()));
  }
  const auto stream = payload.subspan(kBf16HeaderBytes + n + odd);
  // Exactly one zstd frame: a second one, or bytes after it, are damage.
  const size_t frame_bytes = ZSTD_findFrameCompressedSize(stream.data(), stream.size());
  if (ZSTD_isError(frame_bytes)) {
    return Corrupt(fmt::format("bf16 exponent stream is not a whole zstd frame: {}", ZSTD_getErrorName(frame_bytes)));
  }
  if (frame_bytes != stream.size()) {
    return Corrupt(fmt::format("bf16 exponent stream has {} bytes after its {}-byte zstd frame",
                               stream.size() - frame_bytes, frame_bytes));
  }
  ctx.planes.resize(n);
  GM_RETURN_IF_ERROR(ZstdDecompress(ctx, "bf16 exponent plane", stream, ctx.planes));
  JoinBf16(ctx.planes, payload.subspan(kBf16HeaderBytes, n), raw.data());
  if (odd) raw.back() = payload[kBf16HeaderBytes + n];
  return Status::Ok();
}

}  // namespace gpumigrate::codec_internal
