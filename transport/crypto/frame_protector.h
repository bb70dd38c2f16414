// FrameProtector: what protects a data frame on the wire.
//
//   integrity only   tag = XXH3-128(header || payload) seeded with a session key;
//                    the payload travels in the clear (in-process and --insecure-no-tls)
//   AES-256-GCM      the payload is encrypted; nonce = stream id (4 bytes LE) ||
//                    sequence (8 bytes LE); the 48-byte header is the associated
//                    data; the 16-byte GCM tag is the frame's tag
//
// Holds cipher contexts: one protector per thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gpumigrate/common/status.h"
#include "transport/wire/frame.h"

namespace gpumigrate {

struct FrameKeys {
  bool aes_gcm = false;
  uint64_t integrity_key = 0;           // integrity-only mode
  std::array<std::byte, 32> aes_key{};  // AES-256-GCM mode
};

class FrameProtector {
 public:
  virtual ~FrameProtector() = default;
  // Returns the bytes to send as the payload (possibly `scratch`) and sets `tag`.
  virtual Result<std::span<const std::byte>> Seal(std::span<const std::byte> header, uint32_t stream, uint64_t sequence,
                                                  std::span<const std::byte> payload, std::vector<std::byte>& scratch,
                                                  wire::Tag& tag) = 0;
  // Seal, with the sealed payload written over `payload` (the frame's own
  // buffer: no scratch copy).
  virtual Status SealInPlace(std::span<const std::byte> header, uint32_t stream, uint64_t sequence,
                             std::span<std::byte> payload, wire::Tag& tag) = 0;
  // Checks the tag and decrypts `payload` in place; an error names no secrets.
  virtual Status Open(std::span<const std::byte> header, uint32_t stream, uint64_t sequence,
                      std::span<std::byte> payload, const wire::Tag& tag) = 0;
};

std::unique_ptr<FrameProtector> MakeFrameProtector(const FrameKeys& keys);

// HKDF-SHA256(secret, salt = session id, info) -> 32 bytes.
Result<std::array<std::byte, 32>> DeriveKey(std::span<const std::byte> secret, uint64_t session_id,
                                            std::string_view info);

}  // namespace gpumigrate
