#include "transport/wire/frame.h"

#include <cstring>

#include <fmt/format.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace gpumigrate::wire {
namespace {

template <typename T>
void Put(std::byte*& p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) *p++ = static_cast<std::byte>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
}

template <typename T>
T Get(const std::byte*& p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{std::to_integer<uint8_t>(*p++)} << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

HeaderBytes EncodeHeader(const FrameHeader& h) {
  HeaderBytes out{};
  std::byte* p = out.data();
  Put<uint32_t>(p, h.magic);
  Put<uint16_t>(p, h.version);
  Put<uint8_t>(p, static_cast<uint8_t>(h.type));
  Put<uint8_t>(p, h.codec_flags);
  Put<uint32_t>(p, h.stream_id);
  Put<uint32_t>(p, h.region);
  Put<uint64_t>(p, h.sequence);
  Put<uint32_t>(p, h.round);
  Put<uint32_t>(p, h.reserved);
  Put<uint64_t>(p, h.offset);
  Put<uint32_t>(p, h.raw_length);
  Put<uint32_t>(p, h.payload_length);
  return out;
}

Result<FrameHeader> DecodeHeader(std::span<const std::byte, kFrameHeaderBytes> bytes) {
  const std::byte* p = bytes.data();
  FrameHeader h;
  h.magic = Get<uint32_t>(p);
  h.version = Get<uint16_t>(p);
  h.type = static_cast<FrameType>(Get<uint8_t>(p));
  h.codec_flags = Get<uint8_t>(p);
  h.stream_id = Get<uint32_t>(p);
  h.region = Get<uint32_t>(p);
  h.sequence = Get<uint64_t>(p);
  h.round = Get<uint32_t>(p);
  h.reserved = Get<uint32_t>(p);
  h.offset = Get<uint64_t>(p);
  h.raw_length = Get<uint32_t>(p);
  h.payload_length = Get<uint32_t>(p);
  if (h.magic != kFrameMagic) return Corrupt(fmt::format("bad frame magic 0x{:08x}", h.magic));
  if (h.version != kFrameVersion) {
    return Corrupt(fmt::format("frame format version {} is not supported (this build reads {})", h.version,
                               kFrameVersion));
  }
  if (h.type != FrameType::kPages && h.type != FrameType::kZeroPages && h.type != FrameType::kDeviceState &&
      h.type != FrameType::kPageDigests) {
    return Corrupt(fmt::format("unknown frame type {}", static_cast<int>(h.type)));
  }
  if (h.reserved != 0) return Corrupt("reserved header field is not zero");
  return h;
}

Tag ComputeTag(uint64_t key, std::span<const std::byte> header, std::span<const std::byte> payload) {
  // A stack state must be initialized before a seeded reset: the reset skips
  // regenerating its secret when the stale seed field happens to equal `key`.
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset_withSeed(&state, key);
  XXH3_128bits_update(&state, header.data(), header.size());
  XXH3_128bits_update(&state, payload.data(), payload.size());
  XXH128_hash_t h = XXH3_128bits_digest(&state);
  Tag t;
  std::memcpy(t.data(), &h.low64, 8);
  std::memcpy(t.data() + 8, &h.high64, 8);
  return t;
}

std::string FrameTypeName(FrameType t) {
  switch (t) {
    case FrameType::kPages: return "PAGES";
    case FrameType::kZeroPages: return "ZERO_PAGES";
    case FrameType::kDeviceState: return "DEVICE_STATE";
    case FrameType::kPageDigests: return "PAGE_DIGESTS";
    default: return fmt::format("type {}", static_cast<int>(t));
  }
}

}  // namespace gpumigrate::wire
