// In-memory Stream pair: two bounded byte rings guarded by one mutex each.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "gpumigrate/common/stream.h"

namespace gpumigrate {
namespace {

// One direction of a pipe. Closing it wakes every waiter on either side.
class Channel {
 public:
  explicit Channel(size_t capacity) : buf_(capacity) {}

  Status Write(std::span<const std::byte> data, const std::string& name) {
    std::unique_lock lock(mu_);
    size_t done = 0;
    while (done < data.size()) {
      cv_.wait(lock, [&] { return closed_ || size_ < buf_.size(); });
      if (closed_) {
        return Unavailable(fmt::format("{}: write failed: stream closed after {} of {} bytes", name, done,
                                       data.size()));
      }
      size_t n = std::min(data.size() - done, buf_.size() - size_);
      size_t tail = (head_ + size_) % buf_.size();
      size_t first = std::min(n, buf_.size() - tail);
      std::memcpy(buf_.data() + tail, data.data() + done, first);
      std::memcpy(buf_.data(), data.data() + done + first, n - first);
      size_ += n;
      done += n;
      cv_.notify_all();
    }
    return Status::Ok();
  }

  Status Read(std::span<std::byte> out, const std::string& name) {
    std::unique_lock lock(mu_);
    size_t done = 0;
    while (done < out.size()) {
      cv_.wait(lock, [&] { return size_ > 0 || closed_; });
      if (size_ == 0 && closed_) {
        return Unavailable(fmt::format("{}: read failed: stream closed after {} of {} bytes", name, done,
                                       out.size()));
      }
      size_t n = std::min(out.size() - done, size_);
      size_t first = std::min(n, buf_.size() - head_);
      std::memcpy(out.data() + done, buf_.data() + head_, first);
      std::memcpy(out.data() + done + first, buf_.data(), n - first);
      head_ = (head_ + n) % buf_.size();
      size_ -= n;
      done += n;
      cv_.notify_all();
    }
    return Status::Ok();
  }

  // drop_buffered=false: bytes already written stay readable, then EOF.
  void Close(bool drop_buffered) {
    std::lock_guard lock(mu_);
    closed_ = true;
    if (drop_buffered) size_ = 0;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::byte> buf_;
  size_t head_ = 0;
  size_t size_ = 0;
  bool closed_ = false;
};

class PipeEnd final : public Stream {
 public:
  PipeEnd(std::string name, std::shared_ptr<Channel> in, std::shared_ptr<Channel> out)
      : name_(std::move(name)), in_(std::move(in)), out_(std::move(out)) {}
  ~PipeEnd() override { Close(); }
  std::string Name() const override { return name_; }
  Status WriteAll(std::span<const std::byte> data) override { return out_->Write(data, name_); }
  Status ReadExact(std::span<std::byte> out) override { return in_->Read(out, name_); }
  // Like closing a TCP socket: the peer still reads what we wrote, then EOF;
  // our own pending reads fail at once and the peer's writes fail.
  void Close() override {
    out_->Close(false);
    in_->Close(true);
  }
  // Abortive: what the peer has not read yet is dropped too.
  void Reset() override {
    out_->Close(true);
    in_->Close(true);
  }

 private:
  std::string name_;
  std::shared_ptr<Channel> in_;
  std::shared_ptr<Channel> out_;
};

}  // namespace

std::pair<std::unique_ptr<Stream>, std::unique_ptr<Stream>> MakePipe(std::string name, size_t capacity_bytes) {
  auto a_to_b = std::make_shared<Channel>(capacity_bytes);
  auto b_to_a = std::make_shared<Channel>(capacity_bytes);
  return {std::make_unique<PipeEnd>(name + "[a]", b_to_a, a_to_b),
          std::make_unique<PipeEnd>(name + "[b]", a_to_b, b_to_a)};
}

}  // namespace gpumigrate
