// FrameSender: builds data frames (header, sealed payload, tag) and sends them on
// the data streams in parallel, one sending thread per stream.
//
// Send() numbers the frame (per stream, from 0, round-robin over the streams),
// copies it into a buffer of its own, applies the rate cap and queues it for
// its stream's thread, which seals it in place (AES-256-GCM or the integrity
// tag, a protector per stream) and writes it (small frames queued together in
// one write): sealing runs on as many threads
// as there are streams, beside the caller's. Each stream's queue holds at most kLaneBudgetBytes, so memory in
// flight is bounded by streams x budget whatever the device size, and a slow
// receiver or network blocks Send(): backpressure. The first write error is kept
// and returned by every later Send() and by Flush(). Frame counts and byte counts
// are as queued. The owner must Close() the streams before destroying a sender
// whose threads may be blocked in a write. Send/Flush: one thread.
//
// Link() says how the streams are doing: the bytes their peers acknowledged
// so far (Stream::BytesDelivered, where every stream can tell; else the bytes
// written to them) and how long at least one frame has been waiting or being
// written, or Send() waited on the rate cap (busy). A window of samples that is busy throughout measured the link
// (the streams had work all along), not the producer; LinkWatch
// (link_watch.h) reads them.
//
// A Send() or Flush() that waits for room (a slow link) calls the wait hook
// (SetWaitHook) every kWaitHookPeriod, on the caller's thread and under no lock
// of the sender's, so the owner can judge the link while it waits; an error
// from the hook ends the wait and is returned.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "engine/session/rate_limiter.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"
#include "transport/crypto/frame_protector.h"
#include "transport/wire/frame.h"

namespace gpumigrate {

class FrameSender {
 public:
  static constexpr size_t kLaneBudgetBytes = 4 << 20;
  // Frames of at most kBatchFrameBytes queued on one stream are written
  // together, up to kBatchBytes a write.
  static constexpr size_t kBatchFrameBytes = 64 << 10;
  static constexpr size_t kBatchBytes = 256 << 10;
  static constexpr std::chrono::milliseconds kWaitHookPeriod{100};

  // `clock` (for the rate cap) is borrowed and must outlive the sender.
  FrameSender(std::vector<Stream*> streams, const FrameKeys& keys, double rate_limit_bytes_per_s, Clock& clock);
  ~FrameSender();

  Status Send(wire::FrameType type, uint32_t region, uint32_t round, uint64_t offset, uint32_t raw_length,
              std::span<const std::byte> payload, uint8_t codec_flags = 0);
  // Numbers frames on from `frames` (per stream) instead of 0: a session that
  // continues an earlier one. Before the first Send(); false when the stream
  // count differs.
  bool ContinueFrom(const std::vector<uint64_t>& frames);
  // While pinned, frames go on the first stream (so they arrive in the order
  // sent) and the round-robin does not advance.
  void PinFirstStream(bool pin) { pinned_ = pin; }
  // Called while Send() or Flush() waits for room or for the streams (above);
  // empty: none. Set from the thread that calls Send.
  void SetWaitHook(std::function<Status()> hook) { wait_hook_ = std::move(hook); }
  // Waits until every queued frame has been handed to its stream.
  Status Flush();
  // From now on the rate cap is what `rate` holds (bytes/s, 0: unlimited),
  // read before every frame: another thread paces this sender by storing into
  // it. Borrowed; nullptr: the cap given at construction stays.
  void FollowRate(const std::atomic<double>* rate) { live_rate_ = rate; }

  uint64_t bytes_sent() const { return bytes_.load(std::memory_order_relaxed); }  // any thread
  // The stream and sequence number the last Send() gave its frame.
  uint32_t last_stream() const { return last_stream_; }
  uint64_t last_sequence() const { return last_sequence_; }
  const std::vector<uint64_t>& frames_per_stream() const { return frames_; }
  const std::vector<uint64_t>& bytes_per_stream() const { return stream_bytes_; }

  struct LinkSample {
    Clock::TimePoint at{};
    Clock::Duration busy{0};  // time with a frame queued or being written, or waiting on the rate cap, since construction
    uint64_t written = 0;     // bytes the peers acknowledged (or the streams took), since construction
    bool delivered = false;   // `written` is what the peers acknowledged
    // Bytes the streams hold that the link has not taken yet (TCP: written to
    // the socket but not sent, tcpi_notsent_bytes), summed; nullopt where a
    // stream cannot tell. Data waiting there means the link, not the producer,
    // sets the pace, even when no frame waits in the sender itself.
    std::optional<uint64_t> unsent;
  };
  LinkSample Link();  // any thread

 private:
  struct Queued {
    std::vector<std::byte> frame;  // header, payload (sealed by the lane), tag
    uint64_t sequence = 0;
  };
  struct Lane {
    Stream* stream = nullptr;
    std::unique_ptr<FrameProtector> protector;
    std::deque<Queued> queue;
    size_t queued_bytes = 0;
    bool busy = false;
    std::condition_variable cv;  // its queue has a frame, or stop_ (with mu_)
    std::thread thread;
  };
  void Run(size_t lane);
  // Waits on cv_ until `ready`, calling the wait hook every kWaitHookPeriod (with
  // lk released); an error from the hook ends the wait.
  template <class Pred>
  Status WaitCallingHook(std::unique_lock<std::mutex>& lk, Pred ready);

  std::vector<uint64_t> frames_;  // == next sequence number per stream
  uint32_t last_stream_ = 0;
  uint64_t last_sequence_ = 0;
  std::vector<uint64_t> stream_bytes_;
  size_t next_stream_ = 0;
  bool pinned_ = false;
  std::function<Status()> wait_hook_;
  std::atomic<uint64_t> bytes_{0};
  RateLimiter limiter_;
  const std::atomic<double>* live_rate_ = nullptr;
  Clock& clock_;

  std::mutex mu_;
  std::condition_variable cv_;  // a lane finished a frame (for Send's room and Flush), with mu_
  size_t waiting_ = 0;          // under mu_: threads waiting on cv_
  std::vector<Lane> lanes_;
  // Under mu_: buffers of frames written, reused by Send (at most
  // kSparePerLane per stream: about what a lane's budget holds in 1 MiB frames).
  static constexpr size_t kSparePerLane = kLaneBudgetBytes / (1 << 20) + 2;
  std::vector<std::vector<std::byte>> spare_;
  Status error_;
  bool stop_ = false;
  // Under mu_: frames queued or being written, since when that count is non-zero,
  // the busy time before then, and the bytes written.
  size_t in_flight_ = 0;
  Clock::TimePoint busy_since_{};
  Clock::Duration busy_{0};
  // Time Send() waited on the rate cap (the emulated link's pace), and since
  // when it waits now.
  Clock::Duration capped_{0};
  Clock::TimePoint capped_since_{};
  bool capping_ = false;
  uint64_t written_ = 0;
};

}  // namespace gpumigrate
