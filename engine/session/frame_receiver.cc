#include "engine/session/frame_receiver.h"

#include <algorithm>

#include <fmt/format.h>

#include "gpumigrate/codec/codec.h"
#include "gpumigrate/session/session.h"

namespace gpumigrate {

FrameReceiver::FrameReceiver(std::vector<Stream*> streams, const FrameKeys& keys, uint32_t max_payload_bytes,
                             const std::vector<RegionInfo>* regions, ApplyFn apply, Mailbox* box, uint32_t workers)
    : streams_(std::move(streams)),
      keys_(keys),
      max_payload_(max_payload_bytes),
      regions_(regions),
      apply_(std::move(apply)),
      box_(box),
      frames_(new std::atomic<uint64_t>[streams_.size()]),
      done_by_stream_(new Done[streams_.size()]),
      workers_(workers) {
  for (size_t s = 0; s < streams_.size(); ++s) frames_[s] = 0;
  for (size_t i = 0; i < size_t{workers_} * kFramesPerWorker; ++i) {
    pool_.push_back(std::make_unique<Received>());
    free_.push_back(pool_.back().get());
  }
}

void FrameReceiver::Start() {
  for (uint32_t w = 0; w < workers_; ++w) worker_threads_.emplace_back([this] { Work(); });
  for (size_t s = 0; s < streams_.size(); ++s) threads_.emplace_back([this, s] { Run(s); });
}

// The streams' threads first; then the workers apply what they were handed and end.
void FrameReceiver::Join() {
  for (auto& t : threads_) t.join();
  threads_.clear();
  {
    std::lock_guard lk(mu_);
    closing_ = true;
  }
  todo_cv_.notify_all();
  for (auto& t : worker_threads_) t.join();
  worker_threads_.clear();
}

uint64_t FrameReceiver::frames_total() const {
  uint64_t n = 0;
  for (size_t s = 0; s < streams_.size(); ++s) n += frames_[s].load();
  return n;
}

size_t FrameReceiver::most_in_flight() const {
  std::lock_guard lk(mu_);
  return most_in_flight_;
}

void FrameReceiver::Run(size_t s) {
  Opener op(keys_);
  Received mine;  // a frame this thread applies itself
  StreamReader in(*streams_[s]);
  for (uint64_t seq = 0;; ++seq) {
    Result<bool> go_on = ReceiveFrame(s, seq, in, op, mine);
    if (!go_on.ok()) {
      // Reading frame `seq` failed (the stream broke or the frame is bad):
      // those before it stay good and are counted as they are applied.
      if (!done_.load()) box_->Fail(go_on.status().WithContext(fmt::format("data stream {}, frame {}", s, seq)));
      return;
    }
    if (!*go_on) return;  // applied here and failed: Applied reported it
  }
}

void FrameReceiver::Applied(size_t s, uint64_t seq, const Status& st) {
  Done& d = done_by_stream_[s];
  {
    std::lock_guard lk(d.mu);
    if (!st.ok()) {
      d.failed = true;  // the count stops before this frame for good
    } else if (!d.failed) {
      uint64_t n = frames_[s].load();
      if (seq != n) {
        d.ahead.insert(seq);
        return;  // counted once the frames before it are
      }
      ++n;
      while (!d.ahead.empty() && *d.ahead.begin() == n) {
        d.ahead.erase(d.ahead.begin());
        ++n;
      }
      frames_[s].store(n);
    }
  }
  if (!st.ok()) {
    if (!done_.load()) box_->Fail(st.WithContext(fmt::format("data stream {}, frame {}", s, seq)));
    return;
  }
  box_->Notify();
}

void FrameReceiver::Work() {
  Opener op(keys_);
  for (;;) {
    Received* f = nullptr;
    {
      std::unique_lock lk(mu_);
      todo_cv_.wait(lk, [&] { return !todo_.empty() || closing_; });
      if (todo_.empty()) return;
      f = todo_.front();
      todo_.pop_front();
    }
    const size_t s = f->stream;
    const uint64_t seq = f->seq;
    Status st = OpenAndApply(*f, op);
    Release(f);
    Applied(s, seq, st);
  }
}

FrameReceiver::Received* FrameReceiver::TakeFree() {
  std::unique_lock lk(mu_);
  free_cv_.wait(lk, [&] { return !free_.empty(); });
  Received* f = free_.back();
  free_.pop_back();
  most_in_flight_ = std::max(most_in_flight_, pool_.size() - free_.size());
  return f;
}

void FrameReceiver::Release(Received* f) {
  {
    std::lock_guard lk(mu_);
    free_.push_back(f);
  }
  free_cv_.notify_one();
}

// Large page, zero and digest frames go to the workers; device state (applied
// in order) and small frames stay.
bool FrameReceiver::ToWorkers(const wire::FrameHeader& h) const {
  return workers_ > 0 && h.type != wire::FrameType::kDeviceState && h.raw_length > kInlineBytes;
}

// Everything about a frame is checked before its payload is read or applied.
Status FrameReceiver::CheckHeader(const wire::FrameHeader& h, size_t s, uint64_t seq) const {
  if (h.stream_id != s) return Corrupt(fmt::format("frame claims stream {}", h.stream_id));
  if (h.sequence != seq) {
    return Corrupt(fmt::format("sequence {} where {} was expected (replayed, dropped or reordered frame)", h.sequence, seq));
  }
  if (h.payload_length > max_payload_) {
    return Corrupt(fmt::format("payload length {} exceeds the negotiated {} bytes", h.payload_length, max_payload_));
  }
  GM_ASSIGN_OR_RETURN(const CodecKind codec, CodecFromFlags(h.codec_flags));
  if (codec != CodecKind::kNone && h.type != wire::FrameType::kPages) {
    return Corrupt(fmt::format("{} frame carries codec flags 0x{:x}", wire::FrameTypeName(h.type), h.codec_flags));
  }
  if (h.raw_length > max_payload_) {
    return Corrupt(fmt::format("raw length {} exceeds the negotiated {} bytes", h.raw_length, max_payload_));
  }
  if (h.type == wire::FrameType::kDeviceState) {
    if (h.region != wire::kDeviceStateRegion || h.raw_length != h.payload_length) {
      return Corrupt("malformed device-state frame");
    }
    return Status::Ok();
  }
  const RegionInfo* r = FindRegion(*regions_, h.region);
  if (r == nullptr) return Corrupt(fmt::format("region {} does not exist", h.region));
  if (h.offset % r->page_size != 0) return Corrupt(fmt::format("offset {} is not page aligned", h.offset));
  if (h.raw_length == 0 || h.offset > r->size_bytes || h.raw_length > r->size_bytes - h.offset) {
    return Corrupt(fmt::format("[{}, +{}) is outside region {} ({} bytes)", h.offset, h.raw_length, r->name,
                               r->size_bytes));
  }
  if (h.raw_length % r->page_size != 0 && h.offset + h.raw_length != r->size_bytes) {
    return Corrupt(fmt::format("length {} is not whole pages", h.raw_length));
  }
  uint32_t want_payload = h.type == wire::FrameType::kPages ? h.raw_length : 0;
  if (h.type == wire::FrameType::kPageDigests) {
    if (!accept_digests_) return Corrupt("a PAGE_DIGESTS frame, but this destination offered no content store");
    if (h.raw_length % r->page_size != 0) return Corrupt(fmt::format("digests for {} bytes: not whole pages", h.raw_length));
    want_payload = h.raw_length / r->page_size * 32;
  }
  if (codec != CodecKind::kNone && h.payload_length == 0) return Corrupt("compressed frame has an empty payload");
  if (codec == CodecKind::kNone && h.payload_length != want_payload) {
    return Corrupt(fmt::format("{} frame has payload length {}, expected {}", wire::FrameTypeName(h.type),
                               h.payload_length, want_payload));
  }
  return Status::Ok();
}

Result<bool> FrameReceiver::ReceiveFrame(size_t s, uint64_t seq, StreamReader& in, Opener& op, Received& mine) {
  wire::HeaderBytes hb;
  GM_RETURN_IF_ERROR(in.ReadExact(hb));
  GM_ASSIGN_OR_RETURN(wire::FrameHeader h, wire::DecodeHeader(hb));
  GM_RETURN_IF_ERROR(CheckHeader(h, s, seq));
  const bool handed = ToWorkers(h);
  Received& f = handed ? *TakeFree() : mine;
  f.stream = s;
  f.seq = seq;
  f.hb = hb;
  f.h = h;
  f.payload.resize(h.payload_length);
  Status read = in.ReadExact(f.payload);
  if (read.ok()) read = in.ReadExact(f.tag);
  if (!read.ok()) {
    if (handed) Release(&f);
    return read;
  }
  bytes_ += hb.size() + f.payload.size() + f.tag.size();
  if (!handed) {
    Status applied = OpenAndApply(f, op);
    Applied(s, seq, applied);
    return applied.ok();
  }
  {
    std::lock_guard lk(mu_);
    todo_.push_back(&f);
  }
  todo_cv_.notify_one();
  return true;
}

Status FrameReceiver::OpenAndApply(Received& f, Opener& op) {
  const wire::FrameHeader& h = f.h;
  GM_RETURN_IF_ERROR(op.protector->Open(f.hb, h.stream_id, h.sequence, f.payload, f.tag));
  const auto codec = static_cast<CodecKind>(h.codec_flags);
  if (codec == CodecKind::kNone) return apply_(h, f.payload);
  op.raw.resize(h.raw_length);
  GM_RETURN_IF_ERROR(op.decoder.Decode(codec, f.payload, op.raw));
  return apply_(h, op.raw);
}

uint32_t DefaultDestinationWorkers(uint32_t cores, uint32_t streams) {
  if (cores <= streams) return 0;
  return std::min<uint32_t>(cores - streams, 8);
}

}  // namespace gpumigrate
