// The source side of a migration session as one object, internal to the
// session layer: source.cc runs it (handshake, pre-copy rounds, switchover,
// commit, teardown), source_link.cc holds one connection's parts and carries a
// broken pre-copy on over a new connection (resumable pre-copy). The public
// entry point is RunSource (gpumigrate/session/session.h).
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "engine/session/chunk_pipeline.h"
#include "engine/session/content_offer.h"
#include "engine/session/frame_sender.h"
#include "engine/session/link_watch.h"
#include "engine/session/liveness.h"
#include "engine/session/mailbox.h"
#include "engine/session/page_classifier.h"
#include "engine/session/page_hashes.h"
#include "engine/session/state_stream.h"
#include "gpumigrate/common/clock.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/content/content_store.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/session/session.h"
#include "gpumigrate/policy/switchover.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate::session_detail {

namespace v1 = wire::v1;

// What the source records for a page the destination may or may not hold: no
// page hashes to it (XXH3-64 of a page equal to it has odds of 2^-64, and would
// show as a digest mismatch at Prepare, never as a wrong page).
constexpr uint64_t kUnknownPageHash = 0x5eed0f0f0f0f0f0full;

class Source {
 public:
  Source(Device& dev, const SessionStreams& streams, const SourceOptions& opt)
      : dev_(dev), streams_(streams), opt_(opt), clock_(opt.clock ? *opt.clock : SystemClock()),
        regions_(dev.Regions()), hashes_(regions_), box_(std::make_unique<Mailbox>(clock_)),
        writer_(std::make_unique<ControlWriter>(streams.control, clock_)), t0_(clock_.Now()) {
    aes_key_ = opt.aes_key;
    session_id_ = opt.session_id;
    if (session_id_ == 0) {
      std::random_device rd;
      session_id_ = (uint64_t{rd()} << 32) | rd();
      if (session_id_ == 0) session_id_ = 1;
    }
    for (size_t i = 0; i < regions_.size(); ++i) order_.push_back(i);
    // Static regions (weights) first: they will not need resending.
    std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
      return (regions_[a].hint == RegionHint::kStatic) > (regions_[b].hint == RegionHint::kStatic);
    });
    for (const auto& r : regions_) {
      sets_.emplace_back(r.pages());
      report_.device_bytes += r.size_bytes;
    }
    report_.device = dev.Describe();
    report_.verify_full = opt.verify_full;
  }

  MigrationReport Run();

 private:
  Status CheckReady();
  Status Start();
  Status PreCopy();
  Status RunRound(uint32_t round);
  Result<PolicyResult> Decide(const std::vector<uint64_t>& dirty_history, uint32_t rounds_done);
  Status Switchover();
  Status Commit();
  v1::Envelope PrepareMessage(uint64_t state_bytes);
  MigrationReport Teardown(Outcome outcome, Status st);
  void RollBack(Status st);
  void Statistics();

  Status Handshake();
  void StartLink();
  void StopLink();
  bool Resumable(const Status& st) const;
  Status Resume(Status st, uint32_t failed_round);
  uint64_t BytesSent() const { return link_bytes_before_ + (sender_ ? sender_->bytes_sent() : 0); }
  Status ChooseCodecs(const wire::v1::Hello& peer);
  Status SendSet(uint32_t round, bool skip_known, RoundReport& rr);
  Status CommitChunk(Chunk& c, uint32_t round, RoundReport& rr, Phase phase, uint64_t total, uint64_t& done);
  // Offers a run of whole pages by SHA-256 (a PageDigests frame), when the
  // destination has a content store and the offer's state says so; *offered
  // says whether it did (else the caller sends the bytes). `digests`: the
  // run's page digests when a worker computed them (else computed here).
  Status OfferRun(size_t i, uint32_t round, uint64_t first_page, uint64_t offset, std::span<const std::byte> raw,
                  std::span<const std::byte> digests, RoundReport& rr, bool* offered);
  // The pages the destination could not fill go with data in the next round.
  void MergeMissed(RoundReport& rr);
  uint32_t FirstRound() const { return opt_.continuation ? opt_.continuation->first_round : 0; }
  Status SyncAll(uint64_t* dirty_bytes);
  Status WatchLink();
  Status JudgeLink();
  void MergeWritten();
  Status VerifyFull();
  Result<v1::Envelope> Await(v1::Envelope::MsgCase want, const char* what,
                             const std::function<Status()>* while_waiting = nullptr);
  Status Interrupted();
  Status Explain(Status st);
  void EnterPhase(Phase p, uint32_t round) {
    if (live_) live_->Doing(fmt::format("{} (round {})", PhaseName(p), round));
    if (opt_.on_phase) opt_.on_phase(p, round);
  }
  void ReportProgress(Phase p, uint32_t round, uint64_t total, uint64_t done, bool force);
  // reset_data: the migration is given up, and what its data streams still
  // hold unsent (megabytes on a slow link) is dropped rather than left to drain
  // ahead of the Abort on the same link (Stream::Reset).
  void CloseAll(bool reset_data = false) {
    if (reader_) reader_->StopQuietly();
    if (live_) live_->StopQuietly();
    streams_.control->Close();
    for (Stream* s : streams_.data) reset_data ? s->Reset() : s->Close();
    if (live_) live_->Join();
  }
  // Times one stun phase: runs `step` and adds to `slot` the time since the
  // previous phase ended, so the phases tile the stun with no gap.
  template <typename F>
  Status TimePhase(Step at, std::optional<double>& slot, F&& step) {
    at_ = {at};
    if (live_) live_->Doing(StepName(at_));
    Status st = step();
    auto now = clock_.Now();
    slot = slot.value_or(0) + MsBetween(phase_end_, now);
    phase_end_ = now;
    return st;
  }

  Device& dev_;
  SessionStreams streams_;
  const SourceOptions& opt_;
  Clock& clock_;
  std::vector<RegionInfo> regions_;
  std::vector<size_t> order_;
  std::vector<DirtyBitmap> sets_;  // pages to send next, per region
  PageHashes hashes_;
  uint64_t session_id_;
  // One connection's parts: replaced together when a broken connection is
  // resumed over a new one (StopLink, StartLink).
  std::unique_ptr<Mailbox> box_;
  std::unique_ptr<ControlWriter> writer_;
  std::unique_ptr<ControlReader> reader_;
  std::unique_ptr<FrameSender> sender_;
  std::unique_ptr<StateStreamSender> state_;  // the device's own state, blob or stream
  std::unique_ptr<Liveness> live_;            // after sender_: its keepalives read the byte count
  std::atomic<bool> peer_aborted_{false};
  DirtyTracker* tracker_ = nullptr;
  bool tracking_ = false;
  bool switch_now_ = false;  // SourceOptions::switch_now said yes: the round in progress was cut short
  // The in-round rule on a slow link (WatchLink, JudgeLink): whether a
  // pre-copy round is in progress (the link is judged while the session waits
  // on it, too), the link's rate, the last sample of it, the last dirty sync and
  // what a sync within a round cost, a bitmap per region for those syncs, the
  // pages they found that wait to join sets_ at the next page-run boundary
  // (a sync while a run is being sent must not mark pages the run then clears),
  // and how many checks in a row found the link too slow.
  bool watching_ = false;
  LinkWatch watch_;
  Clock::TimePoint last_watch_{};
  Clock::TimePoint last_sync_{};
  Clock::Duration sync_cost_{0};
  std::vector<DirtyBitmap> written_;
  std::vector<DirtyBitmap> pending_;
  uint32_t too_slow_checks_ = 0;
  // The round in progress: its pages not sent yet and those gone through so
  // far (page bytes), and the sender's byte count when it began.
  uint64_t round_left_bytes_ = 0;
  uint64_t round_done_bytes_ = 0;
  uint64_t round_sent_before_ = 0;
  StepAt at_;                 // where the migration stands: a failure is reported here
  PolicyResult decision_;     // the switchover rule's last answer
  bool decided_ = false;      // a round has ended and the rule answered (decision_ holds it)
  uint32_t final_round_ = 0;
  MigrationReport report_;
  Clock::TimePoint t0_;
  Clock::TimePoint t_stun_{};     // the device stopped: the stun began
  Clock::TimePoint phase_end_{};  // the last stun phase ended
  Clock::TimePoint last_progress_{};
  std::vector<std::byte> buf_;
  std::vector<CodecKind> codec_;  // per region
  FrameEncoder encoder_;
  std::vector<std::byte> encoded_;
  std::unique_ptr<ChunkPipeline> pipeline_;  // the reading workers, from the first round on
  // Resumable pre-copy.
  std::optional<std::array<std::byte, 32>> aes_key_;  // this connection's data key
  // The frames of the round the destination has not confirmed yet, each with its
  // pages: after a break, those of frames it had not applied go again.
  // 32 bytes per frame of the round in flight, cleared when it is confirmed.
  struct SentRun {
    uint64_t sequence = 0;
    uint64_t first_page = 0;
    uint32_t pages = 0;
    uint32_t region = 0;  // index in regions_
    uint16_t stream = 0;
    bool zero = false;    // a kZeroPages frame: no page bytes
    bool digest = false;  // a kPageDigests frame: its answer may be lost with the connection
    uint64_t Bytes(const std::vector<RegionInfo>& regions) const { return zero ? 0 : pages * regions[region].page_size; }
  };
  std::vector<SentRun> unconfirmed_;
  void NoteSent(size_t region, uint64_t first_page, uint64_t pages, bool zero, bool digest = false) {
    unconfirmed_.push_back({sender_->last_sequence(), first_page, static_cast<uint32_t>(pages),
                            static_cast<uint32_t>(region), static_cast<uint16_t>(sender_->last_stream()), zero,
                            digest});
  }
  bool peer_resumes_ = false;             // the destination's Hello listed `resume`
  bool peer_keepalive_ = false;
  bool device_failed_ = false;            // a device read failed: not the link's fault, not resumable
  uint32_t confirmed_rounds_ = 0;         // rounds the destination confirmed (RoundApplied)
  uint64_t confirmed_bytes_ = 0;          // page bytes sent with data in those rounds
  uint64_t link_bytes_before_ = 0;        // bytes sent over earlier connections
  std::vector<uint64_t> prior_stream_bytes_, prior_stream_frames_;
  std::optional<uint32_t> resumed_round_;  // the round that carries on after a resumption
  // Content-addressed pre-copy (content_offer.h): enabled by the destination's Hello.
  ContentOffer offer_{regions_};
  Sha256Hasher sha_;
  std::vector<std::byte> digests_;
  uint64_t offered_bytes_ = 0, missed_bytes_ = 0;
};

}  // namespace gpumigrate::session_detail
