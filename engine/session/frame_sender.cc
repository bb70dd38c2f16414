#include "engine/session/frame_sender.h"

#include <cstring>

#include <fmt/format.h>

namespace gpumigrate {

FrameSender::FrameSender(std::vector<Stream*> streams, const FrameKeys& keys, double rate_limit_bytes_per_s,
                         Clock& clock)
    : frames_(streams.size(), 0),
      stream_bytes_(streams.size(), 0),
      limiter_(rate_limit_bytes_per_s, clock),
      clock_(clock),
      lanes_(streams.size()) {
  for (size_t i = 0; i < streams.size(); ++i) {
    lanes_[i].stream = streams[i];
    lanes_[i].protector = MakeFrameProtector(keys);
  }
  for (size_t i = 0; i < streams.size(); ++i) lanes_[i].thread = std::thread([this, i] { Run(i); });
}

FrameSender::~FrameSender() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    for (auto& l : lanes_) l.cv.notify_one();
  }
  for (auto& l : lanes_) l.thread.join();
}

bool FrameSender::ContinueFrom(const std::vector<uint64_t>& frames) {
  if (frames.size() != frames_.size()) return false;
  frames_ = frames;
  return true;
}

void FrameSender::Run(size_t i) {
  Lane& lane = lanes_[i];
  std::vector<Queued> batch;
  std::vector<std::byte> staging;  // small frames written together
  std::unique_lock lk(mu_);
  while (true) {
    lane.cv.wait(lk, [&] { return stop_ || !lane.queue.empty(); });
    if (lane.queue.empty()) return;  // stopping, nothing left
    // Small frames queued together (a final round of single pages) go in one
    // write: a system call and a TCP segment per 4 KiB page cost more than
    // copying them side by side. A large frame goes alone, as it is.
    batch.clear();
    size_t bytes = 0;
    do {
      bytes += lane.queue.front().frame.size();
      batch.push_back(std::move(lane.queue.front()));
      lane.queue.pop_front();
    } while (!lane.queue.empty() && batch.front().frame.size() <= kBatchFrameBytes &&
             lane.queue.front().frame.size() <= kBatchFrameBytes &&
             bytes + lane.queue.front().frame.size() <= kBatchBytes);
    lane.busy = true;
    const bool failed = !error_.ok();  // read under the lock: Send() and the other lanes write it
    lk.unlock();
    Status st;
    if (!failed) {
      for (Queued& q : batch) {
        std::vector<std::byte>& frame = q.frame;
        const size_t payload = frame.size() - wire::kFrameHeaderBytes - wire::kFrameTagBytes;
        wire::Tag tag;
        st = lane.protector->SealInPlace(std::span<const std::byte>(frame).first(wire::kFrameHeaderBytes),
                                         static_cast<uint32_t>(i), q.sequence,
                                         std::span<std::byte>(frame).subspan(wire::kFrameHeaderBytes, payload), tag);
        if (!st.ok()) break;
        std::memcpy(frame.data() + wire::kFrameHeaderBytes + payload, tag.data(), tag.size());
      }
      if (st.ok() && batch.size() == 1) {
        st = lane.stream->WriteAll(batch.front().frame);
      } else if (st.ok()) {
        staging.clear();
        for (const Queued& q : batch) staging.insert(staging.end(), q.frame.begin(), q.frame.end());
        st = lane.stream->WriteAll(staging);
      }
    }
    lk.lock();
    lane.busy = false;
    for (Queued& q : batch) {
      lane.queued_bytes -= q.frame.size();
      if (!failed && st.ok()) written_ += q.frame.size();
      if (--in_flight_ == 0) busy_ += clock_.Now() - busy_since_;
      if (spare_.size() < kSparePerLane * lanes_.size()) spare_.push_back(std::move(q.frame));
    }
    if (!st.ok() && error_.ok()) {
      const uint64_t first = batch.front().sequence, last = batch.back().sequence;
      error_ = st.WithContext(first == last ? fmt::format("data stream {}: send frame {}", i, first)
                                            : fmt::format("data stream {}: send frames {}-{}", i, first, last));
    }
    // Only a Send waiting for room or a Flush waits on cv_: a wake-up per frame
    // for nobody cost a futex call and a context switch per page on small frames.
    if (waiting_ > 0) cv_.notify_all();
  }
}

Status FrameSender::Send(wire::FrameType type, uint32_t region, uint32_t round, uint64_t offset,
                         uint32_t raw_length, std::span<const std::byte> payload, uint8_t codec_flags) {
  size_t s = pinned_ ? 0 : next_stream_;
  if (!pinned_) next_stream_ = (next_stream_ + 1) % lanes_.size();
  wire::FrameHeader h;
  h.type = type;
  h.codec_flags = codec_flags;
  h.stream_id = static_cast<uint32_t>(s);
  h.region = region;
  h.sequence = frames_[s];
  h.round = round;
  h.offset = offset;
  h.raw_length = raw_length;
  h.payload_length = static_cast<uint32_t>(payload.size());
  auto header = wire::EncodeHeader(h);
  // One contiguous buffer per frame (both protectors keep the payload's length):
  // the stream's thread seals it in place and owns it until written, then
  // hands it back for a later frame (a fresh megabyte per frame cost a page
  // fault per 4 KiB and a zero fill).
  std::vector<std::byte> frame;
  {
    std::lock_guard lk(mu_);
    if (!spare_.empty()) {
      frame = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  frame.resize(header.size() + payload.size() + wire::kFrameTagBytes);
  std::memcpy(frame.data(), header.data(), header.size());
  if (!payload.empty()) std::memcpy(frame.data() + header.size(), payload.data(), payload.size());
  const uint64_t total = frame.size();
  if (live_rate_ != nullptr) {
    const double r = live_rate_->load(std::memory_order_relaxed);
    if (r != limiter_.rate()) limiter_.SetRate(r);
  }
  // The rate cap (an emulated slower link): its wait is the link's, so it
  // counts as busy time, and the wait hook is called during it as during a
  // wait for room.
  if (limiter_.enabled()) {
    const Clock::TimePoint until = limiter_.Reserve(static_cast<double>(total));
    {
      std::lock_guard lk(mu_);
      capped_since_ = clock_.Now();
      capping_ = true;
    }
    Status hook;
    for (Clock::TimePoint now = clock_.Now(); now < until && hook.ok(); now = clock_.Now()) {
      clock_.SleepUntil(std::min<Clock::TimePoint>(until, now + kWaitHookPeriod));
      if (wait_hook_ && clock_.Now() < until) hook = wait_hook_();
    }
    {
      std::lock_guard lk(mu_);
      capped_ += clock_.Now() - capped_since_;
      capping_ = false;
    }
    GM_RETURN_IF_ERROR(hook);
  }
  {
    std::unique_lock lk(mu_);
    Lane& lane = lanes_[s];
    // Backpressure: wait for room in this stream's budget (a frame larger than the
    // budget goes alone).
    GM_RETURN_IF_ERROR(WaitCallingHook(lk, [&] {
      return !error_.ok() || lane.queued_bytes == 0 || lane.queued_bytes + total <= kLaneBudgetBytes;
    }));
    if (!error_.ok()) return error_;
    lane.queued_bytes += total;
    if (in_flight_++ == 0) busy_since_ = clock_.Now();
    lane.queue.push_back(Queued{std::move(frame), frames_[s]});
    lane.cv.notify_one();
  }
  last_stream_ = static_cast<uint32_t>(s);
  last_sequence_ = frames_[s];
  ++frames_[s];
  bytes_ += total;
  stream_bytes_[s] += total;
  return Status::Ok();
}

FrameSender::LinkSample FrameSender::Link() {
  // What the peers acknowledged, where every stream can tell (TCP): a socket's
  // buffers take megabytes at once, which says nothing of the link's rate.
  uint64_t delivered = 0, unsent = 0;
  bool all = true, all_unsent = true;
  for (const Lane& l : lanes_) {
    auto d = l.stream->BytesDelivered();
    if (!d) all = false;
    delivered += d.value_or(0);
    auto u = l.stream->BytesUnsent();
    if (!u) all_unsent = false;
    unsent += u.value_or(0);
  }
  std::lock_guard lk(mu_);
  LinkSample s;
  s.at = clock_.Now();
  s.busy = busy_ + capped_ + (in_flight_ > 0 ? s.at - busy_since_ : Clock::Duration{0}) +
           (capping_ ? s.at - capped_since_ : Clock::Duration{0});
  s.written = all ? delivered : written_;
  s.delivered = all;
  if (all_unsent) s.unsent = unsent;
  return s;
}

Status FrameSender::Flush() {
  std::unique_lock lk(mu_);
  GM_RETURN_IF_ERROR(WaitCallingHook(lk, [&] {
    if (!error_.ok()) return true;
    for (const auto& l : lanes_) {
      if (!l.queue.empty() || l.busy) return false;
    }
    return true;
  }));
  return error_;
}

template <class Pred>
Status FrameSender::WaitCallingHook(std::unique_lock<std::mutex>& lk, Pred ready) {
  if (ready()) return Status::Ok();
  ++waiting_;  // under mu_: the lanes wake cv_ only while someone waits here
  struct Done {
    size_t& n;
    ~Done() { --n; }  // lk is held again whenever this runs (the wait re-locks)
  } done{waiting_};
  if (!wait_hook_) {
    cv_.wait(lk, ready);
    return Status::Ok();
  }
  while (!cv_.wait_for(lk, kWaitHookPeriod, ready)) {
    lk.unlock();
    Status st = wait_hook_();
    lk.lock();
    GM_RETURN_IF_ERROR(st);
  }
  return Status::Ok();
}

}  // namespace gpumigrate
