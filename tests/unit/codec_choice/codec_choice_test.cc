// Sampling a region and choosing its codec, against a scripted device whose
// contents are known exactly.
#include "engine/codec_choice/codec_choice.h"

#include <gtest/gtest.h>

#include "tests/support/fake_device.h"

namespace gpumigrate {
namespace {

using testing::FakeDevice;

constexpr uint32_t kPage = 4096;
constexpr double kSlowLink = 10e6;  // far slower than any compressor

TEST(CodecChoice, AnAllZeroRegionHasNothingToCompress) {
  FakeDevice dev({RegionInfo{0, "free", 64 * kPage, kPage, RegionHint::kUnknown}}, DeviceState::kRunning);
  RegionSampleOptions o;
  o.spread_pages = 16;
  auto s = SampleRegion(dev, dev.Regions()[0], o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->pages_read, 16u);
  EXPECT_EQ(s->nonzero_pages, 0u);
  EXPECT_EQ(s->sampled_bytes, 0u);
  EXPECT_DOUBLE_EQ(s->nonzero_fraction(), 0);
  EXPECT_DOUBLE_EQ(s->codecs.zstd_ratio, 1);
  EXPECT_DOUBLE_EQ(s->codecs.shuffle_ratio, 1);

  auto chosen = SampleAndChooseCodec(dev, dev.Regions()[0], *ParseCodecChoice("auto"), kSlowLink,
                                     SessionSampleOptions(dev.Regions()[0], 1));
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(chosen->codec, CodecKind::kNone);
  ASSERT_TRUE(chosen->sample.has_value());
  EXPECT_EQ(chosen->sample->nonzero_pages, 0u);
}

TEST(CodecChoice, ACompressibleRegionOnACappedLinkGetsACodec) {
  FakeDevice dev({RegionInfo{0, "kv", 64 * kPage, kPage, RegionHint::kDynamic}}, DeviceState::kRunning);
  for (uint64_t p = 0; p < 64; p += 2) dev.Touch(0, p, 0x5a);  // half the pages: one repeated byte
  const RegionInfo& r = dev.Regions()[0];

  auto capped = SampleAndChooseCodec(dev, r, *ParseCodecChoice("auto"), kSlowLink, SessionSampleOptions(r, 1));
  ASSERT_TRUE(capped.ok()) << capped.status().ToString();
  EXPECT_NE(capped->codec, CodecKind::kNone);
  ASSERT_TRUE(capped->sample.has_value());
  EXPECT_GT(capped->sample->codecs.zstd_ratio, 10);
  EXPECT_GT(capped->sample->codecs.shuffle_ratio, 10);
  EXPECT_GT(capped->sample->codecs.bf16_ratio, 1.5) << "each value's exponent byte of 0x5a5a codes to almost nothing";
  EXPECT_EQ(capped->sample->sampled_bytes, 32u * kPage) << "only the non-zero pages are measured";
  EXPECT_DOUBLE_EQ(capped->sample->nonzero_fraction(), 0.5);

  auto uncapped = SampleAndChooseCodec(dev, r, *ParseCodecChoice("auto"), 0, SessionSampleOptions(r, 1));
  ASSERT_TRUE(uncapped.ok());
  EXPECT_EQ(uncapped->codec, CodecKind::kNone) << "an unknown link never pays for compression";
  EXPECT_TRUE(uncapped->sample.has_value()) << "the sampled ratios are still reported";
}

TEST(CodecChoice, AFixedChoiceTakesNoSample) {
  FakeDevice dev({RegionInfo{0, "w", 8 * kPage, kPage, RegionHint::kStatic}}, DeviceState::kRunning);
  const RegionInfo& r = dev.Regions()[0];
  for (const char* name : {"none", "zstd", "shuffle", "bf16"}) {
    CodecChoice c = *ParseCodecChoice(name);
    auto chosen = SampleAndChooseCodec(dev, r, c, kSlowLink, SessionSampleOptions(r, 1));
    ASSERT_TRUE(chosen.ok());
    EXPECT_EQ(chosen->codec, *FixedCodec(c)) << name;
    EXPECT_FALSE(chosen->sample.has_value()) << name;
    EXPECT_EQ(ChooseRegionCodec(c, CodecSample{}, kSlowLink), *FixedCodec(c)) << name;
  }
  CodecSample s{1.28, 900e6, 1.46, 500e6};
  EXPECT_EQ(ChooseRegionCodec(*ParseCodecChoice("auto"), s, 100e6), ChooseCodec(s, 100e6));
}

TEST(CodecChoice, TheSessionSampleStopsWhenFullTheEstimatorCountsEveryPage) {
  // 1024 data pages: the session reads 4 x 256 spread pages but stops at 1 MiB.
  FakeDevice dev({RegionInfo{0, "w", 1024 * kPage, kPage, RegionHint::kStatic}}, DeviceState::kRunning);
  for (uint64_t p = 0; p < 1024; ++p) dev.Touch(0, p, static_cast<uint8_t>(p | 1));
  const RegionInfo& r = dev.Regions()[0];
  RegionSampleOptions session = SessionSampleOptions(r, 1);
  EXPECT_EQ(session.spread_pages, 1024u);
  EXPECT_EQ(session.sample_bytes, 1u << 20);
  auto s = SampleRegion(dev, r, session);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->pages_read, 256u);
  EXPECT_EQ(s->sampled_bytes, 1u << 20);

  RegionSampleOptions estimator;
  estimator.spread_pages = 512;
  auto e = SampleRegion(dev, r, estimator);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->pages_read, 512u);
  EXPECT_EQ(e->nonzero_pages, 512u);
  EXPECT_EQ(e->sampled_bytes, 1u << 20);
}

TEST(CodecChoice, AShortLastPageAndATinyRegionAreReadOnce) {
  FakeDevice dev({RegionInfo{0, "t", 2 * kPage + 100, kPage, RegionHint::kStatic}}, DeviceState::kRunning);
  dev.Touch(0, 0, 9);
  auto s = SampleRegion(dev, dev.Regions()[0], SessionSampleOptions(dev.Regions()[0], 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->pages_read, 3u) << "each page once, the 100-byte tail included";
  EXPECT_EQ(s->nonzero_pages, 1u);
  EXPECT_EQ(s->sampled_bytes, kPage);
}

}  // namespace
}  // namespace gpumigrate
