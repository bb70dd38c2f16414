// The destination side of a migration: check the manifest, apply frames from
// every data stream (never letting an older round overwrite a newer one), verify
// digests at Prepare, and resume only on Commit.
//
// Receiver states:  HELLO -> MANIFEST -> RECEIVING -> PREPARED -> RUNNING
//                   any state before PREPARED -> DISCARDED (device ERROR)
//                   PREPARED -> IN_DOUBT (connection lost: stay stopped, keep state)
#include <array>
#include <cstring>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "engine/session/content_fill.h"
#include "engine/session/frame_receiver.h"
#include "engine/session/liveness.h"
#include "engine/session/mailbox.h"
#include "engine/session/page_hashes.h"
#include "engine/session/state_stream.h"
#include "gpumigrate/session/session.h"
#include "transport/crypto/frame_protector.h"
#include "transport/wire/control_channel.h"
#include "transport/wire/frame.h"

namespace gpumigrate {
namespace {

namespace v1 = wire::v1;

constexpr uint32_t kMaxFramePayloadBytes = 64 << 20;

class Destination {
 public:
  Destination(Device& dev, const SessionStreams& streams, const DestinationOptions& opt)
      : dev_(dev), streams_(streams), opt_(opt), clock_(opt.clock ? *opt.clock : SystemClock()),
        regions_(dev.Regions()), hashes_(regions_), box_(std::make_unique<Mailbox>(clock_)),
        writer_(std::make_unique<ControlWriter>(streams.control, clock_)), t0_(clock_.Now()) {
    for (const auto& r : regions_) last_round_.emplace_back(r.pages(), 0);
    report_.device = dev.Describe();
    for (const auto& r : regions_) report_.device_bytes += r.size_bytes;
  }
  ~Destination() { Shutdown(); }

  MigrationReport Run();

 private:
  Status Start();
  Status Handshake();
  Status CheckManifest(const v1::Manifest& m);
  Status OnRoundEnd(const v1::RoundEnd& end);
  Status OnPrepare(const v1::Prepare& p);
  Status Prepare(const v1::Prepare& p);
  Status WaitForFrames(const google::protobuf::RepeatedField<uint64_t>& counts, const char* what);
  Status Apply(const wire::FrameHeader& h, std::span<const std::byte> payload);
  Status ApplyDigests(const wire::FrameHeader& h, std::span<const std::byte> digests, size_t idx);
  Result<v1::Envelope> Next(const char* what);
  void EnterPhase(Phase p, uint32_t round) {
    phase_ = p;
    if (live_) live_->Doing(fmt::format("{} (round {})", PhaseName(p), round));
    if (opt_.on_phase) opt_.on_phase(p, round);
  }
  // Where the migration stands: reported on failure, named in our keepalives.
  void At(StepAt a) {
    at_ = a;
    if (live_) live_->Doing(StepName(a));
  }
  void Shutdown() {
    if (reader_) reader_->StopQuietly();
    if (receiver_) receiver_->StopQuietly();
    if (live_) live_->StopQuietly();
    streams_.control->Close();
    for (Stream* s : streams_.data) s->Close();
    if (receiver_) receiver_->Join();
    if (live_) live_->Join();
    reader_.reset();
  }
  MigrationReport Teardown(Outcome outcome, Status st, bool tell_peer);
  void StartControl();
  void StartReceiver();
  uint32_t Workers() {
    report_.destination_workers = opt_.workers ? *opt_.workers
                                               : DefaultDestinationWorkers(std::thread::hardware_concurrency(),
                                                                           static_cast<uint32_t>(streams_.data.size()));
    return *report_.destination_workers;
  }
  void StopLink();
  bool Resumable(const Status& st) const;
  Status Resume(Status st);
  uint64_t BytesReceived() const { return link_bytes_before_ + (receiver_ ? receiver_->bytes_received() : 0); }
  uint64_t FramesTotal() const { return receiver_ ? receiver_->frames_total() : 0; }

  Device& dev_;
  SessionStreams streams_;
  const DestinationOptions& opt_;
  Clock& clock_;
  std::vector<RegionInfo> regions_;
  PageHashes hashes_;
  std::vector<std::vector<uint32_t>> last_round_;  // round + 1 that last wrote each page; 0 = never
  std::array<std::mutex, 256> stripes_;            // guard a page's write, hash and last_round together
  StateStreamReceiver state_{dev_};  // the device's own state, blob or stream
  FrameKeys keys_;
  uint32_t max_payload_ = 0;
  bool prepared_ = false;
  bool resuming_ = false;  // the device entered RESUMING: a failure must discard
  uint32_t rounds_ = 0;    // pre-copy rounds applied
  StepAt at_;
  // One connection's parts: replaced together when the source resumes over a new one.
  std::unique_ptr<Mailbox> box_;
  std::unique_ptr<ControlWriter> writer_;
  std::unique_ptr<ControlReader> reader_;
  std::unique_ptr<FrameReceiver> receiver_;
  std::atomic<uint64_t> work_{0};   // bytes applied: the progress our keepalives report
  Phase phase_ = Phase::kHandshake;  // the last EnterPhase's, for on_progress
  std::unique_ptr<Liveness> live_;
  MigrationReport report_;
  Clock::TimePoint t0_;
  // Resumable pre-copy.
  bool source_resumes_ = false;   // the source's Hello listed `resume` (and we can wait for it)
  bool source_keepalive_ = false;
  uint32_t rounds_applied_ = 0;   // rounds whose every frame was applied
  uint64_t bytes_applied_ = 0;    // bytes of those rounds
  uint64_t link_bytes_before_ = 0;
  std::vector<uint64_t> frames_applied_;  // per data stream of the broken connection
  std::atomic<bool> device_failed_{false};  // a device write failed (set by the receiving threads)
  std::mutex device_mu_;
  Status device_error_;  // the first such failure, under device_mu_
  // Records a failed device write (never resumed: not the link's fault) and returns it.
  Status DeviceFailed(Status w) {
    std::lock_guard lk(device_mu_);
    if (device_error_.ok()) device_error_ = w;
    device_failed_ = true;
    return w;
  }
  std::unique_ptr<ContentFill> content_;     // receive --content-store: opened at the manifest
};

Result<v1::Envelope> Destination::Next(const char* what) {
  // The deadline is for silence: frames arriving on data streams count as activity.
  auto last_activity = clock_.Now();
  uint64_t last_frames = FramesTotal();
  const auto slice = opt_.on_progress ? std::chrono::milliseconds(250) : std::chrono::milliseconds(1000);
  while (true) {
    auto r = box_->Next(clock_.Now() + slice, opt_.cancel, what);
    if (opt_.on_progress) {
      Progress p;
      p.phase = phase_;
      p.round = rounds_;
      p.bytes_sent = work_.load();  // applied
      p.elapsed_s = MsBetween(t0_, clock_.Now()) / 1e3;
      opt_.on_progress(p);
    }
    if (r.ok() || r.status().code() != StatusCode::kDeadlineExceeded) return r;
    if (!box_->failure().ok()) return r;  // the watchdog's verdict, not the end of a slice
    uint64_t f = FramesTotal();
    if (f != last_frames) {
      last_frames = f;
      last_activity = clock_.Now();
    } else if (clock_.Now() - last_activity > opt_.peer_timeout) {
      return r;
    }
  }
}

Status Destination::Handshake() {
  GM_ASSIGN_OR_RETURN(v1::Envelope hello, Next("Hello"));
  if (!hello.has_hello()) return Corrupt(fmt::format("protocol error: expected Hello, got {}", wire::EnvelopeKind(hello)));
  GM_RETURN_IF_ERROR(wire::CheckHello(hello.hello()));
  std::vector<std::string> caps = DecodeCapabilities();
  caps.push_back(wire::kCapKeepalive);
  const bool can_resume = opt_.reaccept && opt_.resume_window > std::chrono::nanoseconds(0);
  if (can_resume) caps.push_back(wire::kCapResume);
  if (!opt_.content_store_dir.empty()) caps.push_back(wire::kCapContentStore);
  GM_RETURN_IF_ERROR(writer_->Send(wire::MakeHello(GPUMIGRATE_VERSION, caps)));
  for (const auto& cap : hello.hello().capabilities()) {
    if (cap == wire::kCapKeepalive) {
      source_keepalive_ = true;
      live_->PeerSpeaksKeepalive();
    }
    if (cap == wire::kCapResume) source_resumes_ = can_resume;
  }
  GM_ASSIGN_OR_RETURN(v1::Envelope m, Next("Manifest"));
  if (!m.has_manifest()) return Corrupt(fmt::format("protocol error: expected Manifest, got {}", wire::EnvelopeKind(m)));
  GM_RETURN_IF_ERROR(CheckManifest(m.manifest()));
  if (opt_.content_store_dir.empty()) return Status::Ok();
  // Indexing a store that changed can take a while: its progress keeps the source waiting.
  if (live_) live_->Doing("indexing the content store");
  GM_ASSIGN_OR_RETURN(content_, ContentFill::Open(opt_.content_store_dir, regions_, [this](uint64_t n) {
                        work_.fetch_add(n, std::memory_order_relaxed);
                      }));
  report_.content_store_pages = content_->indexed_pages();
  return Status::Ok();
}

Status Destination::CheckManifest(const v1::Manifest& m) {
  if (m.cipher() == v1::CIPHER_AES_256_GCM) {
    if (!opt_.aes_key) {
      return InvalidArgument("manifest: the source encrypts with AES-256-GCM but this side has no session key (no TLS)");
    }
    keys_.aes_gcm = true;
    keys_.aes_key = *opt_.aes_key;
  } else if (m.cipher() == v1::CIPHER_NONE_INTEGRITY_ONLY) {
    if (opt_.aes_key) {
      return InvalidArgument("manifest: the source asks for unencrypted frames but this side requires AES-256-GCM");
    }
  } else {
    return InvalidArgument(fmt::format("manifest: cipher {} is not supported", v1::Cipher_Name(m.cipher())));
  }
  if (m.data_streams() != streams_.data.size()) {
    return InvalidArgument(fmt::format("manifest: source uses {} data streams, this side has {}", m.data_streams(),
                                       streams_.data.size()));
  }
  if (m.max_frame_payload_bytes() == 0 || m.max_frame_payload_bytes() > kMaxFramePayloadBytes) {
    return InvalidArgument(fmt::format("manifest: max frame payload {} is outside 1..{}", m.max_frame_payload_bytes(),
                                       kMaxFramePayloadBytes));
  }
  if (static_cast<size_t>(m.regions_size()) != regions_.size()) {
    return InvalidArgument(fmt::format("manifest: source has {} regions, destination device has {}",
                                       m.regions_size(), regions_.size()));
  }
  for (const auto& wr : m.regions()) {
    const RegionInfo* r = FindRegion(regions_, wr.id());
    if (r == nullptr) return InvalidArgument(fmt::format("manifest: destination has no region {} ({})", wr.id(), wr.name()));
    if (r->size_bytes != wr.size_bytes() || r->page_size != wr.page_size()) {
      return InvalidArgument(fmt::format(
          "manifest: region {} does not fit: source {} bytes in {}-byte pages, destination {} bytes in {}-byte pages",
          wr.name(), wr.size_bytes(), wr.page_size(), r->size_bytes, r->page_size));
    }
  }
  keys_.integrity_key = m.session_id();
  max_payload_ = m.max_frame_payload_bytes();
  return Status::Ok();
}

Status Destination::Apply(const wire::FrameHeader& h, std::span<const std::byte> payload) {
  work_.fetch_add(payload.size() + 1, std::memory_order_relaxed);
  box_->PeerProgressed();
  if (h.type == wire::FrameType::kDeviceState) return state_.Apply(h, payload);
  size_t idx = 0;
  while (regions_[idx].id != h.region) ++idx;  // checked to exist by the caller
  if (h.type == wire::FrameType::kPageDigests) return ApplyDigests(h, payload, idx);
  const RegionInfo& r = regions_[idx];
  const uint64_t ps = r.page_size;
  for (uint64_t off = 0; off < h.raw_length; off += ps) {
    uint64_t page = (h.offset + off) / ps;
    uint64_t len = std::min<uint64_t>(ps, h.raw_length - off);
    std::lock_guard lk(stripes_[(page ^ (uint64_t{idx} << 20)) % stripes_.size()]);
    uint32_t& last = last_round_[idx][page];
    if (h.round + 1 < last) continue;  // a newer copy already arrived on another stream
    if (h.type == wire::FrameType::kPages) {
      auto bytes = payload.subspan(off, len);
      if (Status w = dev_.Write(r.id, h.offset + off, bytes); !w.ok()) return DeviceFailed(w);
      hashes_.Set(idx, page, HashPage(bytes));
    } else {
      if (Status w = dev_.WriteZeros(r.id, h.offset + off, len); !w.ok()) return DeviceFailed(w);
      hashes_.SetZero(idx, page);
    }
    last = h.round + 1;
  }
  return Status::Ok();
}

// Pages offered by SHA-256: each filled from the content store (its bytes read
// and their digest checked there), or left as it was and named in the answer,
// which goes before this frame counts as applied, so before the round's
// RoundApplied. Nothing of the store goes back: only which pages missed.
Status Destination::ApplyDigests(const wire::FrameHeader& h, std::span<const std::byte> digests, size_t idx) {
  const RegionInfo& r = regions_[idx];
  const uint64_t ps = r.page_size;
  const uint64_t first = h.offset / ps;
  const uint32_t pages = static_cast<uint32_t>(h.raw_length / ps);
  v1::Envelope answer;
  auto* a = answer.mutable_content_answer();
  a->set_round(h.round);
  a->set_region(r.id);
  a->set_first_page(first);
  a->set_pages(pages);
  // Read from the store first, outside the page locks; then applied page by page.
  thread_local std::vector<ContentDigest> want;
  thread_local std::vector<std::byte> bytes;
  thread_local std::vector<bool> filled;
  want.resize(pages);
  for (uint32_t k = 0; k < pages; ++k) std::memcpy(want[k].data(), digests.data() + size_t{k} * 32, 32);
  bytes.resize(size_t{pages} * ps);
  content_->FillRun(r.page_size, want, bytes, filled);
  for (uint32_t k = 0; k < pages; ++k) {
    if (!filled[k]) {
      a->add_missed(k);
      continue;
    }
    const uint64_t pg = first + k;
    auto page = std::span<const std::byte>(bytes).subspan(size_t{k} * ps, ps);
    std::lock_guard lk(stripes_[(pg ^ (uint64_t{idx} << 20)) % stripes_.size()]);
    uint32_t& last = last_round_[idx][pg];
    if (h.round + 1 < last) continue;  // a newer copy already arrived on another stream
    if (Status w = dev_.Write(r.id, pg * ps, page); !w.ok()) return DeviceFailed(w);
    hashes_.Set(idx, pg, HashPage(page));
    last = h.round + 1;
  }
  content_->Answered(pages);
  return writer_->Send(answer);
}

// Waits until exactly `counts[s]` frames have been applied on each data stream.
Status Destination::WaitForFrames(const google::protobuf::RepeatedField<uint64_t>& counts, const char* what) {
  if (static_cast<size_t>(counts.size()) != streams_.data.size()) {
    return Corrupt(fmt::format("the source counts frames on {} streams, the session has {}", counts.size(),
                               streams_.data.size()));
  }
  GM_RETURN_IF_ERROR(box_->WaitFor(
      [&] {
        for (size_t s = 0; s < streams_.data.size(); ++s) {
          if (receiver_->frames(s) < counts[static_cast<int>(s)]) return false;
        }
        return true;
      },
      clock_.Now() + opt_.peer_timeout, opt_.cancel, what));
  for (size_t s = 0; s < streams_.data.size(); ++s) {
    if (receiver_->frames(s) != counts[static_cast<int>(s)]) {
      return Corrupt(fmt::format("data stream {} carried {} frames, the source sent {}", s, receiver_->frames(s),
                                 counts[static_cast<int>(s)]));
    }
  }
  return Status::Ok();
}

Status Destination::Prepare(const v1::Prepare& p) {
  // Every frame the source sent must have been applied first.
  GM_RETURN_IF_ERROR(WaitForFrames(p.frames_per_stream(), "the last frames"));
  if (static_cast<size_t>(p.digests_size()) != regions_.size()) {
    return Corrupt(fmt::format("Prepare has {} digests for {} regions", p.digests_size(), regions_.size()));
  }
  for (const auto& d : p.digests()) {
    size_t idx = 0;
    while (idx < regions_.size() && regions_[idx].id != d.region()) ++idx;
    if (idx == regions_.size()) return Corrupt(fmt::format("Prepare has a digest for unknown region {}", d.region()));
    uint64_t mine = hashes_.RegionDigest(idx);
    if (mine != d.digest()) {
      return Corrupt(fmt::format("verify failed: region {} digest {:016x} differs from the source's {:016x}",
                                 regions_[idx].name, mine, d.digest()));
    }
  }
  GM_RETURN_IF_ERROR(state_.Finish(p.device_state_bytes()));
  GM_RETURN_IF_ERROR(dev_.SetState(DeviceState::kStop));
  report_.verified = true;
  return Status::Ok();
}

// Every migration ends here. Before Prepared a failure discards what arrived
// (the source runs on); after Prepared the device holds the verified state and
// stays stopped: in doubt. The device's LoadCleanup hook runs last.
MigrationReport Destination::Teardown(Outcome outcome, Status st, bool tell_peer) {
  const std::string step = StepName(at_);
  bool closed = false;
  // The liveness watchdog closed the streams: a broken stream is the echo of its reason.
  if (Status f = box_->failure(); f.code() == StatusCode::kDeadlineExceeded && st.code() == StatusCode::kUnavailable) {
    st = f;
  }
  if (outcome != Outcome::kCompleted && st.code() == StatusCode::kUnavailable) {
    // A stream that broke because the source aborted: report the source's reason;
    // one that broke with no Abort: say the source closed it, and when.
    if (auto abort = box_->PeerAbort(clock_.Now() + std::chrono::seconds(1))) {
      st = Aborted(fmt::format("{} (source aborted in phase {}: {})", st.message(), abort->phase(), abort->reason()));
      tell_peer = false;
    } else {
      st = Unavailable(fmt::format("the source closed the connection during {}: {}", step, st.message()));
      closed = true;
    }
  }
  if (tell_peer) (void)writer_->Send(wire::MakeAbort(st.message(), step));
  Shutdown();
  if (outcome != Outcome::kCompleted && prepared_) outcome = Outcome::kInDoubt;
  report_.outcome = outcome;
  report_.bytes_sent = BytesReceived();
  if (outcome == Outcome::kInDoubt) {
    report_.failed_phase = at_;
    report_.status = Status(StatusCode::kInDoubt, fmt::format("prepared but no commit arrived ({}): outcome in doubt",
                                                              st.message()));
    const std::string lost = dev_.LostState();
    report_.resolution =
        lost.empty() ? "this device holds the complete, verified state and stays stopped; neither side resumes on its "
                       "own. If the source is stopped, resume here; if it resumed, discard this device"
                     : fmt::format("{}; resume the source, which holds its state intact", lost);
  } else if (outcome == Outcome::kAborted) {
    report_.failed_phase = at_;
    report_.status = closed ? st : st.WithContext(fmt::format("migration aborted in {}", step));
    report_.verified = false;
    if (!resuming_) {
      // Failed before the device took any data (handshake): nothing to discard.
      report_.resolution = "nothing was received; the source keeps running";
    } else {
      Status discard = dev_.SetState(DeviceState::kError);
      report_.resolution = discard.ok() ? "everything received was discarded; the source keeps running"
                                        : "discarding failed: " + discard.message();
    }
  }
  if (resuming_) report_.source_cleanup = dev_.LoadCleanup(outcome);
  if (content_) {
    report_.dedup_pages = content_->filled_pages();
    report_.dedup_bytes = content_->filled_bytes();
    report_.offered_pages = content_->answered_pages();
  }
  report_.total_ms = MsBetween(t0_, clock_.Now());
  return report_;
}

// Handshake, the device's LoadSetup hook, RESUMING, receivers, Ready.
Status Destination::Start() {
  StartControl();
  At({Step::kHandshake});
  EnterPhase(Phase::kHandshake, 0);
  GM_RETURN_IF_ERROR(Handshake());
  GM_RETURN_IF_ERROR(dev_.LoadSetup().WithContext("device setup"));
  GM_RETURN_IF_ERROR(dev_.SetState(DeviceState::kResuming));
  resuming_ = true;
  StartReceiver();
  v1::Envelope ready;
  ready.mutable_ready()->set_setup_note(dev_.SetupNote());
  return writer_->Send(ready);
}

Status Destination::OnRoundEnd(const v1::RoundEnd& end) {
  rounds_ = end.round() + 1;
  GM_RETURN_IF_ERROR(WaitForFrames(end.frames_per_stream(), "the round's frames"));
  ++rounds_applied_;
  bytes_applied_ = BytesReceived();
  v1::Envelope applied;
  applied.mutable_round_applied()->set_round(end.round());
  GM_RETURN_IF_ERROR(writer_->Send(applied));
  EnterPhase(Phase::kRoundEnd, end.round());
  At({Step::kPreCopy, rounds_});
  return Status::Ok();
}

Status Destination::OnPrepare(const v1::Prepare& p) {
  At({Step::kPrepare});
  EnterPhase(Phase::kPrepareReceived, p.final_round());
  GM_RETURN_IF_ERROR(Prepare(p));
  v1::Envelope ok;
  ok.mutable_prepared();
  GM_RETURN_IF_ERROR(writer_->Send(ok));
  prepared_ = true;
  At({Step::kCommit});
  EnterPhase(Phase::kPreparedSent, p.final_round());
  return Status::Ok();
}

// Pre-copy only (no Prepare seen): a broken connection, not an Abort, a bad
// frame or a device error, with a source that said it will reconnect.
bool Destination::Resumable(const Status& st) const {
  if (!source_resumes_ || prepared_ || at_.step != Step::kPreCopy || device_failed_.load()) return false;
  if (opt_.cancel && opt_.cancel->load()) return false;
  return st.code() == StatusCode::kUnavailable || box_->failure().code() == StatusCode::kDeadlineExceeded;
}

void Destination::StopLink() {
  Shutdown();
  frames_applied_.clear();
  for (size_t st = 0; st < streams_.data.size(); ++st) frames_applied_.push_back(receiver_->frames(st));
  link_bytes_before_ += receiver_->bytes_received();
  receiver_.reset();
  live_.reset();
}

// One connection's parts on streams_: the control reader and liveness, then
// (once the keys are known) the frame receiver.
void Destination::StartControl() {
  reader_ = std::make_unique<ControlReader>(streams_.control, box_.get(), nullptr);
  live_ = SessionLiveness(*writer_, *box_, clock_, streams_, LivenessOf(opt_, "the source"),
                          [this] { return work_.load(std::memory_order_relaxed); });
}

void Destination::StartReceiver() {
  receiver_ = std::make_unique<FrameReceiver>(
      streams_.data, keys_, max_payload_, &regions_,
      [this](const wire::FrameHeader& h, std::span<const std::byte> raw) { return Apply(h, raw); }, box_.get(),
      Workers());
  if (content_) receiver_->AcceptDigests();
  receiver_->Start();
}

// Resumable pre-copy, destination side: the device stays RESUMING with every
// page applied so far (a page of the broken round that arrived is kept; the
// source sends it again under a newer round if it cannot be sure), and the
// source's new connection is awaited for the resume window.
Status Destination::Resume(Status st) {
  // A source that aborts sends Abort before it closes: not a fault to resume.
  if (auto abort = box_->PeerAbort(clock_.Now() + std::chrono::seconds(1))) {
    return Aborted(fmt::format("source aborted in phase {}: {}", abort->phase(), abort->reason()));
  }
  if (Status f = box_->failure(); f.code() == StatusCode::kDeadlineExceeded) st = f;  // the watchdog's reason
  const auto t = clock_.Now();
  const uint32_t round = at_.round;
  EnterPhase(Phase::kReconnecting, round);
  StopLink();
  // Frames of the broken link applied while its receiver stopped: one that
  // failed on the device (its report went quiet with the link) ends it here.
  if (device_failed_.load()) {
    std::lock_guard lk(device_mu_);
    return device_error_.WithContext("applying a frame received before the link broke");
  }
  auto re = opt_.reaccept(opt_.resume_window);
  if (!re.ok() && re.status().code() == StatusCode::kAborted) {
    return Aborted(fmt::format("{} (awaiting the source's resumption after: {})", re.status().message(), st.message()));
  }
  if (!re.ok()) {
    return Status(st.code(), fmt::format("{}; the source did not resume within {:.0f} s: {}", st.message(),
                                         std::chrono::duration<double>(opt_.resume_window).count(),
                                         re.status().message()));
  }
  if (re->streams.control == nullptr || re->streams.data.size() != streams_.data.size()) {
    return InvalidArgument(fmt::format("resume: the new connection has {} data streams, the session {}",
                                       re->streams.data.size(), streams_.data.size()));
  }
  if (keys_.aes_gcm != re->aes_key.has_value()) {
    return InvalidArgument(keys_.aes_gcm ? "resume: the session is encrypted but the new connection has no key"
                                         : "resume: the session is integrity-only but the new connection is keyed");
  }
  if (re->aes_key) keys_.aes_key = *re->aes_key;
  streams_ = re->streams;
  box_ = std::make_unique<Mailbox>(clock_);
  writer_ = std::make_unique<ControlWriter>(streams_.control, clock_);
  StartControl();
  if (source_keepalive_) live_->PeerSpeaksKeepalive();
  StartReceiver();
  GM_ASSIGN_OR_RETURN(v1::Envelope env, Next("Resume"));
  if (!env.has_resume()) {
    return Corrupt(fmt::format("protocol error: expected Resume on the new connection, got {}", wire::EnvelopeKind(env)));
  }
  GM_RETURN_IF_ERROR(writer_->Send(wire::MakeResumed(rounds_applied_, frames_applied_)).WithContext("resume"));
  MigrationReport::Resumption x;
  x.round = round;
  x.reason = st.message();
  x.saved_bytes = bytes_applied_;
  x.reconnect_ms = MsBetween(t, clock_.Now());
  report_.resumptions.push_back(x);
  EnterPhase(Phase::kResumed, env.resume().next_round());
  At({Step::kPreCopy, env.resume().next_round()});
  return Status::Ok();
}

MigrationReport Destination::Run() {
  if (streams_.control == nullptr || streams_.data.empty()) {
    report_.status = InvalidArgument("session: need a control stream and at least one data stream");
    return report_;
  }
  if (dev_.State() != DeviceState::kStop) {
    report_.status = FailedPrecondition(
        fmt::format("session: destination device is {}, expected STOP", DeviceStateName(dev_.State())));
    return report_;
  }
  if (Status st = Start(); !st.ok()) return Teardown(Outcome::kAborted, st, true);
  At({Step::kPreCopy, 0});
  while (true) {
    auto env = Next(prepared_ ? "Commit" : "RoundEnd or Prepare");
    Status st;
    bool tell_peer = true;
    if (!env.ok()) {
      st = env.status();
      tell_peer = !prepared_;
    } else if (env->has_abort()) {
      return Teardown(Outcome::kAborted,
                      Aborted(fmt::format("source aborted in phase {}: {}", env->abort().phase(), env->abort().reason())),
                      false);
    } else if (env->has_round_end() && !prepared_) {
      st = OnRoundEnd(env->round_end());
    } else if (env->has_prepare() && !prepared_) {
      st = OnPrepare(env->prepare());
    } else if (env->has_commit() && prepared_) {
      break;
    } else {
      st = Corrupt(fmt::format("protocol error: unexpected {}", wire::EnvelopeKind(*env)));
    }
    if (st.ok()) continue;
    if (Resumable(st)) {
      st = Resume(std::move(st));
      if (st.ok()) continue;
    }
    return Teardown(Outcome::kAborted, st, tell_peer);
  }
  EnterPhase(Phase::kCommitReceived, rounds_);
  if (Status st = dev_.SetState(DeviceState::kRunning); !st.ok()) return Teardown(Outcome::kAborted, st, false);
  v1::Envelope running;
  running.mutable_running();
  // The device runs here now either way; a lost Running leaves the source in doubt, not us.
  (void)writer_->Send(running);
  // Let the source read Running before the streams close: wait for its close.
  (void)box_->Next(clock_.Now() + std::chrono::seconds(5), nullptr, "the source to close", /*hard_deadline=*/true);
  return Teardown(Outcome::kCompleted, Status::Ok(), false);
}

}  // namespace

MigrationReport RunDestination(Device& device, const SessionStreams& streams, const DestinationOptions& options) {
  Destination d(device, streams, options);
  return d.Run();
}

}  // namespace gpumigrate
