// The source side of a migration, in three steps and one teardown:
//
//   Start        handshake, device SaveSetup hook, RUNNING -> PRE_COPY, tracking on
//   PreCopy      rounds until the switchover rule (gpumigrate/policy/switchover.h) decides
//   Switchover   STOP_COPY, final sync, final data, device state, STOP, Prepare ->
//                Prepared                      (the stun starts here)
//   Commit       Commit -> Running             (the stun ends here)
//   Teardown     one exit for every outcome: completed, rolled back (anything
//                before Prepared, the probe's deliberate stop) or in doubt (after
//                Commit was sent), then the device's SaveCleanup hook, outside the stun
//
// The rollback and in-doubt rules are docs/design.md's. The class is declared in
// source_session.h; one connection's parts and resumption over a new
// connection (a break before the switchover) are in source_link.cc.
#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "engine/codec_choice/codec_choice.h"
#include "engine/session/scrub.h"
#include "engine/session/source_session.h"
#include "gpumigrate/common/clock.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/policy/switchover.h"

namespace gpumigrate {
namespace session_detail {
namespace {

v1::RegionHint ToWire(RegionHint h) {
  switch (h) {
    case RegionHint::kStatic: return v1::REGION_HINT_STATIC;
    case RegionHint::kDynamic: return v1::REGION_HINT_DYNAMIC;
    default: return v1::REGION_HINT_UNKNOWN;
  }
}

}  // namespace

// Picks each region's codec: the one asked for, or with `auto` the one a sample
// of the region's non-zero pages says moves bytes fastest on the capped link.
Status Source::ChooseCodecs(const wire::v1::Hello& peer) {
  const CodecChoice& c = opt_.codec;
  codec_.assign(regions_.size(), CodecKind::kNone);
  const std::vector<std::string> caps(peer.capabilities().begin(), peer.capabilities().end());
  if (!PeerDecodes(caps, c)) {
    return InvalidArgument(fmt::format("handshake failed: codec {} was asked for but the destination cannot decode it",
                                       c.ToString()));
  }
  for (size_t i = 0; i < regions_.size(); ++i) {
    const RegionInfo& r = regions_[i];
    MigrationReport::RegionCodec rc;
    rc.region = r.name;
    auto chosen = SampleAndChooseCodec(dev_, r, c, opt_.bandwidth_limit_bytes_per_s, SessionSampleOptions(r, c.level));
    if (!chosen.ok()) return chosen.status().WithContext("codec sample");
    codec_[i] = chosen->codec;
    if (chosen->sample) {
      rc.sampled_zstd_ratio = chosen->sample->codecs.zstd_ratio;
      rc.sampled_shuffle_ratio = chosen->sample->codecs.shuffle_ratio;
      rc.sampled_bf16_ratio = chosen->sample->codecs.bf16_ratio;
    }
    rc.codec = std::string(CodecKindName(codec_[i]));
    report_.codecs.push_back(rc);
  }
  return Status::Ok();
}

Status Source::Interrupted() {
  if (opt_.cancel && opt_.cancel->load()) return Aborted("cancelled by the user");
  if (peer_aborted_.load()) return Unavailable("destination aborted");
  Status f = box_->failure();
  if (!f.ok()) return f;
  return Status::Ok();
}

Result<v1::Envelope> Source::Await(v1::Envelope::MsgCase want, const char* what,
                                   const std::function<Status()>* while_waiting) {
  GM_ASSIGN_OR_RETURN(v1::Envelope env,
                      box_->Next(clock_.Now() + opt_.peer_timeout, opt_.cancel, what, false, while_waiting));
  if (env.has_abort()) {
    return Aborted(fmt::format("destination aborted in phase {}: {}", env.abort().phase(), env.abort().reason()));
  }
  if (env.msg_case() != want) {
    return Corrupt(fmt::format("protocol error: expected {}, got {}", what, wire::EnvelopeKind(env)));
  }
  return env;
}

Status Source::Handshake() {
  std::vector<std::string> caps = {wire::kCapKeepalive};
  // A device whose state is one stream cannot send any of it twice.
  const bool can_resume = opt_.reconnect && opt_.resume_window > std::chrono::nanoseconds(0) && !dev_.StreamsState();
  if (can_resume) caps.push_back(wire::kCapResume);
  GM_RETURN_IF_ERROR(writer_->Send(wire::MakeHello(GPUMIGRATE_VERSION, caps)));
  GM_ASSIGN_OR_RETURN(v1::Envelope peer, Await(v1::Envelope::kHello, "Hello"));
  GM_RETURN_IF_ERROR(wire::CheckHello(peer.hello()));
  for (const auto& cap : peer.hello().capabilities()) {
    if (cap == wire::kCapKeepalive) {
      peer_keepalive_ = true;
      live_->PeerSpeaksKeepalive();
    }
    if (cap == wire::kCapResume) peer_resumes_ = can_resume;
    if (cap == wire::kCapContentStore && opt_.content_offer) offer_.Enable();
  }
  GM_RETURN_IF_ERROR(ChooseCodecs(peer.hello()));

  v1::Envelope env;
  auto* m = env.mutable_manifest();
  m->set_session_id(session_id_);
  m->set_device(dev_.Describe());
  m->set_data_streams(static_cast<uint32_t>(streams_.data.size()));
  m->set_cipher(opt_.aes_key ? v1::CIPHER_AES_256_GCM : v1::CIPHER_NONE_INTEGRITY_ONLY);
  m->set_max_frame_payload_bytes(opt_.max_frame_payload_bytes);
  for (const auto& r : regions_) {
    auto* w = m->add_regions();
    w->set_id(r.id);
    w->set_name(r.name);
    w->set_size_bytes(r.size_bytes);
    w->set_page_size(r.page_size);
    w->set_hint(ToWire(r.hint));
  }
  GM_RETURN_IF_ERROR(writer_->Send(env));
  GM_ASSIGN_OR_RETURN(v1::Envelope ready, Await(v1::Envelope::kReady, "Ready"));
  if (ready.ready().setup_note().size() > 4096) return Corrupt("Ready: the destination's setup note exceeds 4 KiB");
  return dev_.SetPeerSetupNote(ready.ready().setup_note()).WithContext("device setup");
}

void Source::ReportProgress(Phase p, uint32_t round, uint64_t total, uint64_t done, bool force) {
  if (!opt_.on_progress) return;
  auto now = clock_.Now();
  if (!force && now - last_progress_ < std::chrono::milliseconds(100)) return;
  last_progress_ = now;
  Progress pr;
  pr.phase = p;
  pr.round = round;
  pr.round_bytes_total = total;
  pr.round_bytes_done = done;
  pr.bytes_sent = BytesSent();
  pr.elapsed_s = MsBetween(t0_, now) / 1e3;
  if (decided_) pr.predicted_stun_ms = decision_.predicted_stun_ms;
  opt_.on_progress(pr);
}

// Sends every page marked in sets_ (and clears the marks). The first round
// (`skip_known`) skips pages the destination already holds: zeros on a fresh
// destination, or what an earlier part of the session sent (a continuation).
// The chunks are read, hashed and encoded by the pipeline's workers ahead of
// the session thread, which sends them in order (CommitChunk).
Status Source::SendSet(uint32_t round, bool skip_known, RoundReport& rr) {
  uint64_t total = 0;
  for (size_t i = 0; i < regions_.size(); ++i) total += sets_[i].Count() * regions_[i].page_size;
  rr.dirty_bytes = total;
  uint64_t done = 0;
  round_left_bytes_ = total;
  round_done_bytes_ = 0;
  uint64_t sent_before = sender_->bytes_sent();
  round_sent_before_ = sent_before;
  const Phase phase = rr.final ? Phase::kSwitchover : Phase::kRoundStart;
  if (!pipeline_) {
    pipeline_ = std::make_unique<ChunkPipeline>(dev_, SourceWorkers(opt_.workers));
    report_.source_workers = pipeline_->workers();
  }
  // The next chunk to read: the walk over the dirty set runs ahead of the sends
  // by at most the pipeline's depth.
  size_t oi = 0;          // index in order_
  uint64_t next = 0;      // the page to look from in region order_[oi]
  uint64_t run_end = 0;   // the end of the dirty run being cut into chunks
  auto submit_more = [&] {
    while (oi < order_.size()) {
      const size_t i = order_[oi];
      const RegionInfo& r = regions_[i];
      const uint64_t ps = r.page_size;
      if (next >= run_end) {
        next = sets_[i].NextSet(next);
        if (next >= r.pages()) {
          ++oi;
          next = run_end = 0;
          continue;
        }
        run_end = sets_[i].NextClear(next);
      }
      const uint64_t max_pages = std::max<uint64_t>(1, opt_.max_frame_payload_bytes / ps);
      ChunkJob j;
      j.region = i;
      j.region_id = r.id;
      j.first_page = next;
      j.pages = std::min(run_end - next, max_pages);
      j.offset = next * ps;
      j.length = std::min(j.pages * ps, r.size_bytes - j.offset);
      j.page_size = ps;
      if (skip_known) j.held = std::span<const uint64_t>(hashes_.All()[i]).subspan(next, j.pages);
      // Where the content offer may take the runs, the workers compute their
      // digests and the session thread encodes only what it sends; where it
      // will not (the final round, no store, a region it has given up on but
      // for a re-probe now and then) the workers encode.
      if (!rr.final && offer_.enabled() && offer_.state(i) != ContentOffer::State::kOff) {
        j.digest = true;
      } else {
        j.codec = codec_[i];
        j.level = opt_.codec.level;
      }
      if (!pipeline_->HasRoom(j.length)) break;  // the same job is cut again next time
      pipeline_->Submit(j);
      next += j.pages;
    }
  };
  Status st;
  while (true) {
    submit_more();
    if (pipeline_->in_flight() == 0) break;
    Chunk& c = pipeline_->Front();
    st = CommitChunk(c, round, rr, phase, total, done);
    pipeline_->PopFront();
    if (!st.ok() || (switch_now_ && !rr.final)) break;
  }
  pipeline_->Clear();  // a failure or a round cut short: what was read ahead stays marked, for later
  GM_RETURN_IF_ERROR(st);
  rr.bytes = sender_->bytes_sent() - sent_before;
  round_left_bytes_ = 0;
  return Status::Ok();
}

// Sends one chunk the workers prepared: its zero runs, its data runs (offered
// by digest, or encoded), then records its pages' hashes and clears them from
// the dirty set (but for those a sync marked again while it was in flight).
Status Source::CommitChunk(Chunk& c, uint32_t round, RoundReport& rr, Phase phase, uint64_t total, uint64_t& done) {
  GM_RETURN_IF_ERROR(Interrupted());
  const ChunkJob& j = c.job;
  const size_t i = j.region;
  const RegionInfo& r = regions_[i];
  const uint64_t p = j.first_page, off = j.offset, ps = j.page_size;
  if (!c.read.ok()) {
    device_failed_ = true;
    return c.read.WithContext(fmt::format("read region {}", r.name));
  }
  const uint64_t offered_before = rr.offered_pages;
  live_->Worked(j.length);  // progress even when nothing needs sending (pages the destination holds)
  rr.zero_pages += c.same_zero;
  rr.known_pages += c.same_known;
  for (size_t k = 0; k < c.parts.size(); ++k) {
    const PageRun& run = c.parts[k];
    if (run.zero) {
      rr.zero_pages += run.pages;
      GM_RETURN_IF_ERROR(sender_->Send(wire::FrameType::kZeroPages, r.id, round, off + run.offset_bytes,
                                       static_cast<uint32_t>(run.length_bytes), {}));
      if (!rr.final) NoteSent(i, p + run.first_page, run.pages, true);
      continue;
    }
    auto raw = std::span<const std::byte>(c.raw).subspan(run.offset_bytes, run.length_bytes);
    bool offered = false;
    if (!rr.final) {
      std::span<const std::byte> digests;
      if (j.digest) digests = std::span<const std::byte>(c.digests).subspan(run.first_page * 32, run.pages * 32);
      GM_RETURN_IF_ERROR(OfferRun(i, round, p + run.first_page, off + run.offset_bytes, raw, digests, rr, &offered));
    }
    if (offered) continue;
    rr.pages_sent += run.pages;
    CodecKind used = c.used[k];
    std::span<const std::byte> payload = used == CodecKind::kNone ? raw : std::span<const std::byte>(c.encoded[k]);
    if (j.codec == CodecKind::kNone && codec_[i] != CodecKind::kNone) {  // left to this thread (see SendSet)
      used = encoder_.Encode(codec_[i], opt_.codec.level, raw, encoded_);
      payload = used == CodecKind::kNone ? raw : std::span<const std::byte>(encoded_);
    }
    rr.raw_bytes += run.length_bytes;
    rr.payload_bytes += payload.size();
    GM_RETURN_IF_ERROR(sender_->Send(wire::FrameType::kPages, r.id, round, off + run.offset_bytes,
                                     static_cast<uint32_t>(run.length_bytes), payload, static_cast<uint8_t>(used)));
    if (!rr.final) NoteSent(i, p + run.first_page, run.pages, false);
  }
  for (uint64_t k = 0; k < c.hashes.size(); ++k) hashes_.Set(i, p + k, c.hashes[k]);
  // Reading and hashing pages that went by digest is offer time, not the
  // link's: the share of this chunk's read they make up, and the worker's
  // hashing, each spread over the workers that run beside each other.
  if (rr.offered_pages > offered_before) {
    const double share = static_cast<double>((rr.offered_pages - offered_before) * ps) / static_cast<double>(j.length);
    rr.offer_ms += (c.read_ms * share + c.digest_ms) / pipeline_->workers();
  }
  tracker_->NoteSent(r.id, p, c.hashes);  // a hashing tracker compares with what was sent
  DirtyBitmap& set = sets_[i];
  for (uint64_t q = p; q < p + j.pages; ++q) set.Clear(q);  // pages left set go in a later round
  for (uint64_t q : c.keep) set.Set(q);
  done += j.pages * ps;
  round_left_bytes_ = total > done ? total - done : 0;
  round_done_bytes_ = done;
  ReportProgress(phase, round, total, done, false);
  if (!rr.final) GM_RETURN_IF_ERROR(WatchLink());
  if (!rr.final && opt_.switch_now) switch_now_ = opt_.switch_now();
  return Status::Ok();
}

Status Source::OfferRun(size_t i, uint32_t round, uint64_t first_page, uint64_t offset,
                        std::span<const std::byte> raw, std::span<const std::byte> digests, RoundReport& rr,
                        bool* offered) {
  const RegionInfo& r = regions_[i];
  const uint64_t pages = raw.size() / r.page_size;
  *offered = false;
  if (pages == 0 || raw.size() % r.page_size != 0 || !offer_.ShouldOffer(i, pages)) return Status::Ok();
  if (digests.size() != pages * 32) {  // a re-probe of a region the workers did not hash for
    const auto t = clock_.Now();
    digests_.resize(pages * 32);
    for (uint64_t k = 0; k < pages; ++k) {
      ContentDigest d = sha_.Digest(raw.subspan(k * r.page_size, r.page_size));
      std::memcpy(digests_.data() + k * 32, d.data(), 32);
    }
    rr.offer_ms += MsBetween(t, clock_.Now());
    digests = digests_;
  }
  offer_.Offered(i, pages);  // before the frame goes: its answer can come back before Send returns
  GM_RETURN_IF_ERROR(sender_->Send(wire::FrameType::kPageDigests, r.id, round, offset,
                                   static_cast<uint32_t>(raw.size()), digests));
  NoteSent(i, first_page, pages, false, /*digest=*/true);
  rr.offered_pages += pages;
  offered_bytes_ += raw.size();
  *offered = true;
  return Status::Ok();
}

void Source::MergeMissed(RoundReport& rr) {
  for (const ContentOffer::Missed& m : offer_.TakeMissed()) {
    sets_[m.region].Set(m.page);
    hashes_.Set(m.region, m.page, kUnknownPageHash);  // never skipped as held
    ++rr.offer_missed_pages;
    missed_bytes_ += regions_[m.region].page_size;
  }
}

Status Source::SyncAll(uint64_t* dirty_bytes) {
  MergeWritten();
  *dirty_bytes = 0;
  for (size_t i = 0; i < regions_.size(); ++i) {
    GM_RETURN_IF_ERROR(tracker_->Sync(regions_[i].id, sets_[i]).WithContext("dirty sync"));
    *dirty_bytes += sets_[i].Count() * regions_[i].page_size;
  }
  last_sync_ = clock_.Now();
  return Status::Ok();
}

// Within a pre-copy round: whether the link, at the rate it carries this round
// now, can still bring the stun within max stun, so that a link that collapsed
// (or was too slow all along) for this workload aborts the migration here, the
// source running on, and not at the end of a round that may take minutes at
// that rate. Judged after each page run (WatchLink) and, every
// FrameSender::kWaitHookPeriod, while the session waits on the link (a Send or
// Flush waiting for room, the wait for RoundApplied): at a collapsed rate one
// frame may take seconds to leave. Only while the link is what limits the round
// (LinkWatch::LinkBound) and even the whole device would not fit in max stun at
// that rate (else no floor can exceed it): then, kLinkCheckInterval after the
// last dirty sync (or ten times that sync's own cost, whichever is longer, so a
// hashing tracker stays under 10% of the time), a sync measures what the
// workload wrote since (into written_, then pending_: those pages join the pages
// to send at the next page-run boundary, as any page dirtied during a round)
// and DecideAtLinkRate judges. Two such checks in a row that say no abort; one
// (a dip) does not.
namespace {
constexpr std::chrono::milliseconds kLinkCheckInterval{1000};
}  // namespace

Status Source::WatchLink() {
  MergeWritten();
  return JudgeLink();
}

void Source::MergeWritten() {
  if (pending_.empty()) return;
  // A page of a chunk read ahead and not sent yet that a sync found written:
  // its send must not clear the mark (the bytes read may predate the write).
  if (pipeline_) {
    for (auto& c : pipeline_->chunks()) {
      const DirtyBitmap& w = pending_[c->job.region];
      for (uint64_t q = c->job.first_page; q < c->job.first_page + c->job.pages; ++q) {
        if (w.Test(q)) c->keep.push_back(q);
      }
    }
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    sets_[i].OrWith(pending_[i]);
    pending_[i].ClearAll();
  }
}

Status Source::JudgeLink() {
  const auto now = clock_.Now();
  if (now - last_watch_ < std::chrono::milliseconds(50)) return Status::Ok();  // samples closer add nothing
  last_watch_ = now;
  const FrameSender::LinkSample link = sender_->Link();
  watch_.Sample(link);
  if (!watch_.LinkBound()) {
    too_slow_checks_ = 0;
    return Status::Ok();
  }
  const SwitchoverLimits limits = opt_.Limits();
  const uint64_t state_bytes = dev_.PendingEstimate().stop_copy_bytes;
  const double rate = *watch_.rate();
  // A window that carried nothing (a stall, a retransmission backoff) says
  // nothing of the rate: neither a verdict nor a reset of the count of checks
  // in a row. A link that stays silent is the liveness watchdog's (and
  // resumption's) to handle.
  if (rate <= 0) return Status::Ok();
  // This round's bytes the link has not carried: the pages not sent yet, at
  // the wire bytes per page byte this round has had so far (zero pages, pages
  // the destination holds and compression cost little), and what the sender
  // and the streams hold.
  const uint64_t sent = sender_->bytes_sent();
  const double wire_per_byte =
      round_done_bytes_ > 0
          ? std::min(1.0, static_cast<double>(sent - round_sent_before_) / static_cast<double>(round_done_bytes_))
          : 1.0;
  const uint64_t round_left = static_cast<uint64_t>(static_cast<double>(round_left_bytes_) * wire_per_byte) +
                              (sent > link.written ? sent - link.written : 0);
  const double elapsed_s = MsBetween(t0_, now) / 1e3;
  // Neither rule can say no while even the whole device fits (in max stun, in
  // what is left of the budget) at this rate: no sync needed.
  const double whole_s = static_cast<double>(report_.device_bytes + state_bytes) / rate;
  const bool stun_may_fail = !limits.switch_when_not_converging &&
                             PredictStunMs(report_.device_bytes + state_bytes, rate, limits.fixed_cost) >
                                 std::chrono::duration<double, std::milli>(limits.max_stun).count();
  const bool budget_may_fail =
      limits.max_total.count() > 0 &&
      elapsed_s + static_cast<double>(round_left) / rate + whole_s > std::chrono::duration<double>(limits.max_total).count();
  if (!stun_may_fail && !budget_may_fail) {
    too_slow_checks_ = 0;
    return Status::Ok();
  }
  const auto since = now - last_sync_;
  if (since < std::max<Clock::Duration>(kLinkCheckInterval, 10 * sync_cost_)) return Status::Ok();
  if (written_.empty()) {
    for (const auto& r : regions_) {
      written_.emplace_back(r.pages());
      pending_.emplace_back(r.pages());
    }
  }
  uint64_t written = 0;
  for (size_t i = 0; i < regions_.size(); ++i) {
    written_[i].ClearAll();
    GM_RETURN_IF_ERROR(tracker_->Sync(regions_[i].id, written_[i]).WithContext("dirty sync"));
    written += written_[i].Count() * regions_[i].page_size;
    pending_[i].OrWith(written_[i]);
  }
  last_sync_ = clock_.Now();
  sync_cost_ = last_sync_ - now;
  LinkRateInput in;
  in.limits = limits;
  in.written_bytes = written;
  in.interval_s = std::chrono::duration<double>(since).count();
  in.bandwidth_bytes_per_s = rate;
  in.peak_bandwidth_bytes_per_s = watch_.peak();
  in.device_state_bytes = state_bytes;
  in.elapsed_s = elapsed_s;
  in.round_left_bytes = round_left;
  in.round = at_.round;
  PolicyResult d = DecideAtLinkRate(in);
  if (d.decision != Decision::kAbort) {
    too_slow_checks_ = 0;
    return Status::Ok();
  }
  if (++too_slow_checks_ < 2) return Status::Ok();
  decision_ = d;
  report_.bandwidth_bytes_per_s = in.bandwidth_bytes_per_s;
  return Aborted(d.reason);
}

// Re-reads the whole source at stop and checks each page against what was sent.
Status Source::VerifyFull() {
  for (size_t i = 0; i < regions_.size(); ++i) {
    const RegionInfo& r = regions_[i];
    const uint64_t chunk = std::max<uint64_t>(r.page_size, uint64_t{4} << 20) / r.page_size * r.page_size;
    for (uint64_t off = 0; off < r.size_bytes; off += chunk) {
      uint64_t len = std::min(chunk, r.size_bytes - off);
      buf_.resize(len);
      GM_RETURN_IF_ERROR(dev_.Read(r.id, off, buf_));
      for (uint64_t o = 0; o < len; o += r.page_size) {
        uint64_t page = (off + o) / r.page_size;
        auto bytes = std::span(buf_).subspan(o, std::min<uint64_t>(r.page_size, len - o));
        if (HashPage(bytes) != hashes_.Get(i, page)) {
          return Internal(fmt::format(
              "verify full: region {} page {} at stop differs from what was sent (a write the dirty tracker missed)",
              r.name, page));
        }
      }
    }
  }
  return Status::Ok();
}

// Why the migration failed, in the words a user needs. When the destination
// aborted, its reason is the one that matters: alone when its Abort came first,
// ahead of our own error when a broken connection came first (the peer sends
// Abort before it closes its streams, so the broken stream is its echo, not a
// crash: the same words either way, whichever the source happened to meet first).
// A connection that broke with no Abort says the destination closed it, and when.
Status Source::Explain(Status st) {
  const std::string step = StepName(at_);
  const bool peer_first = peer_aborted_.load();
  if (peer_first || st.code() == StatusCode::kUnavailable) {
    if (auto abort = box_->PeerAbort(clock_.Now() + std::chrono::seconds(1))) {
      std::string peer = fmt::format("destination aborted in phase {}: {}", abort->phase(), abort->reason());
      if (peer_first) return Aborted(peer).WithContext(fmt::format("migration aborted in {}", step));
      // The broken stream is the Abort's echo: the reason leads, our error follows.
      return Aborted(fmt::format("{} (here: {})", peer, st.message()))
          .WithContext(fmt::format("migration aborted in {}", step));
    }
  }
  if (st.code() == StatusCode::kUnavailable) {
    return Unavailable(fmt::format("the destination closed the connection during {}: {}", step, st.message()));
  }
  return st.WithContext(fmt::format("migration aborted in {}", step));
}

// Before Prepared: tell the destination why (best effort), stop, and return the
// source to RUNNING with its memory untouched.
void Source::RollBack(Status st) {
  st = report_.dry_run ? Status::Ok() : Explain(std::move(st));
  (void)writer_->Send(wire::MakeAbort(report_.dry_run ? "dry run complete: the probe stops before switchover"
                                                           : st.message(),
                                           report_.dry_run ? "dry run" : StepName(at_)));
  CloseAll(/*reset_data=*/true);
  if (tracking_) (void)tracker_->Stop();
  tracking_ = false;
  report_.status = st;
  report_.failed_phase = report_.dry_run ? StepAt{} : at_;
  DeviceState s = dev_.State();
  if (s == DeviceState::kPreCopy || s == DeviceState::kStopCopy || s == DeviceState::kStop) {
    if (Status back = dev_.SetState(DeviceState::kRunning); !back.ok()) {
      report_.status = report_.dry_run ? back.WithContext("dry run: resuming the source failed")
                                       : Internal(fmt::format("{}; and returning the source to RUNNING failed: {}",
                                                              st.message(), back.message()));
      report_.resolution = "the source device could not be resumed: inspect it before anything else";
      return;
    }
  }
  if (report_.dry_run) {
    report_.resolution = "dry run: the source kept running; the destination discarded what it received";
    return;
  }
  const std::string lost = dev_.LostState();
  report_.resolution = lost.empty()
                           ? "the source is RUNNING with its memory intact; the destination discarded what it received"
                           : fmt::format("the source is RUNNING, but {}; the destination discarded what it received",
                                         lost);
  if (decision_.decision == Decision::kAbort) {
    report_.drain_recommended = true;
    report_.resolution += decision_.stop == StopReason::kOverBudget
                              ? "; live migration cannot end within its time budget at this bandwidth: "
                                "drain-and-replace recommended"
                              : "; live migration will not converge at this bandwidth: drain-and-replace recommended";
  }
}

// Every migration ends here, whatever its outcome; the device's cleanup hook
// runs last, outside the stun.
MigrationReport Source::Teardown(Outcome outcome, Status st) {
  report_.outcome = outcome;
  // The liveness watchdog closed the streams: a broken stream is the echo of its reason.
  if (Status f = box_->failure(); f.code() == StatusCode::kDeadlineExceeded && st.code() == StatusCode::kUnavailable) {
    st = f;
  }
  switch (outcome) {
    case Outcome::kAborted:
      RollBack(std::move(st));
      break;
    case Outcome::kInDoubt:
      if (st.code() == StatusCode::kUnavailable) {
        st = Unavailable(fmt::format("the destination closed the connection during {}: {}", StepName(at_),
                                     st.message()));
      }
      CloseAll();
      if (tracking_) (void)tracker_->Stop();
      tracking_ = false;
      if (dev_.State() != DeviceState::kStop) (void)dev_.SetState(DeviceState::kStop);
      report_.failed_phase = at_;
      report_.status = Status(StatusCode::kInDoubt,
                              fmt::format("commit sent but not confirmed ({}): outcome in doubt", st.message()));
      report_.resolution =
          "both sides are stopped and the source state is intact; neither resumes on its own. Check the destination: "
          "if it is RUNNING, release the source; otherwise discard the destination and resume the source (device "
          "state STOP -> RUNNING)";
      break;
    case Outcome::kCompleted:
      (void)tracker_->Stop();
      tracking_ = false;  // released or held: the device stays in STOP; resumed: it runs on
      CloseAll();
      report_.verified = true;
      Statistics();
      break;
  }
  report_.bytes_sent = BytesSent();
  const Outcome fate = CleanupFor(outcome, opt_.fate);
  if (fate == Outcome::kCompleted) Scrub(dev_, opt_.scrub, clock_, report_);
  report_.source_cleanup = dev_.SaveCleanup(fate);
  report_.total_ms = MsBetween(t0_, clock_.Now());
  if (outcome == Outcome::kCompleted) {
    EnterPhase(Phase::kCompleted, final_round_);
    ReportProgress(Phase::kCompleted, final_round_, 0, 0, true);
  }
  return report_;
}

void Source::Statistics() {
  report_.offered_pages = offer_.offered_pages();
  report_.dedup_bytes = offered_bytes_ > missed_bytes_ ? offered_bytes_ - missed_bytes_ : 0;
  report_.dedup_pages = offer_.offered_pages() - std::min(offer_.offered_pages(), offer_.missed_pages());
  uint64_t raw = 0, payload = 0;
  for (const auto& r : report_.rounds) {
    raw += r.raw_bytes;
    payload += r.payload_bytes;
  }
  report_.compression_ratio = payload ? static_cast<double>(raw) / static_cast<double>(payload) : 1.0;
  const double total_ms = MsBetween(t0_, clock_.Now());
  for (size_t i = 0; i < sender_->frames_per_stream().size(); ++i) {
    MigrationReport::StreamStat st;
    st.stream = static_cast<uint32_t>(i);
    st.frames = sender_->frames_per_stream()[i] + (i < prior_stream_frames_.size() ? prior_stream_frames_[i] : 0);
    st.bytes = sender_->bytes_per_stream()[i] + (i < prior_stream_bytes_.size() ? prior_stream_bytes_[i] : 0);
    st.bytes_per_s = total_ms > 0 ? static_cast<double>(st.bytes) / (total_ms / 1e3) : 0;
    report_.streams.push_back(st);
  }
}

// Nothing has been touched yet when these fail: the report says why, no more.
Status Source::CheckReady() {
  if (streams_.control == nullptr || streams_.data.empty()) {
    return InvalidArgument("session: need a control stream and at least one data stream");
  }
  if (dev_.State() != DeviceState::kRunning) {
    return FailedPrecondition(
        fmt::format("session: source device is {}, expected RUNNING", DeviceStateName(dev_.State())));
  }
  tracker_ = dev_.Tracker();
  if (tracker_ == nullptr) return Unimplemented("session: the device has no dirty tracker");
  if (const auto& c = opt_.continuation) {
    if (opt_.session_id == 0) return InvalidArgument("session: a continuation needs the earlier part's session id");
    if (dev_.StreamsState()) {
      // Each saving session of such a device is one stream from its start, and a
      // restore plays every part into one RESUMING session: they cannot be joined.
      return Unimplemented(fmt::format("session: {} keeps its state as one migration stream, so it cannot continue "
                                       "from an earlier checkpoint: take a full one (no --base)",
                                       dev_.Describe()));
    }
    if (!hashes_.Assign(c->page_hashes)) {
      return InvalidArgument("session: the continuation's page hashes do not match the device's regions");
    }
    if (c->frames_per_stream.size() != streams_.data.size()) {
      return InvalidArgument(fmt::format("session: the continuation numbered frames on {} streams, this session has {}",
                                         c->frames_per_stream.size(), streams_.data.size()));
    }
  }
  return Status::Ok();
}

Status Source::Start() {
  StartLink();
  if (opt_.continuation) (void)sender_->ContinueFrom(opt_.continuation->frames_per_stream);  // checked in CheckReady
  at_ = {Step::kHandshake};
  EnterPhase(Phase::kHandshake, 0);
  GM_RETURN_IF_ERROR(Handshake());
  GM_RETURN_IF_ERROR(dev_.SaveSetup().WithContext("device setup"));
  GM_RETURN_IF_ERROR(dev_.SetState(DeviceState::kPreCopy));
  GM_RETURN_IF_ERROR(tracker_->Start());
  tracking_ = true;
  last_sync_ = clock_.Now();
  for (auto& s : sets_) s.SetAll();
  return Status::Ok();
}

// One pre-copy round, timed end to end: the destination confirms it applied the
// round before the next dirty sync, so the bandwidth the rule sees is the one
// the stun will see and nothing is left in flight to lengthen a stun.
Status Source::RunRound(uint32_t round) {
  at_ = {Step::kPreCopy, round};
  EnterPhase(Phase::kRoundStart, round);
  RoundReport rr;
  rr.round = round;
  auto rs = clock_.Now();
  const uint64_t sent_before = sender_->bytes_sent();
  watch_.RoundStarted(sender_->Link());
  // The link is judged while this round's pages are sent and while the
  // destination takes the last of them (JudgeLink), not while the device's
  // own state is read.
  struct Watching {
    bool& on;
    explicit Watching(bool& w) : on(w) { on = true; }
    ~Watching() { on = false; }
  };
  {
    Watching w(watching_);
    // Round 0 skips what the destination holds (zeros, or an earlier part's pages),
    // and so does the round that carries on after a resumption.
    GM_RETURN_IF_ERROR(SendSet(round, round == FirstRound() || round == resumed_round_, rr));
  }
  GM_RETURN_IF_ERROR(state_->SendAvailable(round));  // a streaming device's pre-copy state
  rr.bytes = sender_->bytes_sent() - sent_before;    // the rule's bandwidth sample counts both
  GM_RETURN_IF_ERROR(writer_->Send(wire::MakeRoundEnd(round, sender_->frames_per_stream())));
  Watching w(watching_);
  const std::function<Status()> judge = [this] { return JudgeLink(); };
  GM_ASSIGN_OR_RETURN(v1::Envelope applied, Await(v1::Envelope::kRoundApplied, "RoundApplied", &judge));
  if (applied.round_applied().round() != round) {
    // A confirmation of another round (a duplicate) must not pass for this one's.
    return Corrupt(fmt::format("protocol error: RoundApplied for round {} while round {} was awaited",
                               applied.round_applied().round(), round));
  }
  MergeMissed(rr);  // every answer of the round came before its RoundApplied
  ++confirmed_rounds_;
  confirmed_bytes_ += rr.raw_bytes;
  unconfirmed_.clear();
  rr.ms = MsBetween(rs, clock_.Now());
  rr.start_ms = MsBetween(t0_, rs);
  report_.rounds.push_back(rr);
  EnterPhase(Phase::kRoundEnd, round);
  return Status::Ok();
}

// The switchover rule on the cheap pending estimate; when it says "switch", the
// exact count confirms it (a device's stop-copy size may exceed its estimate).
Result<PolicyResult> Source::Decide(const std::vector<uint64_t>& dirty_history, uint32_t rounds_done) {
  PolicyInput in;
  in.dirty_bytes_history = dirty_history;
  const PendingBytes pending = dev_.PendingEstimate();
  in.device_state_bytes = pending.stop_copy_bytes;
  in.device_initial_bytes = pending.precopy_initial_bytes;
  in.bandwidth_bytes_per_s = report_.bandwidth_bytes_per_s;
  in.rounds_done = rounds_done;
  in.limits = opt_.Limits();
  PolicyResult d = DecideSwitchover(in);
  if (d.decision != Decision::kSwitchover) return d;
  auto exact = dev_.PendingExact();
  if (!exact.ok()) return exact.status().WithContext("device pending bytes");
  if (exact->stop_copy_bytes == in.device_state_bytes) return d;
  in.device_state_bytes = exact->stop_copy_bytes;
  return DecideSwitchover(in);
}

namespace {

// The rule's bandwidth: the rounds' recent average, or the rate the link
// carries now when that is lower. A link shared with a migration that
// started later (an evacuation's migrations on one link) carried this one
// faster before: the average still counts those seconds, but the final
// round runs at the present rate, and a stun predicted at the average
// comes out short (measured: 184-200 ms predicted, 364-427 ms real, on a
// link that halved late in round 0). The present rate counts only when the
// round's last full LinkWatch window was the link's own measure
// (LinkBound: busy or backlogged throughout), so a source slow to produce
// never looks like a slow link; a round too short for a window leaves the
// average alone. A present rate above the average is not used: the
// average is the one the estimator's model samples, and a burst is not a
// promise. The report keeps both: bandwidth_bytes_per_s is what the rule
// used, rounds_bandwidth_bytes_per_s the average.
void SetRuleBandwidth(MigrationReport& report, const LinkWatch& watch) {
  report.rounds_bandwidth_bytes_per_s = RecentBandwidth(
      report.rounds, [](const RoundReport& r) { return r.bytes; },
      // Hashing pages offered by digest is the source's time, not the link's.
      [](const RoundReport& r) { return std::max(0.0, r.ms - r.offer_ms) / 1e3; });
  report.bandwidth_bytes_per_s = report.rounds_bandwidth_bytes_per_s;
  if (watch.LinkBound() && *watch.rate() > 0 && *watch.rate() < report.bandwidth_bytes_per_s) {
    report.bandwidth_bytes_per_s = *watch.rate();
  }
}

}  // namespace

// Rounds until the rule says switch over or abort (or, for a probe, anything
// but "continue"). decision_ holds its last answer.
Status Source::PreCopy() {
  std::vector<uint64_t> dirty_history;
  uint32_t held = 0;  // rounds run because may_switch held the switchover: not counted toward max_rounds
  for (uint32_t round = FirstRound();; ++round) {
    if (Status st = RunRound(round); !st.ok()) {
      if (decision_.stop == StopReason::kLinkTooSlow || decision_.stop == StopReason::kOverBudget) {
        // JudgeLink: the link cannot carry this workload now, or not within the budget
        report_.predicted_stun_ms = decision_.predicted_stun_ms;
        report_.switchover_reason = decision_.reason;
        report_.stop_reason = decision_.stop;
        final_round_ = round + 1;
        return Status::Ok();
      }
      // A broken connection: carried on over a new one when both sides can, and
      // the round numbers go on (a newer round's pages win at the destination).
      GM_RETURN_IF_ERROR(Resume(std::move(st), round));
      continue;
    }
    uint64_t dirty = 0;
    GM_RETURN_IF_ERROR(SyncAll(&dirty));
    dirty_history.push_back(dirty);
    SetRuleBandwidth(report_, watch_);
    GM_ASSIGN_OR_RETURN(decision_, Decide(dirty_history, static_cast<uint32_t>(dirty_history.size()) - held));
    decided_ = true;
    if (decision_.decision == Decision::kContinue && opt_.max_total.count() > 0) {
      // The time budget at a round boundary too: the next round (the dirty set,
      // at the last round's wire bytes per page byte) and the smallest final
      // round, at the rule's rate above (the present rate when lower than the
      // rounds' average). Within a round JudgeLink asks the same, but only
      // while the link sets the pace.
      const RoundReport& last = report_.rounds.back();
      const double wire_per_byte =
          last.raw_bytes > 0 ? std::min(1.0, static_cast<double>(last.bytes) / static_cast<double>(last.raw_bytes)) : 1.0;
      LinkRateInput in;
      in.limits = opt_.Limits();
      in.interval_s = 1;  // no writes measured here: the final round's floor is the device state alone
      in.bandwidth_bytes_per_s = report_.bandwidth_bytes_per_s;
      in.peak_bandwidth_bytes_per_s = watch_.peak();
      in.device_state_bytes = dev_.PendingEstimate().stop_copy_bytes;
      in.elapsed_s = MsBetween(t0_, clock_.Now()) / 1e3;
      in.round_left_bytes = static_cast<uint64_t>(static_cast<double>(dirty) * wire_per_byte);
      in.round = round + 1;
      if (PolicyResult d = DecideAtLinkRate(in); d.stop == StopReason::kOverBudget) decision_ = d;
    }
    if (decision_.decision == Decision::kContinue && opt_.switch_now && (switch_now_ || opt_.switch_now())) {
      decision_.decision = Decision::kSwitchover;
      decision_.reason = "the workload stopped on its own: switching over at once";
    } else if (decision_.decision == Decision::kSwitchover && opt_.may_switch && !opt_.may_switch()) {
      ++held;
      continue;
    }
    if (decision_.decision != Decision::kContinue) {
      report_.predicted_stun_ms = decision_.predicted_stun_ms;
      report_.switchover_reason = decision_.reason;
      report_.stop_reason = decision_.stop;
      final_round_ = round + 1;
      return Status::Ok();
    }
  }
}

// The stun's first part: from stopping the device to the destination's Prepared.
Status Source::Switchover() {
  EnterPhase(Phase::kSwitchover, final_round_);
  t_stun_ = phase_end_ = clock_.Now();
  report_.stun_start_ms = MsBetween(t0_, t_stun_);
  StunBreakdown& bd = report_.stun_breakdown_ms;
  uint64_t final_dirty = 0, state_bytes = 0;
  RoundReport fr;
  fr.round = final_round_;
  fr.final = true;
  const uint64_t sent_before_final = sender_->bytes_sent();
  GM_RETURN_IF_ERROR(TimePhase(Step::kStopDevice, bd.stop_device_ms,
                               [&] { return dev_.SetState(DeviceState::kStopCopy); }));
  GM_RETURN_IF_ERROR(TimePhase(Step::kFinalSync, bd.final_sync_ms, [&] { return SyncAll(&final_dirty); }));
  // The final data phase ends when the bytes are on the streams, not when queued.
  fr.start_ms = MsBetween(t0_, clock_.Now());
  GM_RETURN_IF_ERROR(TimePhase(Step::kFinalData, bd.final_data_ms, [&] {
    GM_RETURN_IF_ERROR(SendSet(final_round_, opt_.stop_and_copy, fr));
    return sender_->Flush();
  }));
  fr.ms = *bd.final_data_ms;
  GM_RETURN_IF_ERROR(TimePhase(Step::kDeviceState, bd.device_state_ms, [&]() -> Status {
    GM_ASSIGN_OR_RETURN(state_bytes, state_->SendFinal(final_round_));
    return Status::Ok();
  }));
  fr.bytes = sender_->bytes_sent() - sent_before_final;
  report_.rounds.push_back(fr);
  if (opt_.verify_full) {
    GM_RETURN_IF_ERROR(TimePhase(Step::kVerifyFull, bd.verify_full_ms, [&] { return VerifyFull(); }));
  }
  // Everything is read: STOP_COPY -> STOP, as a VFIO source does once its data is
  // drained. From STOP a backend may hold the workload stopped even if this
  // process dies (the proc shim does): Commit can only follow from here.
  // Stopping is two transitions, both counted as stop_device.
  GM_RETURN_IF_ERROR(
      TimePhase(Step::kStopDevice, bd.stop_device_ms, [&] { return dev_.SetState(DeviceState::kStop); }));
  return TimePhase(Step::kPrepare, bd.prepare_verify_ms, [&] {
    if (opt_.before_prepare) GM_RETURN_IF_ERROR(opt_.before_prepare(hashes_.All()));
    GM_RETURN_IF_ERROR(writer_->Send(PrepareMessage(state_bytes)));
    EnterPhase(Phase::kPrepareSent, final_round_);
    GM_RETURN_IF_ERROR(Await(v1::Envelope::kPrepared, "Prepared").status());
    EnterPhase(Phase::kPreparedReceived, final_round_);
    return Status::Ok();
  });
}

v1::Envelope Source::PrepareMessage(uint64_t state_bytes) {
  v1::Envelope prep;
  auto* p = prep.mutable_prepare();
  p->set_final_round(final_round_);
  for (uint64_t f : sender_->frames_per_stream()) p->add_frames_per_stream(f);
  for (size_t i = 0; i < regions_.size(); ++i) {
    auto* d = p->add_digests();
    d->set_region(regions_[i].id);
    d->set_digest(hashes_.RegionDigest(i));
  }
  p->set_device_state_bytes(state_bytes);
  return prep;
}

// Past the point of no return: a failure from here leaves the outcome in doubt.
Status Source::Commit() {
  GM_RETURN_IF_ERROR(TimePhase(Step::kCommit, report_.stun_breakdown_ms.commit_resume_ms, [&] {
    v1::Envelope commit;
    commit.mutable_commit();
    GM_RETURN_IF_ERROR(writer_->Send(commit));
    EnterPhase(Phase::kCommitSent, final_round_);
    GM_RETURN_IF_ERROR(Await(v1::Envelope::kRunning, "Running").status());
    // A checkpoint of a live device: it runs on here, and the stun ends when it does.
    if (opt_.fate == SourceFate::kResume) GM_RETURN_IF_ERROR(dev_.SetState(DeviceState::kRunning));
    return Status::Ok();
  }));
  report_.stun_ms = MsBetween(t_stun_, phase_end_);
  return Status::Ok();
}

MigrationReport Source::Run() {
  if (Status st = CheckReady(); !st.ok()) {
    report_.status = st;
    return report_;
  }
  if (Status st = Start(); !st.ok()) return Teardown(Outcome::kAborted, st);
  if (opt_.stop_and_copy) {
    // Everything is sent during the stun, as the first (and final) round.
    final_round_ = FirstRound();
    decision_.decision = Decision::kSwitchover;
    report_.switchover_reason = "stop-and-copy asked for: no pre-copy";
  } else if (Status st = PreCopy(); !st.ok()) {
    return Teardown(Outcome::kAborted, st);
  }
  if (opt_.dry_run) {
    report_.dry_run = true;
    report_.would_switch = decision_.decision == Decision::kSwitchover;
    return Teardown(Outcome::kAborted, Status::Ok());
  }
  if (decision_.decision == Decision::kAbort) return Teardown(Outcome::kAborted, Aborted(decision_.reason));
  if (Status st = Switchover(); !st.ok()) return Teardown(Outcome::kAborted, st);
  if (Status st = Commit(); !st.ok()) return Teardown(Outcome::kInDoubt, st);
  return Teardown(Outcome::kCompleted, Status::Ok());
}

}  // namespace session_detail

MigrationReport RunSource(Device& device, const SessionStreams& streams, const SourceOptions& options) {
  session_detail::Source s(device, streams, options);
  return s.Run();
}

}  // namespace gpumigrate
