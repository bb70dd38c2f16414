// The bf16 codec (codec_flags 3, --codec bf16): for bfloat16 tensors such as
// model weights.
//
// A bf16 value is sign (1 bit), exponent (8), mantissa (7). In trained weights
// the exponents crowd into a few values (about 2.5 bits of entropy in the sim's
// N(0, 0.02) weights) while sign and mantissa are close to random. So each value
// is split into an exponent byte and a sign+mantissa byte (ZipNN's layout: the
// sign moved next to the mantissa, so a whole exponent sits in one byte); the
// exponent plane is entropy-coded, the sign+mantissa plane is stored raw.
//
// The exponent coder is zstd's Huffman literal coder, reached through libzstd's
// public API: strategy fast with the largest acceleration and 7-byte matches
// (there is nothing to match in exponents; the match finder then skips almost
// everything) and literal compression forced on (zstd turns it off by itself for
// accelerated fast levels). Measured on this project's machines against the
// alternatives (README "Payload codecs"): it matches an order-0 rANS coder's
// ratio within 1% at 1.5x its speed, and needs no coder of our own.
//
// Payload, all of it bounds-checked by the decoder (transport/wire/FORMAT.md):
//   u32 LE  exponent_stream_bytes (E)
//   n bytes sign+mantissa plane, n = raw_length / 2
//   0 or 1  the odd last byte of the frame, raw
//   E bytes one zstd frame (content size n, content checksum) of the exponent plane
// Thread safety: as the registry's codecs (one CodecContext per thread).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct CodecContext;

namespace codec_internal {

constexpr size_t kBf16HeaderBytes = 4;

// Encodes `raw` into `out`; false when it cannot (the frame then goes raw).
bool EncodeBf16(CodecContext& ctx, int level, std::span<const std::byte> raw, std::vector<std::byte>& out);
// Decodes `payload` into exactly `raw.size()` bytes; kCorrupt naming what is wrong otherwise.
Status DecodeBf16(CodecContext& ctx, std::span<const std::byte> payload, std::span<std::byte> raw);

// The planes of raw.size() / 2 bf16 values (little-endian); a trailing odd byte
// is not touched. exponents and sign_mantissa hold raw.size() / 2 bytes each.
void SplitBf16(std::span<const std::byte> raw, std::byte* exponents, std::byte* sign_mantissa);
// The inverse: writes 2 * n bytes of `raw`, n = exponents.size() = sign_mantissa.size().
void JoinBf16(std::span<const std::byte> exponents, std::span<const std::byte> sign_mantissa, std::byte* raw);

}  // namespace codec_internal
}  // namespace gpumigrate
