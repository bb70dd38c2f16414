#include "engine/session/frame_sender.h"

#include <fmt/format.h>

namespace gpumigrate {

Status FrameSender::Send(wire::FrameType type, uint32_t region, uint32_t round, uint64_t offset,
                         uint32_t raw_length, std::span<const std::byte> payload, uint8_t codec_flags) {
  size_t s = next_stream_;
  next_stream_ = (next_stream_ + 1) % streams_.size();
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
  wire::Tag tag;
  GM_ASSIGN_OR_RETURN(std::span<const std::byte> wire_payload,
                      protector_->Seal(header, h.stream_id, h.sequence, payload, sealed_, tag));
  payload = wire_payload;
  uint64_t total = header.size() + payload.size() + tag.size();
  limiter_.Acquire(static_cast<double>(total));
  Stream& out = *streams_[s];
  auto ctx = [&] { return fmt::format("data stream {}: send frame {}", s, h.sequence); };
  GM_RETURN_IF_ERROR(out.WriteAll(header).WithContext(ctx()));
  if (!payload.empty()) GM_RETURN_IF_ERROR(out.WriteAll(payload).WithContext(ctx()));
  GM_RETURN_IF_ERROR(out.WriteAll(tag).WithContext(ctx()));
  ++frames_[s];
  bytes_ += total;
  stream_bytes_[s] += total;
  return Status::Ok();
}

}  // namespace gpumigrate
