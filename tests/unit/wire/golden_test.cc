// Golden files of the wire format (tests/data/wire/): every run decodes them
// and checks each field, so a change that breaks compatibility with what an
// older peer sends fails here. GPUMIGRATE_REGENERATE_GOLDEN=1 rewrites them (only
// for a deliberate, versioned format change; say so in transport/wire/FORMAT.md).
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <gtest/gtest.h>

#include "gpumigrate/codec/codec.h"
#include "transport/crypto/frame_protector.h"
#include "transport/wire/control_channel.h"
#include "transport/wire/frame.h"

namespace gpumigrate {
namespace {

namespace v1 = wire::v1;

std::string Dir() { return std::string(GPUMIGRATE_SOURCE_DIR) + "/tests/data/wire/"; }

std::vector<std::byte> ReadFile(const std::string& name) {
  std::ifstream in(Dir() + name, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

// Writes `bytes` in regenerate mode; otherwise checks the file holds exactly them.
// `exact` false: the file is only decoded (a compressor may encode the same
// input differently across library versions; the decoder must still read it).
void Golden(const std::string& name, const std::vector<std::byte>& bytes, bool exact = true) {
  if (std::getenv("GPUMIGRATE_REGENERATE_GOLDEN")) {
    std::ofstream out(Dir() + name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return;
  }
  if (exact) {
    EXPECT_EQ(ReadFile(name), bytes) << name << " no longer matches what this build writes";
  } else {
    EXPECT_FALSE(ReadFile(name).empty()) << name;
  }
}

std::vector<std::byte> Serialize(const v1::Envelope& e) {
  auto [a, b] = MakePipe("g", 1 << 20);
  EXPECT_TRUE(wire::SendEnvelope(*a, e).ok());
  a->Close();
  std::vector<std::byte> all, chunk(1);
  while (b->ReadExact(chunk).ok()) all.push_back(chunk[0]);
  return all;
}

v1::Envelope Decode(const std::string& name) {
  auto bytes = ReadFile(name);
  auto [a, b] = MakePipe("g", 1 << 20);
  EXPECT_TRUE(a->WriteAll(bytes).ok());
  auto env = wire::RecvEnvelope(*b);
  EXPECT_TRUE(env.ok()) << name << ": " << env.status().ToString();
  return env.ok() ? *env : v1::Envelope();
}

TEST(WireGolden, ControlMessages) {
  v1::Envelope hello;
  hello.mutable_hello()->set_protocol_version(1);
  hello.mutable_hello()->set_product_version("0.1.0");
  hello.mutable_hello()->add_capabilities(wire::kCapZstd);
  Golden("hello.bin", Serialize(hello));

  v1::Envelope manifest;
  auto* m = manifest.mutable_manifest();
  m->set_session_id(0x0123456789abcdefULL);
  m->set_device("sim:size=64MiB");
  m->set_data_streams(2);
  m->set_cipher(v1::CIPHER_AES_256_GCM);
  m->set_max_frame_payload_bytes(1 << 20);
  auto* r = m->add_regions();
  r->set_id(0);
  r->set_name("weights");
  r->set_size_bytes(40 << 20);
  r->set_page_size(65536);
  r->set_hint(v1::REGION_HINT_STATIC);
  Golden("manifest.bin", Serialize(manifest));

  v1::Envelope prepare;
  auto* p = prepare.mutable_prepare();
  p->set_final_round(3);
  p->add_frames_per_stream(10);
  p->add_frames_per_stream(11);
  auto* d = p->add_digests();
  d->set_region(0);
  d->set_digest(0xfeedfacecafebeefULL);
  p->set_device_state_bytes(96);
  Golden("prepare.bin", Serialize(prepare));

  v1::Envelope abort;
  abort.mutable_abort()->set_reason("verify failed");
  abort.mutable_abort()->set_phase("switchover: prepare");
  Golden("abort.bin", Serialize(abort));

  v1::Envelope keepalive;
  keepalive.mutable_keepalive()->set_progress(123456789);
  keepalive.mutable_keepalive()->set_activity("pre-copy round 3");
  Golden("keepalive.bin", Serialize(keepalive));

  // Written by hand from the protobuf encoding (field 12 and 13, packed counts).
  Golden("resume.bin", Serialize(wire::MakeResume(4, 3)));
  Golden("resumed.bin", Serialize(wire::MakeResumed(3, {17, 300})));

  // Decode what is on disk, field by field.
  auto h = Decode("hello.bin");
  EXPECT_EQ(h.hello().protocol_version(), 1u);
  EXPECT_EQ(h.hello().capabilities(0), "codec:zstd");
  auto mf = Decode("manifest.bin");
  EXPECT_EQ(mf.manifest().session_id(), 0x0123456789abcdefULL);
  EXPECT_EQ(mf.manifest().cipher(), v1::CIPHER_AES_256_GCM);
  EXPECT_EQ(mf.manifest().regions(0).name(), "weights");
  EXPECT_EQ(mf.manifest().regions(0).hint(), v1::REGION_HINT_STATIC);
  EXPECT_EQ(mf.manifest().regions(0).page_size(), 65536u);
  auto pr = Decode("prepare.bin");
  EXPECT_EQ(pr.prepare().frames_per_stream(1), 11u);
  EXPECT_EQ(pr.prepare().digests(0).digest(), 0xfeedfacecafebeefULL);
  auto ab = Decode("abort.bin");
  EXPECT_EQ(ab.abort().phase(), "switchover: prepare");
  auto ka = Decode("keepalive.bin");
  EXPECT_EQ(ka.keepalive().progress(), 123456789u);
  EXPECT_EQ(ka.keepalive().activity(), "pre-copy round 3");
  auto rs = Decode("resume.bin");
  EXPECT_EQ(rs.resume().next_round(), 4u);
  EXPECT_EQ(rs.resume().confirmed_rounds(), 3u);
  auto rd = Decode("resumed.bin");
  EXPECT_EQ(rd.resumed().rounds_applied(), 3u);
  ASSERT_EQ(rd.resumed().frames_applied_size(), 2);
  EXPECT_EQ(rd.resumed().frames_applied(1), 300u);
}

std::vector<std::byte> FrameBytes(const wire::FrameHeader& h, std::span<const std::byte> payload, const FrameKeys& keys) {
  auto hb = wire::EncodeHeader(h);
  auto prot = MakeFrameProtector(keys);
  std::vector<std::byte> scratch;
  wire::Tag tag;
  auto sealed = prot->Seal(hb, h.stream_id, h.sequence, payload, scratch, tag);
  EXPECT_TRUE(sealed.ok());
  std::vector<std::byte> out(hb.size() + sealed->size() + tag.size());
  std::memcpy(out.data(), hb.data(), hb.size());
  if (!sealed->empty()) std::memcpy(out.data() + hb.size(), sealed->data(), sealed->size());
  std::memcpy(out.data() + hb.size() + sealed->size(), tag.data(), tag.size());
  return out;
}

// Decodes a golden frame file: header fields, tag, payload.
std::vector<std::byte> OpenFrame(const std::string& name, const FrameKeys& keys, wire::FrameHeader* h) {
  auto b = ReadFile(name);
  EXPECT_GE(b.size(), wire::kFrameHeaderBytes + wire::kFrameTagBytes) << name;
  auto hdr = wire::DecodeHeader(std::span<const std::byte, wire::kFrameHeaderBytes>(b.data(), wire::kFrameHeaderBytes));
  EXPECT_TRUE(hdr.ok()) << name << ": " << hdr.status().ToString();
  *h = *hdr;
  std::vector<std::byte> payload(b.begin() + wire::kFrameHeaderBytes, b.end() - wire::kFrameTagBytes);
  wire::Tag tag;
  std::memcpy(tag.data(), b.data() + b.size() - wire::kFrameTagBytes, wire::kFrameTagBytes);
  auto prot = MakeFrameProtector(keys);
  EXPECT_TRUE(prot->Open(std::span(b).first(wire::kFrameHeaderBytes), h->stream_id, h->sequence, payload, tag).ok())
      << name;
  return payload;
}

TEST(WireGolden, Frames) {
  FrameKeys integrity{.integrity_key = 42};
  FrameKeys aes{.aes_gcm = true};
  for (size_t i = 0; i < aes.aes_key.size(); ++i) aes.aes_key[i] = static_cast<std::byte>(i);
  std::vector<std::byte> page(4096);
  for (size_t i = 0; i < page.size(); ++i) page[i] = static_cast<std::byte>((i * 37) % 11);

  wire::FrameHeader pages;
  pages.type = wire::FrameType::kPages;
  pages.stream_id = 1;
  pages.region = 2;
  pages.sequence = 5;
  pages.round = 3;
  pages.offset = 8192;
  pages.raw_length = pages.payload_length = 4096;
  Golden("frame_pages.bin", FrameBytes(pages, page, integrity));
  Golden("frame_pages_aes.bin", FrameBytes(pages, page, aes));

  FrameEncoder enc;
  std::vector<std::byte> z;
  ASSERT_EQ(enc.Encode(CodecKind::kZstd, 1, page, z), CodecKind::kZstd);
  wire::FrameHeader zp = pages;
  zp.codec_flags = 1;
  zp.payload_length = static_cast<uint32_t>(z.size());
  Golden("frame_pages_zstd.bin", FrameBytes(zp, z, integrity), /*exact=*/false);

  // bf16: 4096 values whose exponents crowd into five values (as weights' do),
  // sign and mantissa spread, and an odd last byte.
  std::vector<std::byte> weights(2 * 4096 + 1);
  for (size_t i = 0; i < 4096; ++i) {
    const unsigned exponent = 0x78 + (i * 7) % 5, sign_mantissa = (i * 131) & 0xff;
    const unsigned v = ((sign_mantissa & 0x80) << 8) | (exponent << 7) | (sign_mantissa & 0x7f);
    weights[2 * i] = static_cast<std::byte>(v & 0xff);
    weights[2 * i + 1] = static_cast<std::byte>(v >> 8);
  }
  weights.back() = std::byte{0xa5};
  std::vector<std::byte> b16;
  ASSERT_EQ(enc.Encode(CodecKind::kBf16, 1, weights, b16), CodecKind::kBf16);
  wire::FrameHeader bp = pages;
  bp.codec_flags = 3;
  bp.raw_length = static_cast<uint32_t>(weights.size());
  bp.payload_length = static_cast<uint32_t>(b16.size());
  Golden("frame_pages_bf16.bin", FrameBytes(bp, b16, integrity), /*exact=*/false);

  wire::FrameHeader zero = pages;
  zero.type = wire::FrameType::kZeroPages;
  zero.payload_length = 0;
  Golden("frame_zero.bin", FrameBytes(zero, {}, integrity));

  wire::FrameHeader h;
  auto p1 = OpenFrame("frame_pages.bin", integrity, &h);
  EXPECT_EQ(h.type, wire::FrameType::kPages);
  EXPECT_EQ(h.sequence, 5u);
  EXPECT_EQ(h.offset, 8192u);
  EXPECT_EQ(p1, page);
  auto p2 = OpenFrame("frame_pages_aes.bin", aes, &h);
  EXPECT_EQ(p2, page) << "AES-256-GCM frame decrypts to the page";
  auto p3 = OpenFrame("frame_pages_zstd.bin", integrity, &h);
  EXPECT_EQ(h.codec_flags, 1);
  std::vector<std::byte> raw(h.raw_length);
  FrameDecoder dec;
  ASSERT_TRUE(dec.Decode(CodecKind::kZstd, p3, raw).ok());
  EXPECT_EQ(raw, page);
  auto p5 = OpenFrame("frame_pages_bf16.bin", integrity, &h);
  EXPECT_EQ(h.codec_flags, 3);
  EXPECT_EQ(h.raw_length, 8193u);
  ASSERT_EQ(h.payload_length, p5.size());
  // Our part of the layout is pinned byte for byte (the exponent stream is zstd's):
  // E, then value i's sign+mantissa byte, then the odd byte, then E bytes.
  ASSERT_GT(p5.size(), 4u + 4096 + 1);
  const uint32_t e = static_cast<uint32_t>(p5[0]) | static_cast<uint32_t>(p5[1]) << 8 |
                     static_cast<uint32_t>(p5[2]) << 16 | static_cast<uint32_t>(p5[3]) << 24;
  EXPECT_EQ(e, p5.size() - 4 - 4096 - 1);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(p5[4 + i], static_cast<std::byte>((i * 131) & 0xff)) << i;
  EXPECT_EQ(p5[4 + 4096], std::byte{0xa5});
  std::vector<std::byte> raw16(h.raw_length);
  Status st16 = dec.Decode(CodecKind::kBf16, p5, raw16);
  ASSERT_TRUE(st16.ok()) << st16.ToString();
  EXPECT_EQ(raw16, weights);

  auto p4 = OpenFrame("frame_zero.bin", integrity, &h);
  EXPECT_EQ(h.type, wire::FrameType::kZeroPages);
  EXPECT_TRUE(p4.empty());
}

}  // namespace
}  // namespace gpumigrate
