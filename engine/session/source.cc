// The source side of a migration: handshake, pre-copy rounds, the switchover
// decision, switchover, and the rollback and in-doubt rules of DESIGN.md.
#include <algorithm>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "engine/codec_choice/codec_choice.h"
#include "engine/session/frame_sender.h"
#include "engine/session/mailbox.h"
#include "engine/session/page_classifier.h"
#include "engine/session/page_hashes.h"
#include "engine/session/switchover_policy.h"
#include "gpumigrate/codec.h"
#include "gpumigrate/dirty_tracker.h"
#include "gpumigrate/session.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate {
namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = wire::v1;

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

v1::RegionHint ToWire(RegionHint h) {
  switch (h) {
    case RegionHint::kStatic: return v1::REGION_HINT_STATIC;
    case RegionHint::kDynamic: return v1::REGION_HINT_DYNAMIC;
    default: return v1::REGION_HINT_UNKNOWN;
  }
}

// End-to-end bandwidth of the most recent rounds, enough of them to make 64 MiB
// (or all of them): recent rounds see the conditions the stun will see.
double MeasuredBandwidth(const std::vector<RoundReport>& rounds) {
  double bytes = 0, ms = 0;
  for (auto it = rounds.rbegin(); it != rounds.rend(); ++it) {
    bytes += static_cast<double>(it->bytes);
    ms += it->ms;
    if (bytes >= 64.0 * (1 << 20)) break;
  }
  return ms > 0 ? bytes / (ms / 1e3) : 0;
}

class Source {
 public:
  Source(Device& dev, const SessionStreams& streams, const SourceOptions& opt)
      : dev_(dev), streams_(streams), opt_(opt), regions_(dev.Regions()), hashes_(regions_) {
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
  Status Handshake();
  Status ChooseCodecs(const wire::v1::Hello& peer);
  Status SendSet(uint32_t round, bool skip_zero, RoundReport& rr);
  Status SyncAll(uint64_t* dirty_bytes);
  Status SendDeviceState(uint32_t round, uint64_t* state_bytes);
  Status VerifyFull();
  Result<v1::Envelope> Await(v1::Envelope::MsgCase want, const char* what);
  Status Interrupted();
  void Phase(gpumigrate::Phase p, uint32_t round) {
    if (opt_.on_phase) opt_.on_phase(p, round);
  }
  void ReportProgress(gpumigrate::Phase p, uint32_t round, uint64_t total, uint64_t done, bool force);
  void CloseAll() {
    if (reader_) reader_->StopQuietly();
    streams_.control->Close();
    for (Stream* s : streams_.data) s->Close();
  }
  Status Explain(Status st, const std::string& phase);
  MigrationReport Fail(Status st, const std::string& phase);
  MigrationReport InDoubt(Status st, const std::string& phase);
  MigrationReport FinishProbe(const PolicyResult& decision);

  Device& dev_;
  SessionStreams streams_;
  const SourceOptions& opt_;
  std::vector<RegionInfo> regions_;
  std::vector<size_t> order_;
  std::vector<DirtyBitmap> sets_;  // pages to send next, per region
  PageHashes hashes_;
  uint64_t session_id_;
  Mailbox box_;
  std::unique_ptr<ControlReader> reader_;
  std::unique_ptr<FrameSender> sender_;
  std::atomic<bool> peer_aborted_{false};
  DirtyTracker* tracker_ = nullptr;
  bool tracking_ = false;
  MigrationReport report_;
  Clock::time_point t0_ = Clock::now();
  Clock::time_point last_progress_{};
  std::vector<std::byte> buf_;
  std::vector<CodecKind> codec_;  // per region
  FrameEncoder encoder_;
  std::vector<std::byte> encoded_;
};

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
    }
    rc.codec = std::string(CodecKindName(codec_[i]));
    report_.codecs.push_back(rc);
  }
  return Status::Ok();
}

Status Source::Interrupted() {
  if (opt_.cancel && opt_.cancel->load()) return Aborted("cancelled by the user");
  if (peer_aborted_.load()) return Unavailable("destination aborted");
  Status f = box_.failure();
  if (!f.ok()) return f;
  return Status::Ok();
}

Result<v1::Envelope> Source::Await(v1::Envelope::MsgCase want, const char* what) {
  GM_ASSIGN_OR_RETURN(v1::Envelope env, box_.Next(Clock::now() + opt_.peer_timeout, opt_.cancel, what));
  if (env.has_abort()) {
    return Aborted(fmt::format("destination aborted in phase {}: {}", env.abort().phase(), env.abort().reason()));
  }
  if (env.msg_case() != want) {
    return Corrupt(fmt::format("protocol error: expected {}, got {}", what, wire::EnvelopeKind(env)));
  }
  return env;
}

Status Source::Handshake() {
  v1::Envelope hello;
  hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
  hello.mutable_hello()->set_product_version(GPUMIGRATE_VERSION);
  GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, hello));
  GM_ASSIGN_OR_RETURN(v1::Envelope peer, Await(v1::Envelope::kHello, "Hello"));
  GM_RETURN_IF_ERROR(wire::CheckHello(peer.hello()));
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
  GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, env));
  GM_ASSIGN_OR_RETURN(v1::Envelope ready, Await(v1::Envelope::kReady, "Ready"));
  (void)ready;
  return Status::Ok();
}

void Source::ReportProgress(gpumigrate::Phase p, uint32_t round, uint64_t total, uint64_t done, bool force) {
  if (!opt_.on_progress) return;
  auto now = Clock::now();
  if (!force && now - last_progress_ < std::chrono::milliseconds(100)) return;
  last_progress_ = now;
  Progress pr;
  pr.phase = p;
  pr.round = round;
  pr.round_bytes_total = total;
  pr.round_bytes_done = done;
  pr.bytes_sent = sender_ ? sender_->bytes_sent() : 0;
  pr.elapsed_s = std::chrono::duration<double>(now - t0_).count();
  opt_.on_progress(pr);
}

// Sends every page marked in sets_ (and clears the marks). Round 0 skips zero
// pages: a fresh destination already holds zeros there.
Status Source::SendSet(uint32_t round, bool skip_zero, RoundReport& rr) {
  uint64_t total = 0;
  for (size_t i = 0; i < regions_.size(); ++i) total += sets_[i].Count() * regions_[i].page_size;
  rr.dirty_bytes = total;
  uint64_t done = 0;
  uint64_t sent_before = sender_->bytes_sent();
  const gpumigrate::Phase phase = rr.final ? gpumigrate::Phase::kSwitchover : gpumigrate::Phase::kRoundStart;
  PageClassifier pages;  // zero-page elision and per-page hashes, chunk by chunk
  for (size_t i : order_) {
    const RegionInfo& r = regions_[i];
    DirtyBitmap& set = sets_[i];
    const uint64_t ps = r.page_size;
    const uint64_t max_pages = std::max<uint64_t>(1, opt_.max_frame_payload_bytes / ps);
    for (uint64_t p = set.NextSet(0); p < r.pages(); p = set.NextSet(p)) {
      uint64_t run_end = set.NextClear(p);
      while (p < run_end) {
        GM_RETURN_IF_ERROR(Interrupted());
        uint64_t n = std::min(run_end - p, max_pages);
        uint64_t off = p * ps;
        uint64_t len = std::min(n * ps, r.size_bytes - off);
        buf_.resize(len);
        GM_RETURN_IF_ERROR(dev_.Read(r.id, off, buf_).WithContext(fmt::format("read region {}", r.name)));
        pages.Classify(buf_, ps);
        for (const PageRun& run : pages.runs()) {
          for (uint64_t k = run.first_page; k < run.first_page + run.pages; ++k) {
            hashes_.Set(i, p + k, pages.hashes()[k]);
          }
          if (run.zero) {
            rr.zero_pages += run.pages;
            if (!skip_zero) {
              GM_RETURN_IF_ERROR(sender_->Send(wire::FrameType::kZeroPages, r.id, round, off + run.offset_bytes,
                                               static_cast<uint32_t>(run.length_bytes), {}));
            }
          } else {
            rr.pages_sent += run.pages;
            auto raw = std::span<const std::byte>(buf_).subspan(run.offset_bytes, run.length_bytes);
            CodecKind used = encoder_.Encode(codec_[i], opt_.codec.level, raw, encoded_);
            auto payload = used == CodecKind::kNone ? raw : std::span<const std::byte>(encoded_);
            rr.raw_bytes += run.length_bytes;
            rr.payload_bytes += payload.size();
            GM_RETURN_IF_ERROR(sender_->Send(wire::FrameType::kPages, r.id, round, off + run.offset_bytes,
                                             static_cast<uint32_t>(run.length_bytes), payload,
                                             static_cast<uint8_t>(used)));
          }
        }
        for (uint64_t q = p; q < p + n; ++q) set.Clear(q);
        done += n * ps;
        p += n;
        ReportProgress(phase, round, total, done, false);
      }
    }
  }
  rr.bytes = sender_->bytes_sent() - sent_before;
  return Status::Ok();
}

Status Source::SyncAll(uint64_t* dirty_bytes) {
  *dirty_bytes = 0;
  for (size_t i = 0; i < regions_.size(); ++i) {
    GM_RETURN_IF_ERROR(tracker_->Sync(regions_[i].id, sets_[i]).WithContext("dirty sync"));
    *dirty_bytes += sets_[i].Count() * regions_[i].page_size;
  }
  return Status::Ok();
}

Status Source::SendDeviceState(uint32_t round, uint64_t* state_bytes) {
  GM_ASSIGN_OR_RETURN(std::vector<std::byte> blob, dev_.SaveState());
  *state_bytes = blob.size();
  uint64_t off = 0;
  do {
    uint64_t n = std::min<uint64_t>(blob.size() - off, opt_.max_frame_payload_bytes);
    GM_RETURN_IF_ERROR(sender_->Send(wire::FrameType::kDeviceState, wire::kDeviceStateRegion, round, off,
                                     static_cast<uint32_t>(n), std::span(blob).subspan(off, n)));
    off += n;
  } while (off < blob.size());
  return Status::Ok();
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
// Abort before it closes its streams, so the broken stream is usually its echo).
// A connection that broke with no Abort says the destination closed it, and when.
Status Source::Explain(Status st, const std::string& phase) {
  const bool peer_first = peer_aborted_.load();
  if (peer_first || st.code() == StatusCode::kUnavailable) {
    if (auto abort = box_.PeerAbort(Clock::now() + std::chrono::seconds(1))) {
      std::string peer = fmt::format("destination aborted in phase {}: {}", abort->phase(), abort->reason());
      if (peer_first) return Aborted(peer).WithContext(fmt::format("migration aborted in {}", phase));
      return Aborted(fmt::format("the destination closed the connection during {}: {} (here: {})", phase, peer,
                                 st.message()));
    }
  }
  if (st.code() == StatusCode::kUnavailable) {
    return Unavailable(fmt::format("the destination closed the connection during {}: {}", phase, st.message()));
  }
  return st.WithContext(fmt::format("migration aborted in {}", phase));
}

MigrationReport Source::Fail(Status st, const std::string& phase) {
  st = Explain(std::move(st), phase);
  v1::Envelope abort;
  abort.mutable_abort()->set_reason(st.message());
  abort.mutable_abort()->set_phase(phase);
  (void)wire::SendEnvelope(*streams_.control, abort);  // best effort: the peer may be gone
  CloseAll();
  if (tracking_) (void)tracker_->Stop();
  report_.outcome = Outcome::kAborted;
  report_.failed_phase = phase;
  report_.bytes_sent = sender_ ? sender_->bytes_sent() : 0;
  report_.status = st;
  DeviceState s = dev_.State();
  if (s == DeviceState::kPreCopy || s == DeviceState::kStopCopy || s == DeviceState::kStop) {
    Status back = dev_.SetState(DeviceState::kRunning);
    if (!back.ok()) {
      report_.status = Internal(fmt::format("{}; and returning the source to RUNNING failed: {}",
                                            report_.status.message(), back.message()));
      report_.resolution = "the source device could not be resumed: inspect it before anything else";
      return report_;
    }
  }
  report_.resolution = "the source is RUNNING with its memory intact; the destination discarded what it received";
  if (st.code() == StatusCode::kAborted && st.message().find("drain-and-replace") != std::string::npos) {
    report_.resolution += "; live migration will not converge at this bandwidth: drain-and-replace recommended";
  }
  report_.total_ms = MsBetween(t0_, Clock::now());
  return report_;
}

// The probe ends where the switchover decision is made: abort on purpose; the
// source never stopped, the destination discards what it received.
MigrationReport Source::FinishProbe(const PolicyResult& decision) {
  v1::Envelope abort;
  abort.mutable_abort()->set_reason("dry run complete: the probe stops before switchover");
  abort.mutable_abort()->set_phase("dry run");
  (void)wire::SendEnvelope(*streams_.control, abort);
  CloseAll();
  if (tracking_) (void)tracker_->Stop();
  tracking_ = false;
  report_.dry_run = true;
  report_.would_switch = decision.decision == Decision::kSwitchover;
  report_.predicted_stun_ms = decision.predicted_stun_ms;
  report_.switchover_reason = decision.reason;
  report_.outcome = Outcome::kAborted;
  report_.failed_phase.clear();
  report_.bytes_sent = sender_->bytes_sent();
  report_.total_ms = MsBetween(t0_, Clock::now());
  Status back = dev_.SetState(DeviceState::kRunning);
  report_.status = back.ok() ? Status::Ok() : back.WithContext("dry run: resuming the source failed");
  report_.resolution = "dry run: the source kept running; the destination discarded what it received";
  return report_;
}

MigrationReport Source::InDoubt(Status st, const std::string& phase) {
  if (st.code() == StatusCode::kUnavailable) {
    st = Unavailable(fmt::format("the destination closed the connection during {}: {}", phase, st.message()));
  }
  CloseAll();
  if (tracking_) (void)tracker_->Stop();
  if (dev_.State() != DeviceState::kStop) (void)dev_.SetState(DeviceState::kStop);
  report_.outcome = Outcome::kInDoubt;
  report_.bytes_sent = sender_->bytes_sent();
  report_.failed_phase = phase;
  report_.status = Status(StatusCode::kInDoubt,
                          fmt::format("commit sent but not confirmed ({}): outcome in doubt", st.message()));
  report_.resolution =
      "both sides are stopped and the source state is intact; neither resumes on its own. Check the destination: if "
      "it is RUNNING, release the source; otherwise discard the destination and resume the source (device state "
      "STOP -> RUNNING)";
  report_.total_ms = MsBetween(t0_, Clock::now());
  return report_;
}

MigrationReport Source::Run() {
  if (streams_.control == nullptr || streams_.data.empty()) {
    report_.status = InvalidArgument("session: need a control stream and at least one data stream");
    return report_;
  }
  if (dev_.State() != DeviceState::kRunning) {
    report_.status = FailedPrecondition(
        fmt::format("session: source device is {}, expected RUNNING", DeviceStateName(dev_.State())));
    return report_;
  }
  tracker_ = dev_.Tracker();
  if (tracker_ == nullptr) {
    report_.status = Unimplemented("session: the device has no dirty tracker");
    return report_;
  }
  FrameKeys keys;
  keys.integrity_key = session_id_;
  if (opt_.aes_key) {
    keys.aes_gcm = true;
    keys.aes_key = *opt_.aes_key;
  }
  sender_ = std::make_unique<FrameSender>(streams_.data, keys, opt_.bandwidth_limit_bytes_per_s);
  reader_ = std::make_unique<ControlReader>(streams_.control, &box_, [this](const v1::Abort&) {
    // Stop sending at once; Fail() picks up the reason from the mailbox.
    peer_aborted_ = true;
    for (Stream* s : streams_.data) s->Close();
  });

  Phase(Phase::kHandshake, 0);
  if (Status st = Handshake(); !st.ok()) return Fail(st, "handshake");

  if (Status st = dev_.SetState(DeviceState::kPreCopy); !st.ok()) return Fail(st, "handshake");
  if (Status st = tracker_->Start(); !st.ok()) return Fail(st, "handshake");
  tracking_ = true;
  for (auto& s : sets_) s.SetAll();

  std::vector<uint64_t> dirty_history;
  uint32_t round = 0;
  PolicyResult decision;
  while (true) {
    Phase(Phase::kRoundStart, round);
    RoundReport rr;
    rr.round = round;
    auto rs = Clock::now();
    if (Status st = SendSet(round, round == 0, rr); !st.ok()) return Fail(st, fmt::format("pre-copy round {}", round));
    v1::Envelope end;
    end.mutable_round_end()->set_round(round);
    for (uint64_t f : sender_->frames_per_stream()) end.mutable_round_end()->add_frames_per_stream(f);
    if (Status st = wire::SendEnvelope(*streams_.control, end); !st.ok()) {
      return Fail(st, fmt::format("pre-copy round {}", round));
    }
    // Wait until the destination has applied the round: rounds are timed end to
    // end, and nothing is left in flight to lengthen a stun.
    if (auto r = Await(v1::Envelope::kRoundApplied, "RoundApplied"); !r.ok()) {
      return Fail(r.status(), fmt::format("pre-copy round {}", round));
    }
    rr.ms = MsBetween(rs, Clock::now());
    report_.rounds.push_back(rr);
    Phase(Phase::kRoundEnd, round);

    uint64_t dirty = 0;
    if (Status st = SyncAll(&dirty); !st.ok()) return Fail(st, fmt::format("pre-copy round {}", round));
    dirty_history.push_back(dirty);
    double bw = MeasuredBandwidth(report_.rounds);
    report_.bandwidth_bytes_per_s = bw;

    PolicyInput in;
    in.dirty_bytes_history = dirty_history;
    in.device_state_bytes = dev_.Pending().stop_copy_bytes;
    in.bandwidth_bytes_per_s = bw;
    in.rounds_done = round + 1;
    in.max_rounds = opt_.max_rounds;
    in.downtime_target = opt_.downtime_target;
    in.max_stun = opt_.max_stun;
    in.fixed_cost = opt_.switchover_fixed_cost;
    in.switch_when_not_converging = opt_.switch_when_not_converging;
    decision = DecideSwitchover(in);
    if (opt_.dry_run && decision.decision != Decision::kContinue) return FinishProbe(decision);
    if (decision.decision == Decision::kSwitchover) break;
    if (decision.decision == Decision::kAbort) {
      report_.predicted_stun_ms = decision.predicted_stun_ms;
      report_.switchover_reason = decision.reason;
      return Fail(Aborted(decision.reason), fmt::format("pre-copy round {}", round));
    }
    ++round;
  }
  report_.predicted_stun_ms = decision.predicted_stun_ms;
  report_.switchover_reason = decision.reason;
  const uint32_t final_round = round + 1;

  // --- Switchover: the stun starts when the device stops. ---
  Phase(Phase::kSwitchover, final_round);
  auto& bd = report_.stun_breakdown_ms;
  auto t_stun = Clock::now();
  if (Status st = dev_.SetState(DeviceState::kStopCopy); !st.ok()) return Fail(st, "switchover: stop device");
  auto t1 = Clock::now();
  bd.emplace_back("stop_device", MsBetween(t_stun, t1));
  uint64_t final_dirty = 0;
  if (Status st = SyncAll(&final_dirty); !st.ok()) return Fail(st, "switchover: final sync");
  auto t2 = Clock::now();
  bd.emplace_back("final_sync", MsBetween(t1, t2));
  RoundReport fr;
  const uint64_t sent_before_final = sender_->bytes_sent();
  fr.round = final_round;
  fr.final = true;
  if (Status st = SendSet(final_round, false, fr); !st.ok()) return Fail(st, "switchover: final data");
  // The final data phase ends when the bytes are on the streams, not when queued.
  if (Status st = sender_->Flush(); !st.ok()) return Fail(st, "switchover: final data");
  auto t3 = Clock::now();
  fr.ms = MsBetween(t2, t3);
  bd.emplace_back("final_data", fr.ms);
  uint64_t state_bytes = 0;
  if (Status st = SendDeviceState(final_round, &state_bytes); !st.ok()) return Fail(st, "switchover: device state");
  auto t4 = Clock::now();
  bd.emplace_back("device_state", MsBetween(t3, t4));
  fr.bytes = sender_->bytes_sent() - sent_before_final;
  report_.rounds.push_back(fr);
  if (opt_.verify_full) {
    if (Status st = VerifyFull(); !st.ok()) return Fail(st, "switchover: verify full");
  }
  // Everything is read: STOP_COPY -> STOP, as a VFIO source does once its data is
  // drained. From STOP a backend may hold the workload stopped even if this
  // process dies (the proc shim does): Commit can only follow from here.
  if (Status st = dev_.SetState(DeviceState::kStop); !st.ok()) return Fail(st, "switchover: stop device");
  auto t5 = Clock::now();
  if (opt_.verify_full) bd.emplace_back("verify_full", MsBetween(t4, t5));

  v1::Envelope prep;
  auto* p = prep.mutable_prepare();
  p->set_final_round(final_round);
  for (uint64_t f : sender_->frames_per_stream()) p->add_frames_per_stream(f);
  for (size_t i = 0; i < regions_.size(); ++i) {
    auto* d = p->add_digests();
    d->set_region(regions_[i].id);
    d->set_digest(hashes_.RegionDigest(i));
  }
  p->set_device_state_bytes(state_bytes);
  if (Status st = wire::SendEnvelope(*streams_.control, prep); !st.ok()) return Fail(st, "switchover: prepare");
  Phase(Phase::kPrepareSent, final_round);
  if (auto r = Await(v1::Envelope::kPrepared, "Prepared"); !r.ok()) return Fail(r.status(), "switchover: prepare");
  auto t6 = Clock::now();
  bd.emplace_back("prepare_verify", MsBetween(t5, t6));
  Phase(Phase::kPreparedReceived, final_round);

  // --- Point of no return: from here a failure leaves the outcome in doubt. ---
  v1::Envelope commit;
  commit.mutable_commit();
  if (Status st = wire::SendEnvelope(*streams_.control, commit); !st.ok()) return InDoubt(st, "commit");
  Phase(Phase::kCommitSent, final_round);
  if (auto r = Await(v1::Envelope::kRunning, "Running"); !r.ok()) return InDoubt(r.status(), "commit");
  auto t7 = Clock::now();
  bd.emplace_back("commit_resume", MsBetween(t6, t7));
  report_.stun_ms = MsBetween(t_stun, t7);

  // The slow tidy-up happens after the stun.
  (void)tracker_->Stop();
  tracking_ = false;  // the device stays in STOP: the destination owns the workload now
  CloseAll();
  report_.outcome = Outcome::kCompleted;
  report_.verified = true;
  report_.bytes_sent = sender_->bytes_sent();
  uint64_t raw = 0, payload = 0;
  for (const auto& r : report_.rounds) {
    raw += r.raw_bytes;
    payload += r.payload_bytes;
  }
  report_.compression_ratio = payload ? static_cast<double>(raw) / static_cast<double>(payload) : 1.0;
  report_.total_ms = MsBetween(t0_, Clock::now());
  for (size_t i = 0; i < sender_->frames_per_stream().size(); ++i) {
    MigrationReport::StreamStat st;
    st.stream = static_cast<uint32_t>(i);
    st.frames = sender_->frames_per_stream()[i];
    st.bytes = sender_->bytes_per_stream()[i];
    st.bytes_per_s = report_.total_ms > 0 ? static_cast<double>(st.bytes) / (report_.total_ms / 1e3) : 0;
    report_.streams.push_back(st);
  }
  report_.total_ms = MsBetween(t0_, Clock::now());
  Phase(Phase::kCompleted, final_round);
  ReportProgress(Phase::kCompleted, final_round, 0, 0, true);
  return report_;
}

}  // namespace

MigrationReport RunSource(Device& device, const SessionStreams& streams, const SourceOptions& options) {
  Source s(device, streams, options);
  return s.Run();
}

}  // namespace gpumigrate
