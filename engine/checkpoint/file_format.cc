#include "engine/checkpoint/file_format.h"

#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

namespace gpumigrate::ckpt {
namespace {

// Little-endian fields (the machines this runs on are little-endian; the
// frame codec makes the same assumption and FORMAT.md states it).
template <typename T>
void Put(std::byte*& p, T v) {
  std::memcpy(p, &v, sizeof v);
  p += sizeof v;
}
template <typename T>
T Get(const std::byte*& p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  p += sizeof v;
  return v;
}
uint32_t Checksum(const std::byte* p, size_t n) { return XXH32(p, n, 0); }

}  // namespace

std::string RecordKindName(RecordKind k) {
  switch (k) {
    case RecordKind::kManifest: return "manifest";
    case RecordKind::kFrame: return "frame";
    case RecordKind::kControl: return "control";
    case RecordKind::kIndex: return "index";
    case RecordKind::kFooter: return "footer";
    case RecordKind::kInvalid: break;
  }
  return fmt::format("kind {}", static_cast<int>(k));
}

std::array<std::byte, kFileHeaderBytes> EncodeFileHeader(const FileHeader& h) {
  std::array<std::byte, kFileHeaderBytes> out{};
  std::byte* p = out.data();
  std::memcpy(p, kFileMagic.data(), kFileMagic.size());
  p += kFileMagic.size();
  Put<uint16_t>(p, h.major);
  Put<uint16_t>(p, h.minor);
  Put<uint32_t>(p, h.flags);
  Put<uint64_t>(p, h.file_id);
  Put<uint64_t>(p, h.chain_id);
  std::memcpy(p, h.key_check.data(), h.key_check.size());
  // bytes 48..59 reserved (zero)
  p = out.data() + kFileHeaderBytes - 4;
  Put<uint32_t>(p, Checksum(out.data(), kFileHeaderBytes - 4));
  return out;
}

Result<FileHeader> DecodeFileHeader(std::span<const std::byte, kFileHeaderBytes> bytes) {
  if (std::memcmp(bytes.data(), kFileMagic.data(), kFileMagic.size()) != 0) {
    return Corrupt("file header: bad magic (not a gpumigrate checkpoint)");
  }
  const std::byte* p = bytes.data() + kFileMagic.size();
  FileHeader h;
  h.major = Get<uint16_t>(p);
  h.minor = Get<uint16_t>(p);
  h.flags = Get<uint32_t>(p);
  h.file_id = Get<uint64_t>(p);
  h.chain_id = Get<uint64_t>(p);
  std::memcpy(h.key_check.data(), p, h.key_check.size());
  const std::byte* c = bytes.data() + kFileHeaderBytes - 4;
  uint32_t want = Get<uint32_t>(c);
  if (want != Checksum(bytes.data(), kFileHeaderBytes - 4)) {
    return Corrupt("file header: checksum mismatch (the header is damaged)");
  }
  if (h.major != kVersionMajor || h.minor > kVersionMinor) {
    return Corrupt(fmt::format("file header: format version {}.{} is not readable by this gpumigrate (reads {}.0 to {}.{})",
                               h.major, h.minor, kVersionMajor, kVersionMajor, kVersionMinor));
  }
  if ((h.flags & ~kKnownFlags) != 0) {
    return Corrupt(fmt::format("file header: unknown flags 0x{:x}", h.flags & ~kKnownFlags));
  }
  if (h.file_id == 0 || h.chain_id == 0) return Corrupt("file header: zero file or chain id");
  return h;
}

RecordHeaderBytes EncodeRecordHeader(const RecordHeader& h) {
  RecordHeaderBytes out{};
  std::byte* p = out.data();
  Put<uint32_t>(p, kRecordMagic);
  Put<uint8_t>(p, static_cast<uint8_t>(h.kind));
  p += 3;  // reserved
  Put<uint64_t>(p, h.number);
  Put<uint64_t>(p, h.body_length);
  Put<uint32_t>(p, 0);  // reserved
  Put<uint32_t>(p, Checksum(out.data(), kRecordHeaderBytes - 4));
  return out;
}

Result<RecordHeader> DecodeRecordHeader(std::span<const std::byte, kRecordHeaderBytes> bytes) {
  const std::byte* p = bytes.data();
  if (Get<uint32_t>(p) != kRecordMagic) return Corrupt("record header: bad magic");
  RecordHeader h;
  h.kind = static_cast<RecordKind>(Get<uint8_t>(p));
  p += 3;
  h.number = Get<uint64_t>(p);
  h.body_length = Get<uint64_t>(p);
  const std::byte* c = bytes.data() + kRecordHeaderBytes - 4;
  if (Get<uint32_t>(c) != Checksum(bytes.data(), kRecordHeaderBytes - 4)) {
    return Corrupt("record header: checksum mismatch (the header is damaged)");
  }
  if (h.kind == RecordKind::kInvalid || static_cast<uint8_t>(h.kind) > static_cast<uint8_t>(RecordKind::kFooter)) {
    return Corrupt(fmt::format("record header: unknown record {}", RecordKindName(h.kind)));
  }
  return h;
}

Result<FileKeys> DeriveFileKeys(const FileHeader& h, const std::optional<FileKey>& key) {
  FileKeys k;
  if (h.encrypted() && !key) {
    return InvalidArgument("the file is encrypted: give its key (--key-file)");
  }
  if (!h.encrypted() && key) {
    return InvalidArgument("the file is not encrypted, but a key was given: is this the file you meant?");
  }
  if (!h.encrypted()) {
    k.records.integrity_key = h.file_id;
    k.frames.integrity_key = h.chain_id;
    return k;
  }
  GM_ASSIGN_OR_RETURN(auto check, KeyCheck(*key, h.file_id));
  if (check != h.key_check) return InvalidArgument("wrong key: the file was encrypted under a different key");
  k.records.aes_gcm = k.frames.aes_gcm = true;
  GM_ASSIGN_OR_RETURN(k.records.aes_key, DeriveKey(*key, h.file_id, "gpumigrate checkpoint records v1"));
  GM_ASSIGN_OR_RETURN(k.frames.aes_key, DeriveKey(*key, h.chain_id, "gpumigrate checkpoint frames v1"));
  return k;
}

Result<std::array<std::byte, 16>> KeyCheck(const FileKey& key, uint64_t file_id) {
  GM_ASSIGN_OR_RETURN(auto full, DeriveKey(key, file_id, "gpumigrate checkpoint key check v1"));
  std::array<std::byte, 16> out;
  std::memcpy(out.data(), full.data(), out.size());
  return out;
}

Result<std::vector<std::byte>> RecordSealer::Seal(RecordKind kind, uint64_t number, std::span<const std::byte> body) {
  RecordHeader h;
  h.kind = kind;
  h.number = number;
  h.body_length = body.size() + kTagBytes;
  RecordHeaderBytes hb = EncodeRecordHeader(h);
  wire::Tag tag;
  GM_ASSIGN_OR_RETURN(auto sealed, protector_->Seal(hb, kRecordStream, number, body, scratch_, tag));
  std::vector<std::byte> out;
  out.reserve(hb.size() + sealed.size() + tag.size());
  out.insert(out.end(), hb.begin(), hb.end());
  out.insert(out.end(), sealed.begin(), sealed.end());
  out.insert(out.end(), tag.begin(), tag.end());
  return out;
}

Result<std::span<std::byte>> RecordSealer::Open(const RecordHeaderBytes& header, uint64_t number,
                                                std::span<std::byte> body) {
  if (body.size() < kTagBytes) return Corrupt("record shorter than its tag");
  wire::Tag tag;
  std::memcpy(tag.data(), body.data() + body.size() - kTagBytes, kTagBytes);
  auto plain = body.first(body.size() - kTagBytes);
  GM_RETURN_IF_ERROR(protector_->Open(header, kRecordStream, number, plain, tag));
  return plain;
}

}  // namespace gpumigrate::ckpt
