#include "gpumigrate/codec/codec.h"

#include <random>

#include <gtest/gtest.h>

#include "engine/devices/sim/content.h"

namespace gpumigrate {
namespace {

std::vector<std::byte> Weights(size_t bytes) {
  std::vector<std::byte> v(bytes);
  for (size_t off = 0; off < bytes; off += 65536) {
    sim::FillPage(1, 0, off / 65536, 1, sim::ContentKind::kWeights,
                  std::span(v).subspan(off, std::min<size_t>(65536, bytes - off)));
  }
  return v;
}

TEST(Codec, ParsesChoices) {
  EXPECT_EQ(ParseCodecChoice("none")->mode, CodecChoice::Mode::kNone);
  EXPECT_EQ(ParseCodecChoice("zstd")->level, 1);
  EXPECT_EQ(ParseCodecChoice("zstd:3")->level, 3);
  EXPECT_EQ(ParseCodecChoice("shuffle:2")->mode, CodecChoice::Mode::kShuffleZstd);
  EXPECT_EQ(ParseCodecChoice("auto")->mode, CodecChoice::Mode::kAuto);
  EXPECT_EQ(ParseCodecChoice("bf16")->mode, CodecChoice::Mode::kBf16);
  EXPECT_FALSE(ParseCodecChoice("bf16:1").ok()) << "bf16 takes no level";
  EXPECT_FALSE(ParseCodecChoice("lz4").ok());
  EXPECT_FALSE(ParseCodecChoice("zstd:99").ok());
  EXPECT_FALSE(ParseCodecChoice("zstd:x").ok());
}

TEST(Codec, RoundTripsBf16AndShuffleCompressesBetter) {
  auto raw = Weights(1 << 20);
  FrameEncoder enc;
  FrameDecoder dec;
  std::vector<std::byte> z, s, back(raw.size());
  ASSERT_EQ(enc.Encode(CodecKind::kZstd, 1, raw, z), CodecKind::kZstd);
  ASSERT_EQ(enc.Encode(CodecKind::kShuffleZstd, 1, raw, s), CodecKind::kShuffleZstd);
  EXPECT_LT(s.size(), z.size()) << "byte planes of bf16 compress better than interleaved bytes";
  EXPECT_LT(z.size(), raw.size() * 85 / 100);
  ASSERT_TRUE(dec.Decode(CodecKind::kZstd, z, back).ok());
  EXPECT_EQ(back, raw);
  std::fill(back.begin(), back.end(), std::byte{0});
  ASSERT_TRUE(dec.Decode(CodecKind::kShuffleZstd, s, back).ok());
  EXPECT_EQ(back, raw);
}

TEST(Codec, OddSizesAndIncompressibleData) {
  FrameEncoder enc;
  FrameDecoder dec;
  auto raw = Weights(4097);  // an odd byte at the end of the planes
  std::vector<std::byte> s, back(raw.size());
  ASSERT_EQ(enc.Encode(CodecKind::kShuffleZstd, 1, raw, s), CodecKind::kShuffleZstd);
  ASSERT_TRUE(dec.Decode(CodecKind::kShuffleZstd, s, back).ok());
  EXPECT_EQ(back, raw);
  std::vector<std::byte> noise(65536);
  std::mt19937_64 rng(5);
  for (auto& b : noise) b = static_cast<std::byte>(rng());
  std::vector<std::byte> out;
  EXPECT_EQ(enc.Encode(CodecKind::kZstd, 1, noise, out), CodecKind::kNone) << "sent raw when it does not shrink";
}

TEST(Codec, DecodeRejectsDamageAndSizeMismatch) {
  auto raw = Weights(65536);
  FrameEncoder enc;
  FrameDecoder dec;
  std::vector<std::byte> z;
  ASSERT_EQ(enc.Encode(CodecKind::kZstd, 1, raw, z), CodecKind::kZstd);
  std::vector<std::byte> back(raw.size()), small(raw.size() - 1);
  Status wrong_size = dec.Decode(CodecKind::kZstd, z, small);
  EXPECT_EQ(wrong_size.code(), StatusCode::kCorrupt);
  EXPECT_NE(wrong_size.message().find("decodes to 65536 bytes, the header says 65535"), std::string::npos)
      << wrong_size.message();
  auto damaged = z;
  damaged[damaged.size() / 2] ^= std::byte{0xff};
  EXPECT_FALSE(dec.Decode(CodecKind::kZstd, damaged, back).ok());
  std::vector<std::byte> garbage(100, std::byte{7});
  EXPECT_NE(dec.Decode(CodecKind::kZstd, garbage, back).message().find("not a zstd frame"), std::string::npos);
  EXPECT_FALSE(dec.Decode(static_cast<CodecKind>(9), z, back).ok());
}

// Hand-made samples: zstd 1.28 at 900 MB/s, shuffle 1.46 at 500 MB/s.
TEST(Codec, ChoosesWhatMovesARawByteFastest) {
  CodecSample s{1.28, 900e6, 1.46, 500e6};
  EXPECT_EQ(ChooseCodec(s, 0), CodecKind::kNone) << "unknown link: never compress";
  EXPECT_EQ(ChooseCodec(s, 100e6), CodecKind::kShuffleZstd);  // slow link: the better ratio wins
  EXPECT_EQ(ChooseCodec(s, 400e6), CodecKind::kZstd);         // shuffle would be CPU-bound at 1.25
  EXPECT_EQ(ChooseCodec(s, 2e9), CodecKind::kNone);           // both compressors slower than the link
  EXPECT_DOUBLE_EQ(EffectiveRatio(s, CodecKind::kShuffleZstd, 400e6), 1.25);
  EXPECT_DOUBLE_EQ(EffectiveRatio(s, CodecKind::kZstd, 2e9), 0.45);
  EXPECT_DOUBLE_EQ(EffectiveRatio(s, CodecKind::kNone, 2e9), 1.0);
  CodecSample flat{1.01, 900e6, 1.02, 500e6};
  EXPECT_EQ(ChooseCodec(flat, 100e6), CodecKind::kNone) << "a gain within noise is not worth the CPU";
}

// With bf16 sampled as on this project's machines: 1.51 at 1.6 GB/s.
TEST(Codec, AutoPicksBf16WhereverItMovesARawByteFasterThanTheLink) {
  CodecSample s{1.28, 900e6, 1.46, 500e6, 1.51, 1.6e9};
  EXPECT_EQ(ChooseCodec(s, 0), CodecKind::kNone) << "unknown link: never compress";
  EXPECT_EQ(ChooseCodec(s, 100e6), CodecKind::kBf16) << "ratio-bound: the best ratio, and the least CPU";
  EXPECT_EQ(ChooseCodec(s, 1e9), CodecKind::kBf16) << "still ratio-bound: 1.51 against zstd's CPU-bound 0.9";
  EXPECT_DOUBLE_EQ(EffectiveRatio(s, CodecKind::kBf16, 1e9), 1.51);
  EXPECT_DOUBLE_EQ(EffectiveRatio(s, CodecKind::kBf16, 1.28e9), 1.25);
  EXPECT_EQ(ChooseCodec(s, 1.28e9), CodecKind::kBf16) << "CPU-bound, yet 1.25x faster than raw";
  EXPECT_EQ(ChooseCodec(s, 1.6e9 / 1.06), CodecKind::kBf16) << "6% faster than raw";
  EXPECT_EQ(ChooseCodec(s, 1.6e9 / 1.04), CodecKind::kNone) << "4%: within the noise of the speed sample";
  EXPECT_EQ(ChooseCodec(s, 2.4e9), CodecKind::kNone) << "loopback: raw bytes move faster than bf16 compresses";

  // Within 5% of each other on the wire, the cheaper compressor wins.
  CodecSample close{1.28, 900e6, 1.52, 500e6, 1.50, 1.6e9};
  EXPECT_EQ(ChooseCodec(close, 100e6), CodecKind::kBf16) << "1.50 vs shuffle's 1.52 at a third of the CPU";
  CodecSample far{1.28, 900e6, 1.70, 500e6, 1.50, 1.6e9};
  EXPECT_EQ(ChooseCodec(far, 100e6), CodecKind::kShuffleZstd) << "a 13% better ratio is worth shuffle's CPU";
  EXPECT_EQ(ChooseCodec(far, 600e6), CodecKind::kBf16) << "shuffle CPU-bound at 0.83";

  CodecSample unsampled{1.28, 900e6, 1.46, 500e6};
  EXPECT_EQ(ChooseCodec(unsampled, 100e6), CodecKind::kShuffleZstd) << "bf16 not measured: never chosen";
  EXPECT_DOUBLE_EQ(EffectiveRatio(unsampled, CodecKind::kBf16, 100e6), 0);
}

TEST(Codec, SamplingMeasuresRatioAndSpeed) {
  auto raw = Weights(1 << 20);
  CodecSample s = SampleCodecs(raw, 1);
  EXPECT_NEAR(s.zstd_ratio, 1.28, 0.05);
  EXPECT_NEAR(s.shuffle_ratio, 1.46, 0.05);
  EXPECT_NEAR(s.bf16_ratio, 1.51, 0.03);
  EXPECT_GT(s.bf16_bytes_per_s, 0);
  EXPECT_GT(s.zstd_bytes_per_s, 0);
  EXPECT_GT(s.shuffle_bytes_per_s, 0);
}

}  // namespace
}  // namespace gpumigrate
