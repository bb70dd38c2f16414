#include "engine/session/state_stream.h"

#include <algorithm>

#include <fmt/format.h>

namespace gpumigrate {

StateStreamSender::StateStreamSender(Device& dev, FrameSender& sender, uint32_t max_payload_bytes)
    : dev_(dev), sender_(sender), max_payload_(max_payload_bytes) {}

Status StateStreamSender::SendStreamChunk(uint32_t round, size_t n) {
  sender_.PinFirstStream(true);
  Status st = sender_.Send(wire::FrameType::kDeviceState, wire::kDeviceStateRegion, round, offset_,
                           static_cast<uint32_t>(n), std::span<const std::byte>(buf_).first(n));
  sender_.PinFirstStream(false);
  if (st.ok()) offset_ += n;  // the stream position of what the destination has
  return st;
}

// At most this much device state per pre-copy round, whatever the device says
// is pending: a device that overstates it while it keeps dirtying would
// otherwise hold one round open for ever (no RoundEnd, no switchover decision).
constexpr uint64_t kMaxStateBytesPerRound = uint64_t{1} << 30;

Status StateStreamSender::SendAvailable(uint32_t round) {
  if (!dev_.StreamsState()) return Status::Ok();
  buf_.resize(max_payload_);
  const uint64_t budget =
      std::clamp<uint64_t>(dev_.PendingEstimate().precopy_bytes, 1, kMaxStateBytesPerRound);
  for (uint64_t sent = 0; sent < budget;) {
    GM_ASSIGN_OR_RETURN(size_t n, dev_.ReadStateChunk(buf_));
    if (n == 0) break;  // nothing more for now
    GM_RETURN_IF_ERROR(SendStreamChunk(round, n));
    sent += n;
  }
  return Status::Ok();
}

Result<uint64_t> StateStreamSender::SendFinal(uint32_t round) {
  if (!dev_.StreamsState()) return SendBlob(round);
  buf_.resize(max_payload_);
  for (;;) {
    GM_ASSIGN_OR_RETURN(size_t n, dev_.ReadStateChunk(buf_));
    if (n == 0) return offset_;  // the end of the stream
    GM_RETURN_IF_ERROR(SendStreamChunk(round, n));
  }
}

// The blob in frames of at most the payload size; an empty blob is one empty
// frame. All on the first stream: the destination assembles the pieces in order,
// and pieces on different streams could overtake one another.
Result<uint64_t> StateStreamSender::SendBlob(uint32_t round) {
  GM_ASSIGN_OR_RETURN(std::vector<std::byte> blob, dev_.SaveState());
  uint64_t off = 0;
  sender_.PinFirstStream(true);
  Status st;
  do {
    uint64_t n = std::min<uint64_t>(blob.size() - off, max_payload_);
    st = sender_.Send(wire::FrameType::kDeviceState, wire::kDeviceStateRegion, round, off, static_cast<uint32_t>(n),
                      std::span(blob).subspan(off, n));
    off += n;
  } while (st.ok() && off < blob.size());
  sender_.PinFirstStream(false);
  GM_RETURN_IF_ERROR(st);
  return blob.size();
}

Status StateStreamReceiver::Apply(const wire::FrameHeader& h, std::span<const std::byte> payload) {
  std::lock_guard lk(mu_);
  if (streams_) {
    if (h.offset != total_) {
      return Corrupt(fmt::format("device state stream piece at offset {} arrived when {} bytes were written",
                                 h.offset, total_));
    }
    GM_RETURN_IF_ERROR(dev_.WriteStateChunk(payload));
    total_ += payload.size();
    return Status::Ok();
  }
  // A state sent again from its start (a later part of a continued session,
  // an incremental checkpoint) replaces the earlier one.
  if (h.offset == 0) blob_.clear();
  if (h.offset != blob_.size()) {
    return Corrupt(fmt::format("device state piece at offset {} arrived when {} bytes were assembled", h.offset,
                               blob_.size()));
  }
  if (blob_.size() + payload.size() > kMaxBlobBytes) {
    return Corrupt(fmt::format("device state exceeds the {} byte limit", kMaxBlobBytes));
  }
  blob_.insert(blob_.end(), payload.begin(), payload.end());
  return Status::Ok();
}

Status StateStreamReceiver::Finish(uint64_t source_bytes) {
  std::lock_guard lk(mu_);
  const uint64_t have = streams_ ? total_ : blob_.size();
  if (have != source_bytes) {
    return Corrupt(fmt::format("device state is {} bytes, the source sent {}", have, source_bytes));
  }
  return streams_ ? Status::Ok() : dev_.LoadState(blob_);
}

}  // namespace gpumigrate
