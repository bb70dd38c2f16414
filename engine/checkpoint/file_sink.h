// FileSink: where a checkpoint is written. Everything goes to PATH.partial
// (mode 0600: it holds device memory), buffered; Commit() flushes, fsyncs,
// renames it to PATH and fsyncs the folder, so PATH is either the earlier file
// or the complete new one, never a mix. Discard() (and the destructor, unless
// committed) removes the partial file. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpumigrate/common/status.h"

namespace gpumigrate::ckpt {

class FileSink {
 public:
  explicit FileSink(std::string path) : path_(std::move(path)), partial_(path_) { partial_.append(".partial"); }
  ~FileSink() { Discard(); }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  Status Open();
  Status Append(std::span<const std::byte> bytes);
  // Flushes and fdatasyncs what was appended (the pre-copy rounds), so the
  // commit during the stun has only the final delta left to make durable.
  Status Sync();
  Status Commit();
  void Discard();

  uint64_t bytes() const { return bytes_; }  // appended so far
  const std::string& path() const { return path_; }
  const std::string& partial_path() const { return partial_; }

 private:
  Status Flush();

  std::string path_, partial_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t bytes_ = 0;
  uint64_t flushed_ = 0;
  std::vector<std::byte> buf_;
};

}  // namespace gpumigrate::ckpt
