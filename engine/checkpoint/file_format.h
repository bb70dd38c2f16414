// The checkpoint file's fixed parts (FORMAT.md beside this file): the file
// header, the record header, and how records are sealed. Pure functions and a
// sealer; no I/O.
//
//   file header (64 bytes) | record 0 (manifest) | records ... | footer record
//   record = record header (32 bytes) | body
//     frame records:  body = one wire data frame, verbatim (it carries its own tag)
//     other records:  body = sealed protobuf | 16-byte tag
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gpumigrate/checkpoint/checkpoint.h"
#include "gpumigrate/common/status.h"
#include "transport/crypto/frame_protector.h"
#include "transport/wire/frame.h"

namespace gpumigrate::ckpt {

constexpr std::array<char, 8> kFileMagic = {'G', 'M', 'C', 'K', 'P', 'T', '\r', '\n'};
constexpr uint16_t kVersionMajor = 1;
constexpr uint16_t kVersionMinor = 1;  // 1.1: files that leave pages to a content store
constexpr size_t kFileHeaderBytes = 64;
constexpr size_t kRecordHeaderBytes = 32;
constexpr uint32_t kRecordMagic = 0x31524D47;  // "GMR1"
constexpr size_t kTagBytes = wire::kFrameTagBytes;
constexpr uint32_t kFlagEncrypted = 1u << 0;
constexpr uint32_t kKnownFlags = kFlagEncrypted;
// Limits checked before anything is allocated.
constexpr uint64_t kMaxSealedRecordBytes = 32 << 20;  // manifest, control, index, footer
constexpr uint64_t kMaxFramePayloadBytes = 64 << 20;  // as the destination session's
// The geometry a manifest may claim, checked before a verify sizes its per-page
// state by it (a restore is bounded by its device as well): 2^28 pages (1 TiB in
// 4 KiB pages, 12 bytes of state each), pages of 512 B to 1 GiB, 4096 regions.
constexpr uint64_t kMaxPages = uint64_t{1} << 28;
constexpr uint32_t kMaxRegions = 4096;
// The pseudo stream id sealed records use in the AEAD nonce (data streams count from 0).
constexpr uint32_t kRecordStream = 0xFFFFFFFE;

enum class RecordKind : uint8_t {
  kInvalid = 0,
  kManifest = 1,  // CheckpointManifest, record 0 only
  kFrame = 2,     // a data frame
  kControl = 3,   // an Envelope: RoundEnd or Prepare, as the session sent it
  kIndex = 4,     // PageIndex
  kFooter = 5,    // CheckpointFooter, the last record
};
std::string RecordKindName(RecordKind k);

struct FileHeader {
  uint16_t major = kVersionMajor;
  uint16_t minor = kVersionMinor;
  uint32_t flags = 0;
  uint64_t file_id = 0;   // random; the HKDF salt of this file's record key
  uint64_t chain_id = 0;  // random per chain (the session id): the HKDF salt of the frame key
  // Encrypted files: HKDF(key, file_id, "key check") truncated, so a wrong key is
  // told apart from a damaged file before anything is decrypted. Zero otherwise.
  std::array<std::byte, 16> key_check{};
  bool encrypted() const { return (flags & kFlagEncrypted) != 0; }
};
std::array<std::byte, kFileHeaderBytes> EncodeFileHeader(const FileHeader& h);
// Checks magic, checksum, version (same major, minor not newer) and flags.
Result<FileHeader> DecodeFileHeader(std::span<const std::byte, kFileHeaderBytes> bytes);

struct RecordHeader {
  RecordKind kind = RecordKind::kInvalid;
  uint64_t number = 0;       // 0, 1, 2, ... in file order
  uint64_t body_length = 0;  // bytes after the record header
};
using RecordHeaderBytes = std::array<std::byte, kRecordHeaderBytes>;
RecordHeaderBytes EncodeRecordHeader(const RecordHeader& h);
// Checks magic, checksum and kind; lengths are the reader's to check.
Result<RecordHeader> DecodeRecordHeader(std::span<const std::byte, kRecordHeaderBytes> bytes);

// The keys of one file: records sealed under a per-file key, frames under the
// chain's key (a chain's files continue one session, so its frames share one).
struct FileKeys {
  FrameKeys records;
  FrameKeys frames;
};
Result<FileKeys> DeriveFileKeys(const FileHeader& h, const std::optional<FileKey>& key);
Result<std::array<std::byte, 16>> KeyCheck(const FileKey& key, uint64_t file_id);

// Seals and opens non-frame records: AEAD (or the integrity tag) over the body
// with the record header as associated data and the record number in the nonce.
class RecordSealer {
 public:
  explicit RecordSealer(const FrameKeys& keys) : protector_(MakeFrameProtector(keys)) {}
  // Returns header || sealed body || tag.
  Result<std::vector<std::byte>> Seal(RecordKind kind, uint64_t number, std::span<const std::byte> body);
  // Opens `body` (sealed bytes || tag) in place; returns the plaintext's span.
  Result<std::span<std::byte>> Open(const RecordHeaderBytes& header, uint64_t number, std::span<std::byte> body);

 private:
  std::unique_ptr<FrameProtector> protector_;
  std::vector<std::byte> scratch_;
};

}  // namespace gpumigrate::ckpt
