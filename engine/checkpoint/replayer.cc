#include "engine/checkpoint/replayer.h"

#include <algorithm>

#include <fmt/format.h>

#include "transport/wire/control_channel.h"
#include "transport/wire/frame.h"

namespace gpumigrate::ckpt {

namespace v1 = wire::v1;

std::string Replayer::FrameWhere(size_t stream, uint64_t seq) const {
  if (stream >= frames_.size() || seq >= frames_[stream].size()) return "";
  const Where& w = frames_[stream][seq];
  return (*chain_)[w.file]->Where(w.number, w.offset);
}

Status Replayer::Run() {
  Status st = Replay();
  if (!st.ok()) (void)wire::SendEnvelope(*streams_.control, wire::MakeAbort(st.message(), "restore"));
  streams_.control->Close();
  for (Stream* s : streams_.data) s->Close();
  return st;
}

void Replayer::ReadControl() {
  while (true) {
    auto env = wire::RecvEnvelope(*streams_.control);
    std::lock_guard lk(in_mu_);
    if (!env.ok()) {
      in_status_ = env.status();
      in_done_ = true;
      in_cv_.notify_all();
      return;
    }
    inbox_.push_back(std::move(*env));
    in_cv_.notify_all();
  }
}

Result<v1::Envelope> Replayer::Next() {
  std::unique_lock lk(in_mu_);
  in_cv_.wait(lk, [&] { return !inbox_.empty() || in_done_; });
  if (inbox_.empty()) return in_status_;
  v1::Envelope env = std::move(inbox_.front());
  inbox_.pop_front();
  return env;
}

Status Replayer::Await(v1::Envelope::MsgCase want, const char* what, v1::Envelope* got) {
  GM_ASSIGN_OR_RETURN(v1::Envelope env, Next());
  if (env.has_abort()) {
    return Aborted(fmt::format("the destination aborted in phase {}: {}", env.abort().phase(), env.abort().reason()));
  }
  if (env.msg_case() != want) {
    return Corrupt(fmt::format("restore: expected {} from the destination, got {}", what, wire::EnvelopeKind(env)));
  }
  if (got != nullptr) *got = std::move(env);
  return Status::Ok();
}

Status Replayer::Replay() {
  const v1::Manifest& m = (*chain_)[0]->manifest().session();
  frames_.assign(m.data_streams(), {});
  if (streams_.data.size() != m.data_streams()) return Internal("restore: stream count differs from the manifest's");
  GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, wire::MakeHello(GPUMIGRATE_VERSION, {})));
  v1::Envelope hello;
  GM_RETURN_IF_ERROR(Await(v1::Envelope::kHello, "Hello", &hello));
  for (const auto& cap : hello.hello().capabilities()) destination_has_store_ |= cap == wire::kCapContentStore;
  for (const auto& f : *chain_) {
    if (!f->manifest().content_store().empty() && !destination_has_store_) {
      return InvalidArgument(fmt::format(
          "{} leaves pages to the content store {} (checkpoint --content-store): restore it with --content-store "
          "naming that store", f->path(), f->manifest().content_store()));
    }
  }
  v1::Envelope manifest;
  *manifest.mutable_manifest() = m;
  GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, manifest));
  GM_RETURN_IF_ERROR(Await(v1::Envelope::kReady, "Ready"));
  v1::Envelope prepare;
  for (const auto& f : *chain_) total_bytes_ += f->file_bytes();
  for (size_t i = 0; i < chain_->size(); ++i) GM_RETURN_IF_ERROR(File(i, i + 1 == chain_->size(), &prepare));
  if (progress_) progress_(total_bytes_, total_bytes_);
  // Every file checked to its footer: now the destination may verify and run.
  GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, prepare));
  GM_RETURN_IF_ERROR(Await(v1::Envelope::kPrepared, "Prepared"));
  v1::Envelope commit;
  commit.mutable_commit();
  GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, commit));
  return Await(v1::Envelope::kRunning, "Running");
}

Status Replayer::Bad(const FilePass& fp, const Record& rec, const std::string& why) const {
  return Corrupt(fmt::format("{}: {}", fp.f.Where(rec.number, rec.offset), why));
}

// One file of the chain, manifest to footer.
Status Replayer::File(size_t index, bool last, v1::Envelope* prepare) {
  FilePass fp{*(*chain_)[index], index, last};
  if (last) fp.hashes.resize(static_cast<size_t>(fp.f.manifest().session().regions().size()));
  while (true) {
    GM_ASSIGN_OR_RETURN(std::optional<Record> rec, fp.f.Next());
    if (!rec) break;
    done_bytes_ += kRecordHeaderBytes + rec->body.size() + (rec->kind == RecordKind::kFrame ? 0 : kTagBytes);
    if (progress_ && done_bytes_ - reported_ >= (uint64_t{64} << 20)) {
      reported_ = done_bytes_;
      progress_(done_bytes_, total_bytes_);
    }
    if (fp.have_prepare && rec->kind != RecordKind::kIndex && rec->kind != RecordKind::kFooter) {
      return Bad(fp, *rec, fmt::format("a {} record after the Prepare", RecordKindName(rec->kind)));
    }
    switch (rec->kind) {
      case RecordKind::kFrame:
        GM_RETURN_IF_ERROR(OnFrame(fp, *rec));
        break;
      case RecordKind::kControl:
        GM_RETURN_IF_ERROR(OnControl(fp, *rec));
        break;
      case RecordKind::kIndex:
        GM_RETURN_IF_ERROR(OnIndex(fp, *rec));
        break;
      case RecordKind::kFooter:
        GM_RETURN_IF_ERROR(OnFooter(fp, *rec, prepare));
        break;
      case RecordKind::kManifest:
      case RecordKind::kInvalid:
        return Bad(fp, *rec, "unexpected record");
    }
    ++fp.records;
  }
  return Status::Ok();
}

// A frame goes to its data stream as it was recorded.
Status Replayer::OnFrame(FilePass& fp, const Record& rec) {
  auto h = wire::DecodeHeader(std::span<const std::byte, wire::kFrameHeaderBytes>(rec.body.data(),
                                                                                 wire::kFrameHeaderBytes));
  if (!h.ok()) return Bad(fp, rec, std::string(h.status().message()));
  if (rec.body.size() != wire::kFrameHeaderBytes + uint64_t{h->payload_length} + wire::kFrameTagBytes) {
    return Bad(fp, rec, fmt::format("frame record of {} bytes holds a frame of {}-byte payload", rec.body.size(),
                                    h->payload_length));
  }
  if (h->stream_id >= streams_.data.size()) return Bad(fp, rec, fmt::format("frame on stream {}", h->stream_id));
  frames_[h->stream_id].push_back({static_cast<uint32_t>(fp.index), rec.number, rec.offset});
  GM_RETURN_IF_ERROR(streams_.data[h->stream_id]->WriteAll(rec.body)
                         .WithContext(fmt::format("restore: {}", fp.f.Where(rec.number, rec.offset))));
  ++fp.frames;
  return Status::Ok();
}

// A RoundEnd is played to the destination (and answered); the Prepare is held.
Status Replayer::OnControl(FilePass& fp, const Record& rec) {
  v1::Envelope env;
  if (!env.ParseFromArray(rec.body.data(), static_cast<int>(rec.body.size()))) {
    return Bad(fp, rec, "control record does not decode");
  }
  if (env.has_round_end()) {
    GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, env));
    return AwaitRoundApplied(fp, rec);
  }
  if (env.has_content_answer()) {
    const v1::ContentAnswer& a = env.content_answer();
    if (fp.f.manifest().content_store().empty()) {
      return Bad(fp, rec, "a content answer in a file taken without a content store");
    }
    auto key = std::make_tuple(a.round(), a.region(), a.first_page());
    if (!recorded_answers_.emplace(key, std::vector<uint32_t>(a.missed().begin(), a.missed().end())).second) {
      return Bad(fp, rec, fmt::format("a second content answer for pages {}+ of region {} in round {}", a.first_page(),
                                      a.region(), a.round()));
    }
    return Status::Ok();
  }
  if (!env.has_prepare()) {
    return Bad(fp, rec, fmt::format("unexpected {} in a control record", wire::EnvelopeKind(env)));
  }
  fp.prepare = env;
  fp.have_prepare = true;
  return Status::Ok();
}

Status Replayer::AwaitRoundApplied(const FilePass& fp, const Record& rec) {
  while (true) {
    GM_ASSIGN_OR_RETURN(v1::Envelope env, Next());
    if (env.has_abort()) {
      return Aborted(fmt::format("the destination aborted in phase {}: {}", env.abort().phase(), env.abort().reason()));
    }
    if (env.has_round_applied()) return Status::Ok();
    if (!env.has_content_answer()) {
      return Corrupt(fmt::format("restore: expected RoundApplied from the destination, got {}",
                                 wire::EnvelopeKind(env)));
    }
    GM_RETURN_IF_ERROR(CheckAnswer(fp, rec, env.content_answer()));
  }
}

// Every page the destination could not fill must be one the recorder did not
// fill either (a later round of the chain carries its bytes).
Status Replayer::CheckAnswer(const FilePass& fp, const Record& rec, const v1::ContentAnswer& got) {
  auto it = recorded_answers_.find(std::make_tuple(got.round(), got.region(), got.first_page()));
  if (it == recorded_answers_.end()) {
    return Bad(fp, rec, fmt::format("the destination answered pages {}+ of region {} in round {}, which the file "
                                    "never offered", got.first_page(), got.region(), got.round()));
  }
  const std::vector<uint32_t>& recorded = it->second;
  for (uint32_t m : got.missed()) {
    if (std::binary_search(recorded.begin(), recorded.end(), m)) continue;
    std::string region = std::to_string(got.region());
    for (const auto& r : fp.f.manifest().session().regions()) {
      if (r.id() == got.region()) region = r.name();
    }
    return FailedPrecondition(fmt::format(
        "restore: the content store does not hold page {} of region {} (offered in round {}), which {} left to it: "
        "restore with the store it was taken with ({}), its files unchanged",
        got.first_page() + m, region, got.round(), fp.f.path(), fp.f.manifest().content_store()));
  }
  recorded_answers_.erase(it);
  return Status::Ok();
}

// The last file's page index is kept (a later incremental checkpoint's base).
Status Replayer::OnIndex(FilePass& fp, const Record& rec) {
  if (!fp.have_prepare) return Bad(fp, rec, "page index before the Prepare");
  v1::PageIndex idx;
  if (!idx.ParseFromArray(rec.body.data(), static_cast<int>(rec.body.size()))) {
    return Bad(fp, rec, "page index does not decode");
  }
  if (!fp.last) return Status::Ok();
  const auto& regions = fp.f.manifest().session().regions();
  int r = 0;
  while (r < regions.size() && regions[r].id() != idx.region()) ++r;
  if (r == regions.size()) return Bad(fp, rec, fmt::format("page index for unknown region {}", idx.region()));
  auto& h = fp.hashes[static_cast<size_t>(r)];
  if (idx.first_page() != h.size()) return Bad(fp, rec, "page index out of order");
  h.insert(h.end(), idx.hashes().begin(), idx.hashes().end());
  return Status::Ok();
}

// The footer must count what was read and agree with the Prepare; then the last
// file hands over its Prepare and index, any other is checked as the next's base.
Status Replayer::OnFooter(FilePass& fp, const Record& rec, v1::Envelope* prepare) {
  v1::CheckpointFooter footer;
  if (!footer.ParseFromArray(rec.body.data(), static_cast<int>(rec.body.size()))) {
    return Bad(fp, rec, "footer does not decode");
  }
  if (footer.records() != fp.records) {
    return Bad(fp, rec, fmt::format("footer counts {} records, the file has {}", footer.records(), fp.records));
  }
  if (footer.frames() != fp.frames) {
    return Bad(fp, rec, fmt::format("footer counts {} frames, the file has {}", footer.frames(), fp.frames));
  }
  if (!fp.have_prepare) return Bad(fp, rec, "no Prepare before the footer");
  const v1::Prepare& p = fp.prepare.prepare();
  if (footer.final_round() != p.final_round() || footer.device_state_bytes() != p.device_state_bytes() ||
      footer.digests_size() != p.digests_size()) {
    return Bad(fp, rec, "footer disagrees with the Prepare");
  }
  for (int d = 0; d < p.digests_size(); ++d) {
    if (footer.digests(d).region() != p.digests(d).region() || footer.digests(d).digest() != p.digests(d).digest()) {
      return Bad(fp, rec, "footer's digests disagree with the Prepare's");
    }
  }
  for (size_t s = 0; s < frames_.size(); ++s) {
    if (static_cast<int>(s) >= footer.frames_per_stream_size() ||
        footer.frames_per_stream(static_cast<int>(s)) != frames_[s].size()) {
      return Bad(fp, rec, "footer's frames per stream disagree with the frames of the chain");
    }
  }
  GM_RETURN_IF_ERROR(fp.last ? TakeIndex(fp, rec) : CheckNextBase(fp, rec, footer));
  if (fp.last) *prepare = fp.prepare;
  footer_ = footer;
  return Status::Ok();
}

Status Replayer::TakeIndex(FilePass& fp, const Record& rec) {
  const auto& regions = fp.f.manifest().session().regions();
  for (int r = 0; r < regions.size(); ++r) {
    const uint64_t pages = (regions[r].size_bytes() + regions[r].page_size() - 1) / regions[r].page_size();
    if (fp.hashes[static_cast<size_t>(r)].size() != pages) {
      return Bad(fp, rec, fmt::format("page index holds {} pages of region {}, it has {}",
                                      fp.hashes[static_cast<size_t>(r)].size(), regions[r].name(), pages));
    }
  }
  page_hashes_ = std::move(fp.hashes);
  return Status::Ok();
}

// The next file must name this one, as it ends, as its base.
Status Replayer::CheckNextBase(const FilePass& fp, const Record& rec, const v1::CheckpointFooter& footer) const {
  const FileReader& next = *(*chain_)[fp.index + 1];
  const auto& base = next.manifest().base();
  if (base.file_id() != fp.f.header().file_id) {
    return Bad(fp, rec, fmt::format("{} names another file as its base", next.path()));
  }
  if (base.digests_size() != footer.digests_size()) return Bad(fp, rec, "the next file's base digests differ");
  for (int d = 0; d < footer.digests_size(); ++d) {
    if (base.digests(d).digest() != footer.digests(d).digest()) {
      return Bad(fp, rec, fmt::format("{} was taken over a different state of this base", next.path()));
    }
  }
  return Status::Ok();
}

}  // namespace gpumigrate::ckpt
