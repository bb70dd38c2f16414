// What the codecs of the registry (transport/codec/codec.cc) share: the
// per-thread working state each FrameEncoder and FrameDecoder owns, and the
// zstd frame decoder every zstd-based codec goes through. Internal to
// transport/codec; the public face is gpumigrate/codec/codec.h.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include <zstd.h>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct CodecContext {
  // Each created on first use: an encoder never decodes and the reverse.
  ZSTD_CCtx* cctx = nullptr;       // zstd and shuffle-zstd, parameters set per call
  ZSTD_CCtx* bf16_cctx = nullptr;  // the bf16 codec's exponent coder, parameters set once
  bool bf16_cctx_ok = false;       // whether this libzstd took those parameters
  ZSTD_DCtx* dctx = nullptr;
  std::vector<std::byte> planes;   // a byte-plane buffer
  ~CodecContext() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeCCtx(bf16_cctx);
    ZSTD_freeDCtx(dctx);
  }
};

namespace codec_internal {

// Decodes one zstd frame into exactly dst.size() bytes; anything else is
// kCorrupt, its message starting with `name` (the codec's, or its part's).
Status ZstdDecompress(CodecContext& ctx, std::string_view name, std::span<const std::byte> payload,
                      std::span<std::byte> dst);

}  // namespace codec_internal
}  // namespace gpumigrate
