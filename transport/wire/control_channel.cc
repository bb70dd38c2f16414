#include "transport/wire/control_channel.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace gpumigrate::wire {

Status SendEnvelope(Stream& stream, const v1::Envelope& env) {
  std::string body;
  if (!env.SerializeToString(&body)) return Internal("control channel: serialize failed");
  if (body.size() > kMaxControlMessageBytes) {
    return Internal(fmt::format("control channel: send failed: message of {} bytes exceeds the {} byte limit",
                                body.size(), kMaxControlMessageBytes));
  }
  std::vector<std::byte> buf(4 + body.size());
  uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) buf[i] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(buf.data() + 4, body.data(), body.size());
  return stream.WriteAll(buf).WithContext(fmt::format("control channel: send {}", EnvelopeKind(env)));
}

Result<v1::Envelope> RecvEnvelope(Stream& stream) {
  std::byte len_bytes[4];
  GM_RETURN_IF_ERROR(stream.ReadExact(len_bytes).WithContext("control channel: receive"));
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t{std::to_integer<uint8_t>(len_bytes[i])} << (8 * i);
  if (n > kMaxControlMessageBytes) {
    return Corrupt(fmt::format("control channel: receive failed: length prefix {} exceeds the {} byte limit", n,
                               kMaxControlMessageBytes));
  }
  std::string body(n, '\0');
  GM_RETURN_IF_ERROR(stream.ReadExact(std::as_writable_bytes(std::span(body))).WithContext("control channel: receive"));
  v1::Envelope env;
  if (!env.ParseFromString(body)) {
    return Corrupt(fmt::format("control channel: receive failed: {} byte message does not decode", n));
  }
  if (env.msg_case() == v1::Envelope::MSG_NOT_SET) {
    return Corrupt("control channel: receive failed: message of unknown or unset kind");
  }
  if (env.has_manifest()) {
    if (env.manifest().cipher() == v1::CIPHER_UNSPECIFIED) {
      return Corrupt("control channel: receive failed: Manifest.cipher is unspecified");
    }
    for (const auto& r : env.manifest().regions()) {
      if (r.hint() == v1::REGION_HINT_UNSPECIFIED) {
        return Corrupt(fmt::format("control channel: receive failed: Manifest region {} hint is unspecified", r.id()));
      }
    }
  }
  return env;
}

Result<uint32_t> NegotiateProtocol(const v1::Hello& peer) {
  const uint32_t newest = peer.protocol_version();
  const uint32_t oldest = peer.oldest_protocol_version() == 0 ? newest : peer.oldest_protocol_version();
  if (newest == 0 || oldest > newest) {
    return InvalidArgument(fmt::format("handshake failed: the peer's Hello names protocol versions {}..{}", oldest,
                                       newest));
  }
  const uint32_t common = std::min(newest, kProtocolVersion);
  if (common >= std::max(oldest, kOldestProtocolVersion)) return common;
  auto range = [](uint32_t lo, uint32_t hi) { return lo == hi ? fmt::format("{}", lo) : fmt::format("{}..{}", lo, hi); };
  const std::string product = peer.product_version().empty() ? "" : fmt::format(" (gpumigrate {})", peer.product_version());
  return InvalidArgument(fmt::format(
      "handshake failed: the peer{} speaks protocol version {}, this build (gpumigrate {}) speaks version {}: no "
      "version in common; upgrade {}",
      product, range(oldest, newest), GPUMIGRATE_VERSION, range(kOldestProtocolVersion, kProtocolVersion),
      newest < kOldestProtocolVersion ? "the peer" : "this build"));
}

Status CheckHello(const v1::Hello& hello) { return NegotiateProtocol(hello).status(); }

std::string EnvelopeKind(const v1::Envelope& env) {
  switch (env.msg_case()) {
    case v1::Envelope::kHello: return "Hello";
    case v1::Envelope::kManifest: return "Manifest";
    case v1::Envelope::kReady: return "Ready";
    case v1::Envelope::kRoundEnd: return "RoundEnd";
    case v1::Envelope::kPrepare: return "Prepare";
    case v1::Envelope::kPrepared: return "Prepared";
    case v1::Envelope::kCommit: return "Commit";
    case v1::Envelope::kRunning: return "Running";
    case v1::Envelope::kAbort: return "Abort";
    case v1::Envelope::kRoundApplied: return "RoundApplied";
    case v1::Envelope::kKeepalive: return "Keepalive";
    case v1::Envelope::kContentAnswer: return "ContentAnswer";
    case v1::Envelope::kResume: return "Resume";
    case v1::Envelope::kResumed: return "Resumed";
    default: return "unknown";
  }
}

v1::Envelope MakeHello(std::string_view product_version, const std::vector<std::string>& capabilities) {
  v1::Envelope env;
  auto* h = env.mutable_hello();
  h->set_protocol_version(kProtocolVersion);
  // Left unset while it equals protocol_version, so a 1.x Hello keeps its bytes.
  if (kOldestProtocolVersion != kProtocolVersion) h->set_oldest_protocol_version(kOldestProtocolVersion);
  h->set_product_version(std::string(product_version));
  for (const auto& c : capabilities) h->add_capabilities(c);
  return env;
}

v1::Envelope MakeAbort(std::string_view reason, std::string_view phase) {
  v1::Envelope env;
  env.mutable_abort()->set_reason(std::string(reason));
  env.mutable_abort()->set_phase(std::string(phase));
  return env;
}

v1::Envelope MakeRoundEnd(uint32_t round, const std::vector<uint64_t>& frames_per_stream) {
  v1::Envelope env;
  env.mutable_round_end()->set_round(round);
  for (uint64_t f : frames_per_stream) env.mutable_round_end()->add_frames_per_stream(f);
  return env;
}

v1::Envelope MakeResume(uint32_t next_round, uint32_t confirmed_rounds) {
  v1::Envelope env;
  env.mutable_resume()->set_next_round(next_round);
  env.mutable_resume()->set_confirmed_rounds(confirmed_rounds);
  return env;
}

v1::Envelope MakeResumed(uint32_t rounds_applied, const std::vector<uint64_t>& frames_applied) {
  v1::Envelope env;
  env.mutable_resumed()->set_rounds_applied(rounds_applied);
  for (uint64_t f : frames_applied) env.mutable_resumed()->add_frames_applied(f);
  return env;
}

}  // namespace gpumigrate::wire
