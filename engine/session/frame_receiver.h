// FrameReceiver: the destination's counterpart of FrameSender. Reads data frames
// from every data stream in parallel, one thread per stream; checks each frame's
// header (stream, sequence, lengths, codec, region bounds) before its payload is
// read, authenticates it, decodes it and hands the raw bytes to `apply`. Each
// stream is read through a StreamReader (small frames: one read call for many).
//
// Frames applied are counted per stream (so the session can wait for a round's
// frames); the first failure, named "data stream S, frame N: why", goes to the
// mailbox, which wakes the session. Start() once; to stop, StopQuietly() (later
// failures go unreported), close the streams, then Join() (the destructor joins
// too). `apply` is called from the receiving threads, concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
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

  // All borrowed pointers (streams, regions, box) must outlive the receiver.
  FrameReceiver(std::vector<Stream*> streams, const FrameKeys& keys, uint32_t max_payload_bytes,
                const std::vector<RegionInfo>* regions, ApplyFn apply, Mailbox* box);
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

 private:
  void Run(size_t s);
  Status ReceiveFrame(size_t s, uint64_t seq, StreamReader& in, FrameDecoder& decoder, FrameProtector& protector,
                      std::vector<std::byte>& payload, std::vector<std::byte>& raw);
  Status CheckHeader(const wire::FrameHeader& h, size_t s, uint64_t seq) const;

  std::vector<Stream*> streams_;
  FrameKeys keys_;
  uint32_t max_payload_;
  const std::vector<RegionInfo>* regions_;
  ApplyFn apply_;
  Mailbox* box_;
  std::unique_ptr<std::atomic<uint64_t>[]> frames_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<bool> done_{false};
  bool accept_digests_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace gpumigrate
