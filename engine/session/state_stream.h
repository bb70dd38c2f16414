// The device's own state on the wire: kDeviceState frames whose offset is the
// byte's position in the state.
//
// A blob device (sim, proc) is saved whole in the stun (SaveState) and sent in
// frames of at most the payload size; the destination assembles it (a piece at
// offset 0 starts it again) and loads it at Prepare. A streaming device (vfio:
// Device::StreamsState()) is never held whole on either side: the source sends
// what it offers in each pre-copy round and reads the rest to the end in the
// stun, one frame-sized buffer at a time; the destination writes each frame
// straight to the device. Its frames all go on the first data stream, so they
// arrive in order; one whose offset is not the running total is refused, and at
// Prepare the total must be what the source counted.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "engine/session/frame_sender.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"
#include "transport/wire/frame.h"

namespace gpumigrate {

class StateStreamSender {
 public:
  // Borrowed: `dev` and `sender` outlive this.
  StateStreamSender(Device& dev, FrameSender& sender, uint32_t max_payload_bytes);

  // A pre-copy round: a streaming device's available state, at most about what
  // it reported pending when the round began (one read at least, so a device
  // that under-reports still drains). Nothing for a blob device.
  Status SendAvailable(uint32_t round);
  // The stun: the stream to its end, or the blob. Returns the state's total
  // size in bytes (Prepare.device_state_bytes).
  Result<uint64_t> SendFinal(uint32_t round);

 private:
  Status SendStreamChunk(uint32_t round, size_t n);
  Result<uint64_t> SendBlob(uint32_t round);

  Device& dev_;
  FrameSender& sender_;
  uint32_t max_payload_;
  uint64_t offset_ = 0;  // streamed bytes sent so far
  std::vector<std::byte> buf_;
};

class StateStreamReceiver {
 public:
  // A blob larger than this is refused (a stream has no such limit).
  static constexpr uint64_t kMaxBlobBytes = 64 << 20;

  explicit StateStreamReceiver(Device& dev) : dev_(dev), streams_(dev.StreamsState()) {}
  // One kDeviceState frame; called from the receiving threads.
  Status Apply(const wire::FrameHeader& h, std::span<const std::byte> payload);
  // At Prepare, after every frame: checks the size the source counted and
  // loads a blob.
  Status Finish(uint64_t source_bytes);

 private:
  Device& dev_;
  const bool streams_;
  std::mutex mu_;
  uint64_t total_ = 0;  // bytes written to a streaming device
  std::vector<std::byte> blob_;
};

}  // namespace gpumigrate
