#include "engine/checkpoint/file_reader.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace gpumigrate::ckpt {

namespace v1 = wire::v1;

std::string FileReader::Where(uint64_t number, uint64_t offset) const {
  return fmt::format("{}: record {} at byte {}", path_, number, offset);
}

Status FileReader::Fail(uint64_t number, uint64_t offset, const Status& st) const {
  return Status(st.code(), fmt::format("{}: {}", Where(number, offset), st.message()));
}

Result<std::unique_ptr<FileReader>> FileReader::Open(const std::string& path, const std::optional<FileKey>& key,
                                                     bool header_only) {
  std::unique_ptr<FileReader> r(new FileReader());
  r->path_ = path;
  std::error_code ec;
  r->size_ = std::filesystem::file_size(path, ec);
  if (ec) return InvalidArgument(fmt::format("checkpoint {}: {}", path, ec.message()));
  r->in_.open(path, std::ios::binary);
  if (!r->in_) return InvalidArgument(fmt::format("checkpoint {}: cannot open: {}", path, std::strerror(errno)));
  if (r->size_ < kFileHeaderBytes) {
    return Corrupt(fmt::format("{}: {} bytes, shorter than the {}-byte file header (truncated or not a checkpoint)",
                               path, r->size_, kFileHeaderBytes));
  }
  std::array<std::byte, kFileHeaderBytes> hb;
  r->in_.read(reinterpret_cast<char*>(hb.data()), hb.size());
  if (!r->in_) return Unavailable(fmt::format("{}: cannot read the file header", path));
  auto h = DecodeFileHeader(hb);
  if (!h.ok()) return Corrupt(fmt::format("{}: at byte 0: {}", path, h.status().message()));
  r->header_ = *h;
  r->pos_ = kFileHeaderBytes;
  if (header_only) return r;
  auto keys = DeriveFileKeys(r->header_, key);
  if (!keys.ok()) return Status(keys.status().code(), fmt::format("{}: {}", path, keys.status().message()));
  r->keys_ = *keys;
  r->sealer_ = std::make_unique<RecordSealer>(r->keys_.records);

  GM_ASSIGN_OR_RETURN(Record rec, r->Read());
  if (rec.kind != RecordKind::kManifest) {
    return r->Fail(rec.number, rec.offset, Corrupt(fmt::format("expected the manifest, found a {} record",
                                                               RecordKindName(rec.kind))));
  }
  if (!r->manifest_.ParseFromArray(rec.body.data(), static_cast<int>(rec.body.size()))) {
    return r->Fail(rec.number, rec.offset, Corrupt("the manifest does not decode"));
  }
  const v1::Manifest& m = r->manifest_.session();
  auto bad = [&](std::string why) { return r->Fail(rec.number, rec.offset, Corrupt("manifest: " + why)); };
  if (m.regions_size() == 0) return bad("no regions");
  if (m.data_streams() == 0 || m.data_streams() > 64) return bad(fmt::format("{} data streams", m.data_streams()));
  if (m.max_frame_payload_bytes() == 0 || m.max_frame_payload_bytes() > kMaxFramePayloadBytes) {
    return bad(fmt::format("frame payload limit {} is outside 1..{}", m.max_frame_payload_bytes(),
                           kMaxFramePayloadBytes));
  }
  if (static_cast<uint64_t>(m.regions_size()) > kMaxRegions) return bad(fmt::format("{} regions", m.regions_size()));
  uint64_t pages = 0;
  for (const auto& reg : m.regions()) {
    const uint32_t ps = reg.page_size();
    if (ps < 512 || ps > (1u << 30) || (ps & (ps - 1)) != 0) {
      return bad(fmt::format("region {} has a page size of {} bytes", reg.name(), ps));
    }
    if (reg.size_bytes() == 0 || reg.size_bytes() / ps > kMaxPages) {
      return bad(fmt::format("region {} claims {} bytes", reg.name(), reg.size_bytes()));
    }
    pages += (reg.size_bytes() + ps - 1) / ps;
  }
  if (pages > kMaxPages) {
    return bad(fmt::format("{} pages in all, more than the {} a checkpoint may hold", pages, kMaxPages));
  }
  if (m.session_id() != r->header_.chain_id) return bad("its session id is not the header's chain id");
  const auto want_cipher = r->header_.encrypted() ? v1::CIPHER_AES_256_GCM : v1::CIPHER_NONE_INTEGRITY_ONLY;
  if (m.cipher() != want_cipher) return bad("its cipher does not match the header's encryption flag");
  r->max_frame_bytes_ = wire::kFrameHeaderBytes + m.max_frame_payload_bytes() + wire::kFrameTagBytes;
  return r;
}

// One record: its header checked, its body read (within limits) and, unless it
// is a frame, opened.
Result<Record> FileReader::Read() {
  Record rec;
  rec.offset = pos_;
  rec.number = next_number_;
  if (size_ - pos_ < kRecordHeaderBytes) {
    if (pos_ == size_) {
      return Fail(rec.number, rec.offset,
                  Corrupt("the file ends here, before its footer (truncated, or an interrupted checkpoint)"));
    }
    return Fail(rec.number, rec.offset,
                Corrupt(fmt::format("only {} bytes left, less than a record header (truncated)", size_ - pos_)));
  }
  RecordHeaderBytes hb;
  in_.read(reinterpret_cast<char*>(hb.data()), hb.size());
  if (!in_) return Fail(rec.number, rec.offset, Unavailable("read failed"));
  auto h = DecodeRecordHeader(hb);
  if (!h.ok()) return Fail(rec.number, rec.offset, h.status());
  rec.kind = h->kind;
  if (h->number != next_number_) {
    return Fail(rec.number, rec.offset,
                Corrupt(fmt::format("record number {} where {} was expected (records reordered, dropped or from "
                                    "another file)", h->number, next_number_)));
  }
  const uint64_t limit = rec.kind == RecordKind::kFrame ? max_frame_bytes_ : kMaxSealedRecordBytes;
  if (h->body_length > limit) {
    return Fail(rec.number, rec.offset,
                Corrupt(fmt::format("{} record of {} bytes exceeds the {}-byte limit", RecordKindName(rec.kind),
                                    h->body_length, limit)));
  }
  const uint64_t left = size_ - pos_ - kRecordHeaderBytes;
  if (h->body_length > left) {
    return Fail(rec.number, rec.offset,
                Corrupt(fmt::format("{} record of {} bytes, but only {} bytes are left (truncated)",
                                    RecordKindName(rec.kind), h->body_length, left)));
  }
  body_.resize(h->body_length);
  in_.read(reinterpret_cast<char*>(body_.data()), static_cast<std::streamsize>(body_.size()));
  if (!in_) return Fail(rec.number, rec.offset, Unavailable("read failed"));
  pos_ += kRecordHeaderBytes + h->body_length;
  ++next_number_;
  if (rec.kind == RecordKind::kFrame) {
    if (body_.size() < wire::kFrameHeaderBytes + wire::kFrameTagBytes) {
      return Fail(rec.number, rec.offset, Corrupt("frame record shorter than a frame"));
    }
    rec.body = body_;
    return rec;
  }
  auto plain = sealer_->Open(hb, rec.number, body_);
  if (!plain.ok()) {
    return Fail(rec.number, rec.offset,
                Corrupt(fmt::format("{} record: {}{}", RecordKindName(rec.kind), plain.status().message(),
                                    rec.number == 0 && header_.encrypted() ? " (or the key is not this file's)" : "")));
  }
  rec.body = *plain;
  return rec;
}

Result<std::optional<Record>> FileReader::Next() {
  if (ended_) return std::optional<Record>();
  GM_ASSIGN_OR_RETURN(Record rec, Read());
  if (rec.kind == RecordKind::kManifest) return Fail(rec.number, rec.offset, Corrupt("a second manifest"));
  if (rec.kind == RecordKind::kFooter) {
    ended_ = true;
    if (pos_ != size_) {
      return Fail(rec.number, rec.offset,
                  Corrupt(fmt::format("{} bytes follow the footer (appended to, or two files joined)", size_ - pos_)));
    }
  }
  return std::optional<Record>(rec);
}

}  // namespace gpumigrate::ckpt
