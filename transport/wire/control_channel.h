// Length-prefixed protobuf messages on the control stream.
//
//   u32 little-endian length | Envelope (protobuf, gpumigrate.wire.v1)
//
// The length is checked against kMaxControlMessageBytes before anything is read
// or allocated; an envelope with no message set, or with an enum at 0
// (unspecified), is rejected. Protocol versions: each Hello carries the range a
// peer speaks; both sides speak the newest version in both ranges.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "control.pb.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate::wire {

constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kOldestProtocolVersion = 1;  // the previous version, once there is one
constexpr uint32_t kMaxControlMessageBytes = 16 << 20;
// Hello capabilities: the payload codecs a peer can decode. The session takes
// them from the codec registry (gpumigrate/codec/codec.h, Codecs()); these spellings
// are what the golden files pin, and tests/unit/codec/registry_test.cc keeps the
// two equal.
constexpr const char* kCapZstd = "codec:zstd";
constexpr const char* kCapShuffleZstd = "codec:shuffle16-zstd";
constexpr const char* kCapBf16 = "codec:bf16-exp-zstd";
// The peer understands Keepalive and sends its own: liveness deadlines apply.
constexpr const char* kCapKeepalive = "keepalive";
// The peer can carry a pre-copy on over a new connection when the old one broke
// (Resume/Resumed): a source lists it when it will reconnect, a destination when
// it will wait for that. Both must list it for a session to be resumable.
constexpr const char* kCapResume = "resume";
// A destination with a content store (receive --content-store): it fills pages
// the source offers by SHA-256 in PageDigests frames, and answers each frame
// with ContentAnswer. A source offers only to a destination that lists it.
constexpr const char* kCapContentStore = "content-store";

Status SendEnvelope(Stream& stream, const v1::Envelope& env);
Result<v1::Envelope> RecvEnvelope(Stream& stream);

// The protocol version to speak with a peer whose Hello this is: the newest in
// both its range and ours. When the ranges do not meet, InvalidArgument naming
// both ranges and both product versions, and which side to upgrade.
Result<uint32_t> NegotiateProtocol(const v1::Hello& peer);
// NegotiateProtocol without the version (every peer speaks 1 today).
Status CheckHello(const v1::Hello& hello);

std::string EnvelopeKind(const v1::Envelope& env);

// The messages both sides build, each in one place.
v1::Envelope MakeHello(std::string_view product_version, const std::vector<std::string>& capabilities);
v1::Envelope MakeAbort(std::string_view reason, std::string_view phase);
v1::Envelope MakeRoundEnd(uint32_t round, const std::vector<uint64_t>& frames_per_stream);
v1::Envelope MakeResume(uint32_t next_round, uint32_t confirmed_rounds);
v1::Envelope MakeResumed(uint32_t rounds_applied, const std::vector<uint64_t>& frames_applied);

}  // namespace gpumigrate::wire
