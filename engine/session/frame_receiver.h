// FrameReceiver: the destination's counterpart of FrameSender. Reads data frames
// from every data stream in parallel, one thread per stream; checks each frame's
// header (stream, sequence, lengths, codec, region bounds) before its payload is
// read, authenticates it, decodes it and hands the raw bytes to `apply`. Each
// stream is read through a StreamReader (small frames: one read call for many).
//
// With workers (issue 38 step 4), a stream's thread only receives: a frame
// covering more than kInlineBytes is read into one of a fixed pool of buffers
// (kFramesPerWorker per worker, each at most a frame's payload: memory bounded
// whatever the device size) and a worker opens, decodes and applies it, so the
// destination's CPU work is spread over the workers, not over the streams. A
// stream's thread waits for a free buffer (backpressure to its socket). Small
// frames (the scattered pages of a final round) and device-state frames (which
// must be applied in order) stay on the stream's thread: a hand-off would cost
// a page more than its work. Pages may thus be applied out of their stream's
// order; the destination's per-page round map keeps the newest copy. Without
// workers each stream's thread does it all, as before.
//
// Frames applied are counted per stream as the length of the run of that
// stream's first frames all applied (a frame a worker finished early waits
// for those before it; after a stream's first failure its count stops), so a
// count always means "frames 0..n-1 are on the device", what the session
// waits for and what a resumption tells the source. The first failure, named
// "data stream S, frame N: why", goes to the mailbox, which wakes the session. Start() once; to stop, StopQuietly() (later
// failures go unreported), close the streams, then Join() (the destructor joins
// too): every frame received whole is applied before Join returns, so the
// counts are each stream's first frames (what a resumption tells the source).
// `apply` is called from the receiving threads and the workers, concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include "engine/session/mailbox.h"
#include "engine/session/stream_reader.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"
#include "transport/crypto/frame_protector.h"
#include "transport/wire/frame.h"

namespace gpumigrate {

class FrameReceiver {
 public:
  using ApplyFn = std::function<Status(const wire::FrameHeader& h, std::span<const std::byte> raw)>;

  static constexpr uint64_t kInlineBytes = 64 << 10;  // frames up to this stay on their stream's thread
  static constexpr size_t kFramesPerWorker = 2;        // pooled frame buffers per worker

  // All borrowed pointers (streams, regions, box) must outlive the receiver.
  // `workers` 0: each stream's thread opens and applies its own frames.
  FrameReceiver(std::vector<Stream*> streams, const FrameKeys& keys, uint32_t max_payload_bytes,
                const std::vector<RegionInfo>* regions, ApplyFn apply, Mailbox* box, uint32_t workers = 0);
  ~FrameReceiver() {
    StopQuietly();
    Join();
  }

  // PageDigests frames are accepted (the destination offered a content store);
  // before Start().
  void AcceptDigests() { accept_digests_ = true; }
  void Start();
  void StopQuietly() { done_ = true; }
  void Join();

  uint64_t frames(size_t stream) const { return frames_[stream].load(); }
  uint64_t frames_total() const;
  uint64_t bytes_received() const { return bytes_.load(); }
  uint32_t workers() const { return workers_; }
  // Frames handed to the workers and not yet applied, at most (the pool's size).
  size_t max_in_flight() const { return pool_.size(); }
  size_t most_in_flight() const;  // the most that were at once (tests)

 private:
  // A frame as read off its stream, not yet opened.
  struct Received {
    size_t stream = 0;
    uint64_t seq = 0;
    wire::HeaderBytes hb{};
    wire::FrameHeader h;
    std::vector<std::byte> payload;
    wire::Tag tag{};
  };
  // What one thread needs to open and decode frames.
  struct Opener {
    explicit Opener(const FrameKeys& keys) : protector(MakeFrameProtector(keys)) {}
    FrameDecoder decoder;  // one zstd context per thread
    std::unique_ptr<FrameProtector> protector;
    std::vector<std::byte> raw;
  };

  void Run(size_t s);
  void Work();
  // Reads stream s's frame `seq` and applies it here or hands it to a worker:
  // true to go on; false when it failed here (Applied reported it); an error
  // when reading it failed.
  Result<bool> ReceiveFrame(size_t s, uint64_t seq, StreamReader& in, Opener& op, Received& mine);
  Status OpenAndApply(Received& f, Opener& op);
  void Applied(size_t s, uint64_t seq, const Status& st);
  Received* TakeFree();
  void Release(Received* f);
  bool ToWorkers(const wire::FrameHeader& h) const;
  Status CheckHeader(const wire::FrameHeader& h, size_t s, uint64_t seq) const;

  std::vector<Stream*> streams_;
  FrameKeys keys_;
  uint32_t max_payload_;
  const std::vector<RegionInfo>* regions_;
  ApplyFn apply_;
  Mailbox* box_;
  std::unique_ptr<std::atomic<uint64_t>[]> frames_;  // per stream: its first frames, all applied
  // Per stream, under its lock: frames applied past the count (a worker's
  // finished ahead of an earlier one), and whether one of its frames failed.
  struct Done {
    std::mutex mu;
    std::set<uint64_t> ahead;
    bool failed = false;
  };
  std::unique_ptr<Done[]> done_by_stream_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<bool> done_{false};
  bool accept_digests_ = false;
  std::vector<std::thread> threads_;

  // The workers' side (empty without workers).
  const uint32_t workers_;
  std::vector<std::unique_ptr<Received>> pool_;
  mutable std::mutex mu_;
  std::condition_variable free_cv_, todo_cv_;
  std::vector<Received*> free_;  // under mu_
  std::deque<Received*> todo_;   // under mu_
  size_t most_in_flight_ = 0;    // under mu_
  bool closing_ = false;         // under mu_: the streams' threads are done
  std::vector<std::thread> worker_threads_;
};

}  // namespace gpumigrate
