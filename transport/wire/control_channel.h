// Length-prefixed protobuf messages on the control stream.
//
//   u32 little-endian length | Envelope (protobuf, gpumigrate.wire.v1)
//
// The length is checked against kMaxControlMessageBytes before anything is read
// or allocated; an envelope with no message set, or with an enum at 0
// (unspecified), is rejected. Protocol versions: a peer accepts its own and the
// previous one.
#pragma once

#include <cstdint>
#include <string>

#include "control.pb.h"
#include "gpumigrate/status.h"
#include "gpumigrate/stream.h"

namespace gpumigrate::wire {

constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kOldestProtocolVersion = 1;  // the previous version, once there is one
constexpr uint32_t kMaxControlMessageBytes = 16 << 20;
// Hello capabilities: the payload codecs a peer can decode. The session takes
// them from the codec registry (gpumigrate/codec.h, Codecs()); these spellings
// are what the golden files pin, and tests/unit/codec/registry_test.cc keeps the
// two equal.
constexpr const char* kCapZstd = "codec:zstd";
constexpr const char* kCapShuffleZstd = "codec:shuffle16-zstd";

Status SendEnvelope(Stream& stream, const v1::Envelope& env);
Result<v1::Envelope> RecvEnvelope(Stream& stream);

// Checks a peer's Hello; the error names both versions.
Status CheckHello(const v1::Hello& hello);

std::string EnvelopeKind(const v1::Envelope& env);

}  // namespace gpumigrate::wire
