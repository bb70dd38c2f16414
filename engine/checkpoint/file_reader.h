// FileReader: reads a checkpoint file record by record and checks what can be
// checked without a device: the header (magic, checksum, version, flags), each
// record header (magic, checksum, kind, consecutive numbers, lengths against
// the limits and the file's size, all before anything is allocated), each sealed
// record's tag, the manifest first and the footer last with nothing after it.
// Frames are handed on verbatim: the destination session checks them. Every
// error names the file, the record and its byte offset.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint.pb.h"
#include "engine/checkpoint/file_format.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::ckpt {

struct Record {
  RecordKind kind = RecordKind::kInvalid;
  uint64_t number = 0;
  uint64_t offset = 0;          // of the record header in the file
  std::span<std::byte> body;    // frames: the frame; others: the opened plaintext
};

class FileReader {
 public:
  // Opens the file, checks its header, derives its keys and reads record 0, the
  // manifest. With `header_only` it stops after the header (an encrypted file
  // read without a key).
  static Result<std::unique_ptr<FileReader>> Open(const std::string& path, const std::optional<FileKey>& key,
                                                  bool header_only = false);

  const std::string& path() const { return path_; }
  const FileHeader& header() const { return header_; }
  const FileKeys& keys() const { return keys_; }
  const wire::v1::CheckpointManifest& manifest() const { return manifest_; }
  uint64_t file_bytes() const { return size_; }

  // The next record after the manifest; nullopt after the footer (the file
  // ended where it should). A file that ends before its footer is refused.
  Result<std::optional<Record>> Next();

  // "PATH: record N at byte O"
  std::string Where(uint64_t number, uint64_t offset) const;

 private:
  FileReader() = default;
  Result<Record> Read();
  Status Fail(uint64_t number, uint64_t offset, const Status& st) const;

  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
  uint64_t pos_ = 0;
  uint64_t next_number_ = 0;
  bool ended_ = false;
  FileHeader header_;
  FileKeys keys_;
  std::unique_ptr<RecordSealer> sealer_;
  wire::v1::CheckpointManifest manifest_;
  uint64_t max_frame_bytes_ = 0;
  std::vector<std::byte> body_;
};

}  // namespace gpumigrate::ckpt
