// The bf16 codec (transport/codec/bf16_codec.h): its planes value by value, round
// trips on the sim's weights and on inputs that do not look like bf16 at all,
// and payloads damaged every way the format can be (each rejected by name, none
// read or written out of bounds: the ASan build runs these too).
#include "transport/codec/bf16_codec.h"

#include <cstring>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engine/devices/sim/content.h"
#include "gpumigrate/codec/codec.h"

namespace gpumigrate {
namespace {

using codec_internal::JoinBf16;
using codec_internal::kBf16HeaderBytes;
using codec_internal::SplitBf16;

std::vector<std::byte> Weights(size_t bytes, uint64_t seed = 1) {
  std::vector<std::byte> v(bytes);
  for (size_t off = 0; off < bytes; off += 65536) {
    sim::FillPage(seed, 0, off / 65536, 1, sim::ContentKind::kWeights,
                  std::span(v).subspan(off, std::min<size_t>(65536, bytes - off)));
  }
  return v;
}

std::vector<std::byte> Noise(size_t bytes) {
  std::vector<std::byte> v(bytes);
  std::mt19937_64 rng(7);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

std::vector<std::byte> Bytes(std::initializer_list<int> b) {
  std::vector<std::byte> v;
  for (int x : b) v.push_back(static_cast<std::byte>(x));
  return v;
}

// Encodes with bf16 and decodes it back; the kind the encoder used.
CodecKind RoundTrip(std::span<const std::byte> raw, std::vector<std::byte>* payload = nullptr) {
  FrameEncoder enc;
  FrameDecoder dec;
  std::vector<std::byte> out;
  const CodecKind used = enc.Encode(CodecKind::kBf16, 1, raw, out);
  std::vector<std::byte> back(raw.size(), std::byte{0xee});
  const auto wire = used == CodecKind::kNone ? raw : std::span<const std::byte>(out);
  Status st = dec.Decode(used, wire, back);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(std::equal(back.begin(), back.end(), raw.begin(), raw.end())) << raw.size() << " bytes";
  if (payload != nullptr) *payload = out;
  return used;
}

TEST(Bf16Planes, TheExponentFillsOneByteTheSignJoinsTheMantissa) {
  // 1.0 = 0x3f80: exponent 0x7f, mantissa 0; -1.0 = 0xbf80; 0x3c23: exponent 0x78, mantissa 0x23.
  const auto raw = Bytes({0x80, 0x3f, 0x80, 0xbf, 0x23, 0x3c, 0xff, 0xff});
  std::vector<std::byte> e(4), sm(4);
  SplitBf16(raw, e.data(), sm.data());
  EXPECT_EQ(e, Bytes({0x7f, 0x7f, 0x78, 0xff}));
  EXPECT_EQ(sm, Bytes({0x00, 0x80, 0x23, 0xff}));
  std::vector<std::byte> back(8);
  JoinBf16(e, sm, back.data());
  EXPECT_EQ(back, raw);
}

TEST(Bf16Planes, EveryValueAndEveryTailLengthRoundTrips) {
  // All 65,536 values, so the vector loop and the scalar tail see each of them.
  std::vector<std::byte> all(2 * 65536);
  for (uint32_t v = 0; v < 65536; ++v) {
    all[2 * v] = static_cast<std::byte>(v & 0xff);
    all[2 * v + 1] = static_cast<std::byte>(v >> 8);
  }
  for (size_t values : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{31}, size_t{33}, size_t{65536}}) {
    SCOPED_TRACE(values);
    // Starting at an odd byte for odd counts: unaligned loads too.
    const auto raw = std::span<const std::byte>(all).subspan(65536 - values, 2 * values);
    std::vector<std::byte> e(values), sm(values), back(2 * values);
    SplitBf16(raw, e.data(), sm.data());
    for (size_t i = 0; i < values; ++i) {
      const unsigned v = static_cast<unsigned>(raw[2 * i]) | static_cast<unsigned>(raw[2 * i + 1]) << 8;
      ASSERT_EQ(static_cast<unsigned>(e[i]), (v >> 7) & 0xff) << i;
      ASSERT_EQ(static_cast<unsigned>(sm[i]), ((v >> 8) & 0x80) | (v & 0x7f)) << i;
    }
    JoinBf16(e, sm, back.data());
    EXPECT_TRUE(std::equal(back.begin(), back.end(), raw.begin(), raw.end()));
  }
}

TEST(Bf16Codec, SimWeightsRoundTripAtTheRatioTheIssueAsksFor) {
  const auto raw = Weights(1 << 20);
  std::vector<std::byte> payload;
  ASSERT_EQ(RoundTrip(raw, &payload), CodecKind::kBf16);
  const double ratio = static_cast<double>(raw.size()) / static_cast<double>(payload.size());
  EXPECT_GE(ratio, 1.45) << "issue 14's floor; the order-0 entropy of these planes allows 1.52";
  EXPECT_LE(ratio, 1.53);

  FrameEncoder enc;
  std::vector<std::byte> shuffle;
  ASSERT_EQ(enc.Encode(CodecKind::kShuffleZstd, 1, raw, shuffle), CodecKind::kShuffleZstd);
  EXPECT_LT(payload.size(), shuffle.size()) << "the whole exponent in one byte codes better than shuffle's planes";
}

TEST(Bf16Codec, OddAndShortFramesRoundTrip) {
  for (size_t n : {65536 + 1, 4097, 4096, 1000, 255, 64, 33, 32, 31, 17, 16, 3, 2, 1}) {
    SCOPED_TRACE(n);
    RoundTrip(Weights(n, n));
  }
  EXPECT_EQ(RoundTrip(Weights(1)), CodecKind::kNone) << "no whole value: sent raw";
  FrameEncoder enc;
  std::vector<std::byte> out;
  EXPECT_EQ(enc.Encode(CodecKind::kBf16, 1, {}, out), CodecKind::kNone);
}

TEST(Bf16Codec, TheOddLastByteTravelsRaw) {
  auto raw = Weights(65537);
  raw.back() = std::byte{0xa5};
  std::vector<std::byte> payload;
  ASSERT_EQ(RoundTrip(raw, &payload), CodecKind::kBf16);
  EXPECT_EQ(payload[kBf16HeaderBytes + 65536 / 2], std::byte{0xa5}) << "right after the sign+mantissa plane";
}

TEST(Bf16Codec, RandomBytesGoRawEqualBytesShrinkToAlmostNothing) {
  EXPECT_EQ(RoundTrip(Noise(1 << 20)), CodecKind::kNone) << "noise does not shrink: the frame goes raw";
  EXPECT_EQ(RoundTrip(Noise(4097)), CodecKind::kNone);
  for (int b : {0x00, 0x3f, 0xff}) {
    std::vector<std::byte> same(1 << 20, static_cast<std::byte>(b)), payload;
    ASSERT_EQ(RoundTrip(same, &payload), CodecKind::kBf16) << b;
    // The raw plane stays: half the frame, plus a few hundred bytes of exponent stream.
    EXPECT_LT(payload.size(), (1u << 19) + 1024) << b;
  }
}

// A valid payload of `raw` and the decoder's verdict on edited copies of it.
class Bf16Damage : public ::testing::Test {
 protected:
  void SetUp() override {
    raw_ = Weights(65536 + 1);
    ASSERT_EQ(FrameEncoder().Encode(CodecKind::kBf16, 1, raw_, payload_), CodecKind::kBf16);
    stream_at_ = kBf16HeaderBytes + raw_.size() / 2 + 1;
  }
  Status Decode(std::span<const std::byte> payload, size_t raw_bytes) {
    std::vector<std::byte> back(raw_bytes);
    return dec_.Decode(CodecKind::kBf16, payload, back);
  }
  Status Decode(std::span<const std::byte> payload) { return Decode(payload, raw_.size()); }
  void SetStreamBytes(std::vector<std::byte>& p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
  }
  static void ExpectCorrupt(const Status& st, std::string_view says) {
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  }

  std::vector<std::byte> raw_, payload_;
  size_t stream_at_ = 0;
  FrameDecoder dec_;
};

TEST_F(Bf16Damage, TheUndamagedPayloadDecodes) { EXPECT_TRUE(Decode(payload_).ok()); }

TEST_F(Bf16Damage, AShortHeaderIsNamed) {
  for (size_t n = 0; n < kBf16HeaderBytes; ++n) {
    ExpectCorrupt(Decode(std::span(payload_).first(n)), fmt::format("bf16 payload is {} bytes, shorter than", n));
  }
}

TEST_F(Bf16Damage, LengthsThatDoNotAddUpAreNamed) {
  auto extended = payload_;
  extended.push_back(std::byte{0});
  ExpectCorrupt(Decode(extended), "bf16 lengths do not add up");
  auto truncated = std::span(payload_).first(payload_.size() - 1);
  ExpectCorrupt(Decode(truncated), "bf16 lengths do not add up");
  auto lying = payload_;
  SetStreamBytes(lying, 0xffffffff);
  ExpectCorrupt(Decode(lying), "the header says a 4294967295-byte exponent stream");
  // The frame header's raw length, not the payload, is what is off.
  ExpectCorrupt(Decode(payload_, raw_.size() + 2), "bf16 lengths do not add up");
  ExpectCorrupt(Decode(std::span(payload_).first(100)), "cannot hold the 32769-byte raw plane");
}

TEST_F(Bf16Damage, BytesAfterTheExponentFrameAreNamed) {
  auto longer = payload_;
  for (int i = 0; i < 3; ++i) longer.push_back(std::byte{0});
  SetStreamBytes(longer, static_cast<uint32_t>(payload_.size() - stream_at_ + 3));
  ExpectCorrupt(Decode(longer), "bf16 exponent stream has 3 bytes after its");
  // A second zstd frame after the first: the same damage.
  auto twice = payload_;
  twice.insert(twice.end(), payload_.begin() + static_cast<ptrdiff_t>(stream_at_), payload_.end());
  SetStreamBytes(twice, static_cast<uint32_t>(2 * (payload_.size() - stream_at_)));
  ExpectCorrupt(Decode(twice), "bytes after its");
}

TEST_F(Bf16Damage, AFlippedExponentByteIsCaught) {
  // Every byte of the zstd frame: magic, header, block headers, Huffman table,
  // streams, checksum. The one flip that decodes is the frame header's unused
  // bit (RFC 8878 3.1.1.1.1: decoders ignore it), and it decodes to the same bytes.
  int harmless = 0;
  for (size_t at = stream_at_; at < payload_.size(); ++at) {
    auto p = payload_;
    p[at] ^= std::byte{0x10};
    std::vector<std::byte> back(raw_.size());
    Status st = dec_.Decode(CodecKind::kBf16, p, back);
    if (st.ok()) {
      EXPECT_EQ(at - stream_at_, 4u) << "only the frame header descriptor's unused bit";
      EXPECT_EQ(back, raw_);
      ++harmless;
      continue;
    }
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << "byte " << at - stream_at_ << " of the exponent stream";
    EXPECT_EQ(st.message().rfind("bf16 ", 0), 0u) << st.message();
  }
  EXPECT_LE(harmless, 1);
}

TEST_F(Bf16Damage, AFlippedRawPlaneByteDecodesToTheFlippedValue) {
  // The raw plane has no checksum of its own (as a raw frame has none): the
  // frame tag is what catches wire damage there. It must still decode in bounds.
  auto p = payload_;
  p[kBf16HeaderBytes + 10] ^= std::byte{0x01};
  std::vector<std::byte> back(raw_.size());
  ASSERT_TRUE(dec_.Decode(CodecKind::kBf16, p, back).ok());
  EXPECT_EQ(back[20], raw_[20] ^ std::byte{0x01}) << "mantissa low bit of value 10";
  EXPECT_TRUE(std::equal(back.begin() + 21, back.end(), raw_.begin() + 21));
}

TEST_F(Bf16Damage, EveryPrefixAndRandomDamageEndInACleanError) {
  for (size_t n = 0; n < payload_.size(); n += 1 + n / 64) {
    EXPECT_FALSE(Decode(std::span(payload_).first(n)).ok()) << n;
  }
  std::mt19937_64 rng(11);
  for (int i = 0; i < 300; ++i) {
    auto p = payload_;
    const size_t at = stream_at_ + rng() % (p.size() - stream_at_);
    p[at] = static_cast<std::byte>(rng());
    p[(at + rng() % 64) % p.size()] = static_cast<std::byte>(rng());
    std::vector<std::byte> back(raw_.size());
    Status st = dec_.Decode(CodecKind::kBf16, p, back);
    if (st.ok()) continue;  // a byte set to the value it had, or a raw-plane byte
    EXPECT_EQ(st.code(), StatusCode::kCorrupt) << st.ToString();
  }
}

TEST(Bf16Codec, AMissingExponentFrameIsNamed) {
  // A one-byte frame whose payload has the header and the odd byte but no zstd frame.
  FrameDecoder dec;
  std::vector<std::byte> one(1);
  Status st = dec.Decode(CodecKind::kBf16, Bytes({0, 0, 0, 0, 0x42}), one);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("bf16 exponent stream is not a whole zstd frame"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace gpumigrate
