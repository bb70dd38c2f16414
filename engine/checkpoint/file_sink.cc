#include "engine/checkpoint/file_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

namespace gpumigrate::ckpt {
namespace {
constexpr size_t kBufferBytes = 4 << 20;
}

Status FileSink::Open() {
  fd_ = ::open(partial_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd_ < 0) return Unavailable(fmt::format("create {}: {}", partial_, std::strerror(errno)));
  buf_.reserve(kBufferBytes);
  return Status::Ok();
}

Status FileSink::Flush() {
  size_t done = 0;
  while (done < buf_.size()) {
    ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Unavailable(fmt::format("write {} at byte {}: {}", partial_, flushed_ + done,
                                     n < 0 ? std::strerror(errno) : "no progress"));
    }
    done += static_cast<size_t>(n);
  }
  flushed_ += buf_.size();
  buf_.clear();
  return Status::Ok();
}

Status FileSink::Append(std::span<const std::byte> bytes) {
  if (fd_ < 0) return FailedPrecondition(fmt::format("{} is not open", partial_));
  while (!bytes.empty()) {
    size_t n = std::min(bytes.size(), kBufferBytes - buf_.size());
    buf_.insert(buf_.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    bytes = bytes.subspan(n);
    bytes_ += n;
    if (buf_.size() == kBufferBytes) GM_RETURN_IF_ERROR(Flush());
  }
  return Status::Ok();
}

Status FileSink::Sync() {
  GM_RETURN_IF_ERROR(Flush());
  if (::fdatasync(fd_) != 0) return Unavailable(fmt::format("fdatasync {}: {}", partial_, std::strerror(errno)));
  return Status::Ok();
}

Status FileSink::Commit() {
  GM_RETURN_IF_ERROR(Flush());
  if (::fsync(fd_) != 0) return Unavailable(fmt::format("fsync {}: {}", partial_, std::strerror(errno)));
  if (::close(fd_) != 0) {
    fd_ = -1;
    return Unavailable(fmt::format("close {}: {}", partial_, std::strerror(errno)));
  }
  fd_ = -1;
  if (::rename(partial_.c_str(), path_.c_str()) != 0) {
    return Unavailable(fmt::format("rename {} to {}: {}", partial_, path_, std::strerror(errno)));
  }
  committed_ = true;
  // The rename itself must survive a crash: fsync the folder that holds it.
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = std::filesystem::path(".");
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Unavailable(fmt::format("open folder {}: {}", dir.string(), std::strerror(errno)));
  int rc = ::fsync(dfd);
  int err = errno;
  ::close(dfd);
  if (rc != 0) return Unavailable(fmt::format("fsync folder {}: {}", dir.string(), std::strerror(err)));
  return Status::Ok();
}

void FileSink::Discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !partial_.empty()) {
    ::unlink(partial_.c_str());
    partial_.clear();  // once
  }
}

}  // namespace gpumigrate::ckpt
