#include "engine/checkpoint/recorder.h"

#include <cstring>

#include <fmt/format.h>

#include "gpumigrate/codec/codec.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate::ckpt {

namespace v1 = wire::v1;

namespace {
// Page hashes per index record: 2 Mi hashes (16 MiB) at most.
constexpr size_t kHashesPerIndexRecord = 2u << 20;
}  // namespace

Recorder::Recorder(FileSink* sink, const FileHeader& header, const FileKeys& keys, v1::CheckpointManifest manifest,
                   const SessionStreams& streams, const std::vector<std::vector<uint64_t>>* page_hashes,
                   std::vector<uint64_t> first_frames, ContentFill* content)
    : sink_(sink), header_(header), sealer_(keys.records), manifest_(std::move(manifest)), streams_(streams),
      page_hashes_(page_hashes), content_(content), frame_keys_(keys.frames), frames_(std::move(first_frames)) {
  if (frames_.empty()) frames_.assign(streams.data.size(), 0);
}

Recorder::~Recorder() { (void)Join(); }

void Recorder::Start() { control_ = std::thread([this] { RunControl(); }); }

Status Recorder::Join() {
  if (control_.joinable()) control_.join();
  for (auto& t : data_) t.join();
  data_.clear();
  std::lock_guard lk(mu_);
  return committed_ ? Status::Ok() : failure_;
}

void Recorder::Fail(Status st) {
  std::lock_guard lk(mu_);
  if (failure_.ok()) failure_ = std::move(st);
  cv_.notify_all();
}

Status Recorder::Failure() {
  std::lock_guard lk(mu_);
  return failure_;
}

Status Recorder::Send(const v1::Envelope& env) {
  std::lock_guard lk(send_mu_);
  return wire::SendEnvelope(*streams_.control, env);
}

void Recorder::AbortSession(const Status& why) {
  std::lock_guard lk(send_mu_);
  if (abort_sent_) return;
  abort_sent_ = true;
  (void)wire::SendEnvelope(*streams_.control, wire::MakeAbort(why.message(), "checkpoint write"));
}

void Recorder::RunControl() {
  Status st = Control();
  if (!st.ok()) {
    Fail(st);
    bool committed;
    {
      std::lock_guard lk(mu_);
      committed = committed_;
    }
    // Before the file is committed the source must roll back: tell it why (the
    // first failure: a full disk rather than the broken stream that followed).
    if (!committed) AbortSession(Failure());
  }
  streams_.control->Close();
  for (Stream* s : streams_.data) s->Close();
  std::lock_guard lk(mu_);
  if (!committed_) sink_->Discard();
}

Status Recorder::Control() {
  Stream& ctl = *streams_.control;
  while (true) {
    GM_ASSIGN_OR_RETURN(v1::Envelope env, wire::RecvEnvelope(ctl));
    if (env.has_abort()) {
      return Aborted(fmt::format("the session aborted in phase {}: {}", env.abort().phase(), env.abort().reason()));
    }
    if (env.has_hello()) {
      GM_RETURN_IF_ERROR(wire::CheckHello(env.hello()));
      std::vector<std::string> caps = DecodeCapabilities();
      if (content_ != nullptr) caps.push_back(wire::kCapContentStore);
      GM_RETURN_IF_ERROR(Send(wire::MakeHello(GPUMIGRATE_VERSION, caps)));
    } else if (env.has_manifest()) {
      GM_RETURN_IF_ERROR(OnManifest(env.manifest()));
      v1::Envelope ready;
      ready.mutable_ready();
      GM_RETURN_IF_ERROR(Send(ready));
    } else if (env.has_round_end()) {
      GM_RETURN_IF_ERROR(WaitForFrames(env.round_end().frames_per_stream()));
      GM_RETURN_IF_ERROR(WriteSealed(RecordKind::kControl, env));
      {
        // The round is on disk before the next begins: the stun's fsync is the final delta's only.
        std::lock_guard lk(mu_);
        GM_RETURN_IF_ERROR(sink_->Sync());
      }
      v1::Envelope applied;
      applied.mutable_round_applied()->set_round(env.round_end().round());
      GM_RETURN_IF_ERROR(Send(applied));
    } else if (env.has_prepare()) {
      GM_RETURN_IF_ERROR(WaitForFrames(env.prepare().frames_per_stream()));
      GM_RETURN_IF_ERROR(WriteSealed(RecordKind::kControl, env));
      GM_RETURN_IF_ERROR(Finish(env.prepare()));
      v1::Envelope ok;
      ok.mutable_prepared();
      GM_RETURN_IF_ERROR(Send(ok));
    } else if (env.has_commit()) {
      v1::Envelope running;
      running.mutable_running();
      (void)Send(running);
      return Status::Ok();
    } else {
      return Corrupt(fmt::format("checkpoint: unexpected {} from the session", wire::EnvelopeKind(env)));
    }
  }
}

Status Recorder::OnManifest(const v1::Manifest& m) {
  if (data_started_) return Corrupt("checkpoint: a second Manifest");
  if (m.data_streams() != streams_.data.size()) {
    return InvalidArgument(fmt::format("checkpoint: the session uses {} data streams, the file {}", m.data_streams(),
                                       streams_.data.size()));
  }
  if (m.max_frame_payload_bytes() == 0 || m.max_frame_payload_bytes() > kMaxFramePayloadBytes) {
    return InvalidArgument(fmt::format("checkpoint: frame payload limit {} is outside 1..{}",
                                       m.max_frame_payload_bytes(), kMaxFramePayloadBytes));
  }
  max_payload_ = m.max_frame_payload_bytes();
  *manifest_.mutable_session() = m;
  GM_RETURN_IF_ERROR(sink_->Append(EncodeFileHeader(header_)));
  GM_RETURN_IF_ERROR(WriteSealed(RecordKind::kManifest, manifest_));
  data_started_ = true;
  for (size_t s = 0; s < streams_.data.size(); ++s) data_.emplace_back([this, s] { RunData(s); });
  return Status::Ok();
}

// Frames go to the file as they arrive, verbatim: their own tags protect them.
void Recorder::RunData(size_t s) {
  Stream& in = *streams_.data[s];
  std::vector<std::byte> frame;
  std::unique_ptr<FrameProtector> protector;  // opens PAGE_DIGESTS frames: the recorder reads their digests
  while (true) {
    frame.resize(wire::kFrameHeaderBytes);
    Status st = in.ReadExact(frame);
    if (!st.ok()) {
      // Closed: after a commit that is the end; before it, wake a control side
      // waiting for this stream's frames (the source closes everything when it fails).
      Fail(st.WithContext(fmt::format("checkpoint: data stream {}", s)));
      return;
    }
    auto h = wire::DecodeHeader(std::span<const std::byte, wire::kFrameHeaderBytes>(frame.data(), frame.size()));
    if (!h.ok() || h->payload_length > max_payload_) {
      Status bad = Corrupt(fmt::format("checkpoint: a malformed frame from the session on stream {}", s));
      Fail(bad);
      AbortSession(bad);
      return;
    }
    frame.resize(wire::kFrameHeaderBytes + h->payload_length + wire::kFrameTagBytes);
    st = in.ReadExact(std::span(frame).subspan(wire::kFrameHeaderBytes));
    if (!st.ok()) {
      Fail(st.WithContext(fmt::format("checkpoint: data stream {}", s)));
      return;
    }
    if (h->type == wire::FrameType::kPageDigests) {
      if (!protector) protector = MakeFrameProtector(frame_keys_);
      st = RecordDigests(s, *h, frame, *protector);
      if (st.ok()) continue;
      Fail(st);
      AbortSession(st);
      return;
    }
    {
      std::lock_guard lk(mu_);
      if (!failure_.ok()) return;
      st = WriteFrame(frame);
      if (st.ok()) {
        ++frames_[s];
        cv_.notify_all();
        continue;
      }
      failure_ = st;
      cv_.notify_all();
    }
    // The file cannot take it (a full disk): the source rolls back on our Abort.
    AbortSession(st);
    return;
  }
}

// Under mu_.
Status Recorder::WriteFrame(std::span<const std::byte> frame) {
  RecordHeader h;
  h.kind = RecordKind::kFrame;
  h.number = next_record_;
  h.body_length = frame.size();
  GM_RETURN_IF_ERROR(sink_->Append(EncodeRecordHeader(h)));
  GM_RETURN_IF_ERROR(sink_->Append(frame));
  ++next_record_;
  ++frames_total_;
  return Status::Ok();
}

// Pages offered by SHA-256: those the store holds (read, their digest
// checked) stay out of the file; the frame and the answer go in, in that
// order, and the answer goes to the source before the frame counts, so before
// the round's RoundApplied.
Status Recorder::RecordDigests(size_t s, const wire::FrameHeader& h, std::span<const std::byte> frame,
                               FrameProtector& protector) {
  if (content_ == nullptr) return Corrupt("checkpoint: a PAGE_DIGESTS frame, but this checkpoint has no content store");
  const auto& regions = manifest_.session().regions();
  int ri = 0;
  while (ri < regions.size() && regions[ri].id() != h.region) ++ri;
  if (ri == regions.size()) return Corrupt(fmt::format("checkpoint: PAGE_DIGESTS for unknown region {}", h.region));
  const uint32_t ps = regions[ri].page_size();
  const uint64_t pages = h.raw_length / ps;
  if (h.codec_flags != 0 || pages == 0 || h.raw_length % ps != 0 || h.payload_length != pages * 32 ||
      h.offset % ps != 0) {
    return Corrupt(fmt::format("checkpoint: a malformed PAGE_DIGESTS frame on stream {} (region {}, offset {})", s,
                               regions[ri].name(), h.offset));
  }
  std::vector<std::byte> payload(frame.begin() + wire::kFrameHeaderBytes,
                                 frame.begin() + wire::kFrameHeaderBytes + h.payload_length);
  wire::Tag tag;
  std::memcpy(tag.data(), frame.data() + wire::kFrameHeaderBytes + h.payload_length, tag.size());
  GM_RETURN_IF_ERROR(protector.Open(frame.first(wire::kFrameHeaderBytes), h.stream_id, h.sequence, payload, tag)
                         .WithContext(fmt::format("checkpoint: PAGE_DIGESTS frame on stream {}", s)));
  std::vector<ContentDigest> digests(pages);
  for (uint64_t k = 0; k < pages; ++k) std::memcpy(digests[k].data(), payload.data() + k * 32, 32);
  std::vector<std::byte> bytes(pages * ps);
  std::vector<bool> filled;
  content_->FillRun(ps, digests, bytes, filled);
  content_->Answered(pages);
  v1::Envelope answer;
  auto* a = answer.mutable_content_answer();
  a->set_round(h.round);
  a->set_region(h.region);
  a->set_first_page(h.offset / ps);
  a->set_pages(static_cast<uint32_t>(pages));
  for (uint64_t k = 0; k < pages; ++k) {
    if (!filled[k]) a->add_missed(static_cast<uint32_t>(k));
  }
  {
    std::lock_guard lk(mu_);
    if (!failure_.ok()) return failure_;
    GM_RETURN_IF_ERROR(WriteFrame(frame));
    GM_RETURN_IF_ERROR(WriteSealedLocked(RecordKind::kControl, answer));
  }
  GM_RETURN_IF_ERROR(Send(answer));
  std::lock_guard lk(mu_);
  ++frames_[s];
  cv_.notify_all();
  return Status::Ok();
}

Status Recorder::WriteSealed(RecordKind kind, const google::protobuf::Message& msg) {
  std::lock_guard lk(mu_);
  return WriteSealedLocked(kind, msg);
}

// Under mu_.
Status Recorder::WriteSealedLocked(RecordKind kind, const google::protobuf::Message& msg) {
  std::string body;
  if (!msg.SerializeToString(&body)) return Internal("checkpoint: cannot serialise a record");
  GM_ASSIGN_OR_RETURN(auto rec, sealer_.Seal(kind, next_record_,
                                             std::as_bytes(std::span(body.data(), body.size()))));
  GM_RETURN_IF_ERROR(sink_->Append(rec));
  ++next_record_;
  return Status::Ok();
}

Status Recorder::WaitForFrames(const google::protobuf::RepeatedField<uint64_t>& counts) {
  if (static_cast<size_t>(counts.size()) != frames_.size()) {
    return Corrupt(fmt::format("checkpoint: the session counts frames on {} streams, the file has {}", counts.size(),
                               frames_.size()));
  }
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] {
    if (!failure_.ok()) return true;
    for (size_t s = 0; s < frames_.size(); ++s) {
      if (frames_[s] < counts[static_cast<int>(s)]) return false;
    }
    return true;
  });
  return failure_;
}

// The page index, the footer, then durable: fsync and rename.
Status Recorder::Finish(const v1::Prepare& p) {
  if (page_hashes_ == nullptr) return Internal("checkpoint: no page hashes from the session");
  const auto& regions = manifest_.session().regions();
  if (page_hashes_->size() != static_cast<size_t>(regions.size())) {
    return Internal("checkpoint: the session's page hashes do not match its regions");
  }
  for (int i = 0; i < regions.size(); ++i) {
    const auto& hashes = (*page_hashes_)[static_cast<size_t>(i)];
    size_t first = 0;
    do {
      v1::PageIndex idx;
      idx.set_region(regions[i].id());
      idx.set_first_page(first);
      size_t n = std::min(kHashesPerIndexRecord, hashes.size() - first);
      idx.mutable_hashes()->Add(hashes.begin() + static_cast<std::ptrdiff_t>(first),
                                hashes.begin() + static_cast<std::ptrdiff_t>(first + n));
      GM_RETURN_IF_ERROR(WriteSealed(RecordKind::kIndex, idx));
      first += n;
    } while (first < hashes.size());
  }
  v1::CheckpointFooter footer;
  {
    std::lock_guard lk(mu_);
    footer.set_records(next_record_);
    footer.set_frames(frames_total_);
  }
  *footer.mutable_frames_per_stream() = p.frames_per_stream();  // the whole chain's: sequences go on from here
  footer.set_final_round(p.final_round());
  *footer.mutable_digests() = p.digests();
  footer.set_device_state_bytes(p.device_state_bytes());
  GM_RETURN_IF_ERROR(WriteSealed(RecordKind::kFooter, footer));
  std::lock_guard lk(mu_);
  GM_RETURN_IF_ERROR(sink_->Commit());
  committed_ = true;
  return Status::Ok();
}

}  // namespace gpumigrate::ckpt
