// One connection's parts for the source session (frame sender, device-state
// sender, control reader, liveness) and resumable pre-copy: a connection that
// breaks before the switchover is replaced by a new one of the same session,
// and only what the destination had not applied goes again.
#include <chrono>

#include <fmt/format.h>

#include "engine/session/source_session.h"

namespace gpumigrate::session_detail {

// One connection's parts on streams_: the frame sender (keys of this
// connection), the device-state sender, the control reader and liveness.
void Source::StartLink() {
  FrameKeys keys;
  keys.integrity_key = session_id_;
  if (aes_key_) {
    keys.aes_gcm = true;
    keys.aes_key = *aes_key_;
  }
  sender_ = std::make_unique<FrameSender>(streams_.data, keys, opt_.bandwidth_limit_bytes_per_s, clock_);
  sender_->FollowRate(opt_.bandwidth_now);
  // While a pre-copy round waits on the link: a cancel is seen, and the link judged.
  sender_->SetWaitHook([this]() -> Status {
    if (!watching_) return Status::Ok();
    GM_RETURN_IF_ERROR(Interrupted());
    return JudgeLink();
  });
  state_ = std::make_unique<StateStreamSender>(dev_, *sender_, opt_.max_frame_payload_bytes);
  offer_.LinkRestarted();
  reader_ = std::make_unique<ControlReader>(
      streams_.control, box_.get(),
      [this](const v1::Abort&) {
        // Stop sending at once; Teardown picks up the reason from the mailbox.
        peer_aborted_ = true;
        for (Stream* s : streams_.data) s->Close();
      },
      [this](const v1::Envelope& env) -> Result<bool> {
        if (!env.has_content_answer()) return false;
        if (!offer_.enabled()) return Corrupt("protocol error: a ContentAnswer, but no page was offered by digest");
        GM_RETURN_IF_ERROR(offer_.Answer(env.content_answer()));
        return true;
      });
  live_ = SessionLiveness(*writer_, *box_, clock_, streams_, LivenessOf(opt_, "the destination"),
                          [this] { return BytesSent(); });
}

// Stops the broken connection's threads and closes its streams; its byte and
// frame counts are kept for the report.
void Source::StopLink() {
  CloseAll();
  reader_.reset();
  live_.reset();
  const auto& frames = sender_->frames_per_stream();
  const auto& bytes = sender_->bytes_per_stream();
  prior_stream_frames_.resize(frames.size(), 0);
  prior_stream_bytes_.resize(bytes.size(), 0);
  for (size_t i = 0; i < frames.size(); ++i) {
    prior_stream_frames_[i] += frames[i];
    prior_stream_bytes_[i] += bytes[i];
  }
  link_bytes_before_ += sender_->bytes_sent();
  state_.reset();
  sender_.reset();
}

// A pre-copy step that failed because the connection broke (a reset, a closed
// stream, the watchdog's silence verdict) can be carried on over a new one; an
// Abort from the destination, a device error, a cancel, or a protocol error cannot.
bool Source::Resumable(const Status& st) const {
  if (!peer_resumes_ || device_failed_ || peer_aborted_.load()) return false;
  if (opt_.cancel && opt_.cancel->load()) return false;
  if (report_.resumptions.size() >= opt_.max_resumes) return false;
  return st.code() == StatusCode::kUnavailable || box_->failure().code() == StatusCode::kDeadlineExceeded;
}

// Resumable pre-copy, source side. The device keeps running and its tracker
// keeps logging throughout. The pages of the round the destination had not
// confirmed go again (their hashes are forgotten, so the carrying-on round does
// not skip them); what was dirtied meanwhile is in the tracker for the next sync.
Status Source::Resume(Status st, uint32_t failed_round) {
  if (!Resumable(st)) return st;
  // A destination that aborts sends Abort before it closes: the broken stream
  // may be only the echo of that decision, which is not resumed.
  if (box_->PeerAbort(clock_.Now() + std::chrono::seconds(1))) {
    peer_aborted_ = true;
    return st;
  }
  if (Status f = box_->failure(); f.code() == StatusCode::kDeadlineExceeded) st = f;  // the watchdog's reason
  const auto t = clock_.Now();
  EnterPhase(Phase::kReconnecting, failed_round);
  StopLink();
  auto re = opt_.reconnect(opt_.resume_window);
  if (!re.ok()) {
    return Status(st.code(), fmt::format("{}; resuming over a new connection failed within {:.0f} s: {}",
                                         st.message(), std::chrono::duration<double>(opt_.resume_window).count(),
                                         re.status().message()));
  }
  if (re->streams.control == nullptr || re->streams.data.size() != streams_.data.size()) {
    return InvalidArgument(fmt::format("resume: the new connection has {} data streams, the session {}",
                                       re->streams.data.size(), streams_.data.size()));
  }
  streams_ = re->streams;
  aes_key_ = re->aes_key;
  box_ = std::make_unique<Mailbox>(clock_);
  writer_ = std::make_unique<ControlWriter>(streams_.control, clock_);
  StartLink();
  if (peer_keepalive_) live_->PeerSpeaksKeepalive();
  GM_RETURN_IF_ERROR(writer_->Send(wire::MakeResume(failed_round + 1, confirmed_rounds_)).WithContext("resume"));
  GM_ASSIGN_OR_RETURN(v1::Envelope back, Await(v1::Envelope::kResumed, "Resumed"));
  const v1::Resumed& got = back.resumed();
  MigrationReport::Resumption x;
  x.round = failed_round;
  x.reason = st.message();
  x.saved_bytes = confirmed_bytes_;
  if (got.rounds_applied() > confirmed_rounds_ + 1) {
    return Corrupt(fmt::format("resume: the destination says it applied {} rounds, only {} were sent",
                               got.rounds_applied(), confirmed_rounds_ + 1));
  }
  // Pages of the broken round offered by digest go again, whatever the
  // destination applied: which of them it could not fill was in answers the
  // broken connection may have lost.
  for (const SentRun& run : unconfirmed_) {
    if (!run.digest) continue;
    sets_[run.region].SetRange(run.first_page, run.pages);
    for (uint64_t q = run.first_page; q < run.first_page + run.pages; ++q) hashes_.Set(run.region, q, kUnknownPageHash);
  }
  if (got.rounds_applied() == confirmed_rounds_ + 1) {
    // The destination applied the broken round whole; only its confirmation was lost.
    ++confirmed_rounds_;
    for (const SentRun& run : unconfirmed_) x.saved_bytes += run.digest ? 0 : run.Bytes(regions_);
  } else {
    if (static_cast<size_t>(got.frames_applied_size()) != streams_.data.size()) {
      return Corrupt(fmt::format("resume: the destination counts frames on {} streams, the session has {}",
                                 got.frames_applied_size(), streams_.data.size()));
    }
    // Each stream's frames were applied in order: those past its count go again,
    // and their hashes are forgotten so that the carrying-on round does not skip them.
    for (const SentRun& run : unconfirmed_) {
      if (run.digest) continue;  // marked above
      if (run.sequence < got.frames_applied(static_cast<int>(run.stream))) {
        x.saved_bytes += run.Bytes(regions_);
        continue;
      }
      sets_[run.region].SetRange(run.first_page, run.pages);
      for (uint64_t q = run.first_page; q < run.first_page + run.pages; ++q) hashes_.Set(run.region, q, kUnknownPageHash);
      x.resent_bytes += run.pages * regions_[run.region].page_size;
    }
  }
  unconfirmed_.clear();
  resumed_round_ = failed_round + 1;
  x.reconnect_ms = MsBetween(t, clock_.Now());
  report_.resumptions.push_back(x);
  EnterPhase(Phase::kResumed, failed_round + 1);
  return Status::Ok();
}

}  // namespace gpumigrate::session_detail
