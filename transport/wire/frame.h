// Data frames: the unit of bulk transfer on data streams (and, later, in
// checkpoint files). Layout, all little-endian (FORMAT.md has the full table):
//
//   header (48 bytes) | payload (payload_length bytes) | tag (16 bytes)
//
// The tag authenticates header and payload. With CIPHER_NONE_INTEGRITY_ONLY it
// is XXH3-128 seeded with the session key: it catches corruption and frames from
// another session, not a forger. Pure functions; no I/O.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "gpumigrate/common/status.h"

namespace gpumigrate::wire {

constexpr uint32_t kFrameMagic = 0x31464D47;  // "GMF1"
constexpr uint16_t kFrameVersion = 1;
constexpr size_t kFrameHeaderBytes = 48;
constexpr size_t kFrameTagBytes = 16;
constexpr uint32_t kDeviceStateRegion = 0xFFFFFFFF;

enum class FrameType : uint8_t {
  kInvalid = 0,
  kPages = 1,        // raw bytes of a page-aligned run in one region
  kZeroPages = 2,    // the run is now all zeros (no payload)
  kDeviceState = 3,  // a piece of the opaque device-state blob, offset = its position
  kPageDigests = 4,  // the run's pages offered by SHA-256: 32 bytes per page (capability content-store)
};

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t version = kFrameVersion;
  FrameType type = FrameType::kInvalid;
  uint8_t codec_flags = 0;
  uint32_t stream_id = 0;
  uint32_t region = 0;
  uint64_t sequence = 0;
  uint32_t round = 0;
  uint32_t reserved = 0;
  uint64_t offset = 0;
  uint32_t raw_length = 0;
  uint32_t payload_length = 0;
};

using HeaderBytes = std::array<std::byte, kFrameHeaderBytes>;
using Tag = std::array<std::byte, kFrameTagBytes>;

HeaderBytes EncodeHeader(const FrameHeader& h);
// Checks magic, version and type only; the session checks bounds and sequence.
Result<FrameHeader> DecodeHeader(std::span<const std::byte, kFrameHeaderBytes> bytes);

Tag ComputeTag(uint64_t key, std::span<const std::byte> header, std::span<const std::byte> payload);

std::string FrameTypeName(FrameType t);

}  // namespace gpumigrate::wire
