// The destination side of a migration: check the manifest, apply frames from
// every data stream (never letting an older round overwrite a newer one), verify
// digests at Prepare, and resume only on Commit.
//
// Receiver states:  HELLO -> MANIFEST -> RECEIVING -> PREPARED -> RUNNING
//                   any state before PREPARED -> DISCARDED (device ERROR)
//                   PREPARED -> IN_DOUBT (connection lost: stay stopped, keep state)
#include <array>
#include <thread>

#include <fmt/format.h>

#include "engine/session/mailbox.h"
#include "gpumigrate/codec.h"
#include "transport/crypto/frame_protector.h"
#include "engine/session/page_hashes.h"
#include "gpumigrate/session.h"
#include "transport/wire/control_channel.h"
#include "transport/wire/frame.h"

namespace gpumigrate {
namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = wire::v1;

constexpr uint64_t kMaxDeviceStateBytes = 64 << 20;
constexpr uint32_t kMaxFramePayloadBytes = 64 << 20;

double MsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

class Destination {
 public:
  Destination(Device& dev, const SessionStreams& streams, const DestinationOptions& opt)
      : dev_(dev), streams_(streams), opt_(opt), regions_(dev.Regions()), hashes_(regions_),
        frames_(new std::atomic<uint64_t>[streams.data.size()]) {
    for (size_t s = 0; s < streams.data.size(); ++s) frames_[s] = 0;
    for (const auto& r : regions_) last_round_.emplace_back(r.pages(), 0);
    report_.device = dev.Describe();
    for (const auto& r : regions_) report_.device_bytes += r.size_bytes;
  }
  ~Destination() { Shutdown(); }

  MigrationReport Run();

 private:
  Status Handshake();
  Status CheckManifest(const v1::Manifest& m);
  Status Prepare(const v1::Prepare& p);
  Status WaitForFrames(const google::protobuf::RepeatedField<uint64_t>& counts, const char* what);
  void Receive(size_t s);
  Status ReceiveFrame(size_t s, uint64_t seq, std::vector<std::byte>& payload, std::vector<std::byte>& raw,
                      FrameDecoder& decoder, FrameProtector& protector);
  Status Apply(const wire::FrameHeader& h, std::span<const std::byte> payload);
  Result<v1::Envelope> Next(const char* what);
  void Phase(gpumigrate::Phase p, uint32_t round) {
    if (opt_.on_phase) opt_.on_phase(p, round);
  }
  void Shutdown() {
    done_ = true;
    if (reader_) reader_->StopQuietly();
    streams_.control->Close();
    for (Stream* s : streams_.data) s->Close();
    for (auto& t : receivers_) t.join();
    receivers_.clear();
    reader_.reset();
  }
  MigrationReport Fail(Status st, const std::string& phase, bool tell_peer);
  uint64_t FramesTotal() const {
    uint64_t n = 0;
    for (size_t s = 0; s < streams_.data.size(); ++s) n += frames_[s].load();
    return n;
  }

  Device& dev_;
  SessionStreams streams_;
  const DestinationOptions& opt_;
  std::vector<RegionInfo> regions_;
  PageHashes hashes_;
  std::vector<std::vector<uint32_t>> last_round_;  // round + 1 that last wrote each page; 0 = never
  std::array<std::mutex, 256> stripes_;            // guard a page's write, hash and last_round together
  std::unique_ptr<std::atomic<uint64_t>[]> frames_;  // frames applied per stream
  std::atomic<uint64_t> bytes_received_{0};
  std::mutex state_mu_;
  std::vector<std::byte> state_blob_;
  FrameKeys keys_;
  uint32_t max_payload_ = 0;
  std::atomic<bool> done_{false};
  bool prepared_ = false;
  bool resuming_ = false;  // the device entered RESUMING: a failure must discard
  Mailbox box_;
  std::unique_ptr<ControlReader> reader_;
  std::vector<std::thread> receivers_;
  MigrationReport report_;
  Clock::time_point t0_ = Clock::now();
};

Result<v1::Envelope> Destination::Next(const char* what) {
  // The deadline is for silence: frames arriving on data streams count as activity.
  auto last_activity = Clock::now();
  uint64_t last_frames = FramesTotal();
  while (true) {
    auto r = box_.Next(Clock::now() + std::chrono::seconds(1), opt_.cancel, what);
    if (r.ok() || r.status().code() != StatusCode::kDeadlineExceeded) return r;
    uint64_t f = FramesTotal();
    if (f != last_frames) {
      last_frames = f;
      last_activity = Clock::now();
    } else if (Clock::now() - last_activity > opt_.peer_timeout) {
      return r;
    }
  }
}

Status Destination::Handshake() {
  GM_ASSIGN_OR_RETURN(v1::Envelope hello, Next("Hello"));
  if (!hello.has_hello()) return Corrupt(fmt::format("protocol error: expected Hello, got {}", wire::EnvelopeKind(hello)));
  GM_RETURN_IF_ERROR(wire::CheckHello(hello.hello()));
  v1::Envelope mine;
  mine.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
  mine.mutable_hello()->set_product_version(GPUMIGRATE_VERSION);
  for (const std::string& cap : DecodeCapabilities()) mine.mutable_hello()->add_capabilities(cap);
  GM_RETURN_IF_ERROR(wire::SendEnvelope(*streams_.control, mine));
  GM_ASSIGN_OR_RETURN(v1::Envelope m, Next("Manifest"));
  if (!m.has_manifest()) return Corrupt(fmt::format("protocol error: expected Manifest, got {}", wire::EnvelopeKind(m)));
  return CheckManifest(m.manifest());
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
  if (h.type == wire::FrameType::kDeviceState) {
    std::lock_guard lk(state_mu_);
    if (h.offset != state_blob_.size()) {
      return Corrupt(fmt::format("device state piece at offset {} arrived when {} bytes were assembled", h.offset,
                                 state_blob_.size()));
    }
    if (state_blob_.size() + payload.size() > kMaxDeviceStateBytes) {
      return Corrupt(fmt::format("device state exceeds the {} byte limit", kMaxDeviceStateBytes));
    }
    state_blob_.insert(state_blob_.end(), payload.begin(), payload.end());
    return Status::Ok();
  }
  size_t idx = 0;
  while (regions_[idx].id != h.region) ++idx;  // checked to exist by the caller
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
      GM_RETURN_IF_ERROR(dev_.Write(r.id, h.offset + off, bytes));
      hashes_.Set(idx, page, HashPage(bytes));
    } else {
      GM_RETURN_IF_ERROR(dev_.WriteZeros(r.id, h.offset + off, len));
      hashes_.SetZero(idx, page);
    }
    last = h.round + 1;
  }
  return Status::Ok();
}

// Reads, checks and applies one frame. Everything about the frame is checked
// before its payload is read or applied.
Status Destination::ReceiveFrame(size_t s, uint64_t seq, std::vector<std::byte>& payload, std::vector<std::byte>& raw,
                                 FrameDecoder& decoder, FrameProtector& protector) {
  std::array<std::byte, wire::kFrameHeaderBytes> hb;
  GM_RETURN_IF_ERROR(streams_.data[s]->ReadExact(hb));
  GM_ASSIGN_OR_RETURN(wire::FrameHeader h, wire::DecodeHeader(hb));
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
  } else {
    const RegionInfo* r = FindRegion(regions_, h.region);
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
    if (codec != CodecKind::kNone && h.payload_length == 0) {
      return Corrupt("compressed frame has an empty payload");
    }
    if (codec == CodecKind::kNone && h.payload_length != want_payload) {
      return Corrupt(fmt::format("{} frame has payload length {}, expected {}", wire::FrameTypeName(h.type),
                                 h.payload_length, want_payload));
    }
  }
  payload.resize(h.payload_length);
  GM_RETURN_IF_ERROR(streams_.data[s]->ReadExact(payload));
  wire::Tag tag;
  GM_RETURN_IF_ERROR(streams_.data[s]->ReadExact(tag));
  GM_RETURN_IF_ERROR(protector.Open(hb, h.stream_id, h.sequence, payload, tag));
  if (codec != CodecKind::kNone) {
    raw.resize(h.raw_length);
    GM_RETURN_IF_ERROR(decoder.Decode(codec, payload, raw));
    GM_RETURN_IF_ERROR(Apply(h, raw));
  } else {
    GM_RETURN_IF_ERROR(Apply(h, payload));
  }
  bytes_received_ += hb.size() + payload.size() + tag.size();
  return Status::Ok();
}

void Destination::Receive(size_t s) {
  std::vector<std::byte> payload, raw;
  FrameDecoder decoder;  // one zstd context per receiving thread
  auto protector = MakeFrameProtector(keys_);
  for (uint64_t seq = 0;; ++seq) {
    Status st = ReceiveFrame(s, seq, payload, raw, decoder, *protector);
    if (!st.ok()) {
      if (!done_.load()) box_.Fail(st.WithContext(fmt::format("data stream {}, frame {}", s, seq)));
      return;
    }
    frames_[s].fetch_add(1);
    box_.Notify();
  }
}

// Waits until exactly `counts[s]` frames have been applied on each data stream.
Status Destination::WaitForFrames(const google::protobuf::RepeatedField<uint64_t>& counts, const char* what) {
  if (static_cast<size_t>(counts.size()) != streams_.data.size()) {
    return Corrupt(fmt::format("the source counts frames on {} streams, the session has {}", counts.size(),
                               streams_.data.size()));
  }
  GM_RETURN_IF_ERROR(box_.WaitFor(
      [&] {
        for (size_t s = 0; s < streams_.data.size(); ++s) {
          if (frames_[s].load() < counts[static_cast<int>(s)]) return false;
        }
        return true;
      },
      Clock::now() + opt_.peer_timeout, opt_.cancel, what));
  for (size_t s = 0; s < streams_.data.size(); ++s) {
    if (frames_[s].load() != counts[static_cast<int>(s)]) {
      return Corrupt(fmt::format("data stream {} carried {} frames, the source sent {}", s, frames_[s].load(),
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
  {
    std::lock_guard lk(state_mu_);
    if (state_blob_.size() != p.device_state_bytes()) {
      return Corrupt(fmt::format("device state is {} bytes, the source sent {}", state_blob_.size(),
                                 p.device_state_bytes()));
    }
    GM_RETURN_IF_ERROR(dev_.LoadState(state_blob_));
  }
  GM_RETURN_IF_ERROR(dev_.SetState(DeviceState::kStop));
  report_.verified = true;
  return Status::Ok();
}

MigrationReport Destination::Fail(Status st, const std::string& phase, bool tell_peer) {
  // A stream that broke because the source aborted: report the source's reason;
  // one that broke with no Abort: say the source closed it, and when.
  bool closed = false;
  if (st.code() == StatusCode::kUnavailable) {
    if (auto abort = box_.PeerAbort(Clock::now() + std::chrono::seconds(1))) {
      st = Aborted(fmt::format("{} (source aborted in phase {}: {})", st.message(), abort->phase(), abort->reason()));
      tell_peer = false;
    } else {
      st = Unavailable(fmt::format("the source closed the connection during {}: {}", phase, st.message()));
      closed = true;
    }
  }
  if (tell_peer) {
    v1::Envelope abort;
    abort.mutable_abort()->set_reason(st.message());
    abort.mutable_abort()->set_phase(phase);
    (void)wire::SendEnvelope(*streams_.control, abort);
  }
  Shutdown();
  report_.failed_phase = phase;
  report_.bytes_sent = bytes_received_.load();
  report_.total_ms = MsBetween(t0_, Clock::now());
  if (prepared_) {
    report_.outcome = Outcome::kInDoubt;
    report_.status = Status(StatusCode::kInDoubt, fmt::format("prepared but no commit arrived ({}): outcome in doubt",
                                                              st.message()));
    report_.resolution =
        "this device holds the complete, verified state and stays stopped; neither side resumes on its own. If the "
        "source is stopped, resume here; if it resumed, discard this device";
    return report_;
  }
  report_.outcome = Outcome::kAborted;
  report_.status = closed ? st : st.WithContext(fmt::format("migration aborted in {}", phase));
  report_.verified = false;
  if (!resuming_) {
    // Failed before the device took any data (handshake): nothing to discard.
    report_.resolution = "nothing was received; the source keeps running";
    return report_;
  }
  Status discard = dev_.SetState(DeviceState::kError);
  report_.resolution = discard.ok() ? "everything received was discarded; the source keeps running"
                                    : "discarding failed: " + discard.message();
  return report_;
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
  reader_ = std::make_unique<ControlReader>(streams_.control, &box_, nullptr);
  Phase(Phase::kHandshake, 0);
  if (Status st = Handshake(); !st.ok()) return Fail(st, "handshake", true);
  if (Status st = dev_.SetState(DeviceState::kResuming); !st.ok()) return Fail(st, "handshake", true);
  resuming_ = true;
  for (size_t s = 0; s < streams_.data.size(); ++s) receivers_.emplace_back([this, s] { Receive(s); });
  v1::Envelope ready;
  ready.mutable_ready();
  if (Status st = wire::SendEnvelope(*streams_.control, ready); !st.ok()) return Fail(st, "handshake", true);

  uint32_t rounds = 0;
  while (true) {
    auto env = Next(prepared_ ? "Commit" : "RoundEnd or Prepare");
    const std::string phase = prepared_ ? "commit" : fmt::format("pre-copy round {}", rounds);
    if (!env.ok()) return Fail(env.status(), phase, !prepared_);
    if (env->has_abort()) {
      return Fail(Aborted(fmt::format("source aborted in phase {}: {}", env->abort().phase(), env->abort().reason())),
                  phase, false);
    }
    if (env->has_round_end() && !prepared_) {
      const auto& end = env->round_end();
      rounds = end.round() + 1;
      if (Status st = WaitForFrames(end.frames_per_stream(), "the round's frames"); !st.ok()) {
        return Fail(st, phase, true);
      }
      v1::Envelope applied;
      applied.mutable_round_applied()->set_round(end.round());
      if (Status st = wire::SendEnvelope(*streams_.control, applied); !st.ok()) return Fail(st, phase, true);
      Phase(Phase::kRoundEnd, end.round());
      continue;
    }
    if (env->has_prepare() && !prepared_) {
      Phase(Phase::kPrepareReceived, env->prepare().final_round());
      if (Status st = Prepare(env->prepare()); !st.ok()) return Fail(st, "switchover: prepare", true);
      v1::Envelope ok;
      ok.mutable_prepared();
      if (Status st = wire::SendEnvelope(*streams_.control, ok); !st.ok()) return Fail(st, "switchover: prepare", true);
      prepared_ = true;
      Phase(Phase::kPreparedSent, env->prepare().final_round());
      continue;
    }
    if (env->has_commit() && prepared_) {
      Phase(Phase::kCommitReceived, rounds);
      if (Status st = dev_.SetState(DeviceState::kRunning); !st.ok()) return Fail(st, "commit", false);
      v1::Envelope running;
      running.mutable_running();
      Status st = wire::SendEnvelope(*streams_.control, running);
      // The device runs here now either way; a lost Running leaves the source in doubt, not us.
      (void)st;
      break;
    }
    return Fail(Corrupt(fmt::format("protocol error: unexpected {}", wire::EnvelopeKind(*env))), phase, true);
  }
  // Let the source read Running before the streams close: wait for its close.
  (void)box_.Next(Clock::now() + std::chrono::seconds(5), nullptr, "the source to close");
  Shutdown();
  report_.outcome = Outcome::kCompleted;
  report_.bytes_sent = bytes_received_.load();
  report_.total_ms = MsBetween(t0_, Clock::now());
  return report_;
}

}  // namespace

MigrationReport RunDestination(Device& device, const SessionStreams& streams, const DestinationOptions& options) {
  Destination d(device, streams, options);
  return d.Run();
}

}  // namespace gpumigrate
