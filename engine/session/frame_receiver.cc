#include "engine/session/frame_receiver.h"

#include <fmt/format.h>

#include "gpumigrate/codec/codec.h"

namespace gpumigrate {

FrameReceiver::FrameReceiver(std::vector<Stream*> streams, const FrameKeys& keys, uint32_t max_payload_bytes,
                             const std::vector<RegionInfo>* regions, ApplyFn apply, Mailbox* box)
    : streams_(std::move(streams)),
      keys_(keys),
      max_payload_(max_payload_bytes),
      regions_(regions),
      apply_(std::move(apply)),
      box_(box),
      frames_(new std::atomic<uint64_t>[streams_.size()]) {
  for (size_t s = 0; s < streams_.size(); ++s) frames_[s] = 0;
}

void FrameReceiver::Start() {
  for (size_t s = 0; s < streams_.size(); ++s) threads_.emplace_back([this, s] { Run(s); });
}

void FrameReceiver::Join() {
  for (auto& t : threads_) t.join();
  threads_.clear();
}

uint64_t FrameReceiver::frames_total() const {
  uint64_t n = 0;
  for (size_t s = 0; s < streams_.size(); ++s) n += frames_[s].load();
  return n;
}

void FrameReceiver::Run(size_t s) {
  std::vector<std::byte> payload, raw;
  FrameDecoder decoder;  // one zstd context per receiving thread
  auto protector = MakeFrameProtector(keys_);
  StreamReader in(*streams_[s]);
  for (uint64_t seq = 0;; ++seq) {
    Status st = ReceiveFrame(s, seq, in, decoder, *protector, payload, raw);
    if (!st.ok()) {
      if (!done_.load()) box_->Fail(st.WithContext(fmt::format("data stream {}, frame {}", s, seq)));
      return;
    }
    frames_[s].fetch_add(1);
    box_->Notify();
  }
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

Status FrameReceiver::ReceiveFrame(size_t s, uint64_t seq, StreamReader& in, FrameDecoder& decoder,
                                   FrameProtector& protector, std::vector<std::byte>& payload,
                                   std::vector<std::byte>& raw) {
  wire::HeaderBytes hb;
  GM_RETURN_IF_ERROR(in.ReadExact(hb));
  GM_ASSIGN_OR_RETURN(wire::FrameHeader h, wire::DecodeHeader(hb));
  GM_RETURN_IF_ERROR(CheckHeader(h, s, seq));
  payload.resize(h.payload_length);
  GM_RETURN_IF_ERROR(in.ReadExact(payload));
  wire::Tag tag;
  GM_RETURN_IF_ERROR(in.ReadExact(tag));
  GM_RETURN_IF_ERROR(protector.Open(hb, h.stream_id, h.sequence, payload, tag));
  const auto codec = static_cast<CodecKind>(h.codec_flags);
  if (codec != CodecKind::kNone) {
    raw.resize(h.raw_length);
    GM_RETURN_IF_ERROR(decoder.Decode(codec, payload, raw));
    GM_RETURN_IF_ERROR(apply_(h, raw));
  } else {
    GM_RETURN_IF_ERROR(apply_(h, payload));
  }
  bytes_ += hb.size() + payload.size() + tag.size();
  return Status::Ok();
}

}  // namespace gpumigrate
