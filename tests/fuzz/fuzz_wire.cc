// libFuzzer target for everything that decodes bytes from a peer:
//   mode 0: a control message (length prefix + protobuf Envelope)
//   mode 1: a frame header, then the payload through the codec decoder (the
//           header's payload_length bytes, so a golden frame file, tag and all,
//           seeds a payload that decodes; every codec_flags value the registry has)
//   mode 2: a whole destination session: a valid handshake, then the input as
//           the bytes of a data stream (frames of any shape)
//   mode 4: a checkpoint file (engine/checkpoint/FORMAT.md): the input is the
//           file, verified end to end (reader, replayer, destination session)
//   mode 3: the same as 2, but the harness cuts the input into frames (header as
//           given, then payload_length bytes) and seals each with the session's
//           key, so frames with valid tags reach the bounds checks and the writes
//   mode 5: the input as raw bytes through every codec's encoder and back: the
//           decoder must return exactly the input (aborts otherwise)
// The first input byte picks the mode. Nothing may crash, hang or write outside
// a region; every input must end in a clean error or a clean stop.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <sys/mman.h>
#include <unistd.h>

#include "gpumigrate/checkpoint/checkpoint.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/session/session.h"
#include "tests/support/fake_device.h"
#include "transport/wire/control_channel.h"
#include "transport/wire/frame.h"

using namespace gpumigrate;
namespace v1 = wire::v1;

namespace {

void FuzzControl(const std::byte* data, size_t size) {
  auto [a, b] = MakePipe("fuzz", 1 << 20);
  (void)a->WriteAll(std::span(data, size));
  a->Close();
  while (true) {
    auto env = wire::RecvEnvelope(*b);
    if (!env.ok()) break;
    (void)wire::EnvelopeKind(*env);
  }
}

void FuzzFrame(const std::byte* data, size_t size) {
  if (size < wire::kFrameHeaderBytes) return;
  auto h = wire::DecodeHeader(std::span<const std::byte, wire::kFrameHeaderBytes>(data, wire::kFrameHeaderBytes));
  if (!h.ok() || h->raw_length > (1u << 20)) return;
  std::vector<std::byte> raw(h->raw_length);
  const size_t rest = size - wire::kFrameHeaderBytes;
  FrameDecoder dec;
  (void)dec.Decode(static_cast<CodecKind>(h->codec_flags),
                   std::span(data + wire::kFrameHeaderBytes, std::min<size_t>(h->payload_length, rest)), raw);
}

void FuzzRoundTrip(const std::byte* data, size_t size) {
  const std::span<const std::byte> raw(data, std::min<size_t>(size, 1 << 20));
  FrameEncoder enc;
  FrameDecoder dec;
  std::vector<std::byte> out, back(raw.size());
  for (const CodecInfo& c : Codecs()) {
    const CodecKind used = enc.Encode(c.kind, 1, raw, out);
    if (used == CodecKind::kNone) continue;
    if (!dec.Decode(used, out, back).ok() || !std::equal(back.begin(), back.end(), raw.begin())) std::abort();
  }
}

// Re-tags each frame of the input with the session key (1).
std::vector<std::byte> Seal(const std::byte* data, size_t size) {
  std::vector<std::byte> out;
  size_t off = 0;
  while (off + wire::kFrameHeaderBytes <= size) {
    std::span<const std::byte> header(data + off, wire::kFrameHeaderBytes);
    uint32_t payload_length;
    std::memcpy(&payload_length, data + off + 44, 4);
    off += wire::kFrameHeaderBytes;
    size_t n = std::min<size_t>(payload_length, size - off);
    std::span<const std::byte> payload(data + off, n);
    off += n;
    wire::Tag tag = wire::ComputeTag(1, header, payload);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), payload.begin(), payload.end());
    out.insert(out.end(), tag.begin(), tag.end());
  }
  return out;
}

void FuzzSession(const std::byte* data, size_t size) {
  using testing::FakeDevice;
  FakeDevice dst({RegionInfo{0, "a", 16 * 4096, 4096, RegionHint::kDynamic},
                  RegionInfo{1, "b", 3 * 4096 + 100, 4096, RegionHint::kStatic}},
                 DeviceState::kStop);
  auto [c, dc] = MakePipe("control", 1 << 20);
  auto [d, dd] = MakePipe("data", 1 << 20);
  SessionStreams s{dc.get(), {dd.get()}};
  DestinationOptions opt;
  opt.peer_timeout = std::chrono::milliseconds(200);
  MigrationReport report;
  std::thread t([&] { report = RunDestination(dst, s, opt); });
  v1::Envelope hello;
  hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
  (void)wire::SendEnvelope(*c, hello);
  v1::Envelope m;
  auto* mf = m.mutable_manifest();
  mf->set_session_id(1);
  mf->set_data_streams(1);
  mf->set_cipher(v1::CIPHER_NONE_INTEGRITY_ONLY);
  mf->set_max_frame_payload_bytes(1 << 16);
  for (auto [id, size_bytes, hint] : {std::tuple{0u, 16u * 4096, v1::REGION_HINT_DYNAMIC},
                                      std::tuple{1u, 3u * 4096 + 100, v1::REGION_HINT_STATIC}}) {
    auto* r = mf->add_regions();
    r->set_id(id);
    r->set_name(id ? "b" : "a");
    r->set_size_bytes(size_bytes);
    r->set_page_size(4096);
    r->set_hint(hint);
  }
  (void)wire::SendEnvelope(*c, m);
  (void)d->WriteAll(std::span(data, size));
  d->Close();
  c->Close();
  t.join();
}

}  // namespace

void FuzzCheckpoint(const std::byte* data, size_t size) {
  int fd = memfd_create("fuzz-checkpoint", MFD_CLOEXEC);
  if (fd < 0) return;
  size_t done = 0;
  while (done < size) {
    ssize_t n = write(fd, data + done, size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  (void)VerifyCheckpoint("/proc/self/fd/" + std::to_string(fd), RestoreOptions{});
  close(fd);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto* bytes = reinterpret_cast<const std::byte*>(data + 1);
  switch (data[0] % 6) {
    case 0: FuzzControl(bytes, size - 1); break;
    case 1: FuzzFrame(bytes, size - 1); break;
    case 2: FuzzSession(bytes, size - 1); break;
    case 4: FuzzCheckpoint(bytes, size - 1); break;
    case 5: FuzzRoundTrip(bytes, size - 1); break;
    default: {
      auto sealed = Seal(bytes, size - 1);
      FuzzSession(sealed.data(), sealed.size());
      break;
    }
  }
  return 0;
}
