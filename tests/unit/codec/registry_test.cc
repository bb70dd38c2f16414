// The codec registry: one entry per codec_flags value, and every lookup the
// session makes (by flag, by name, capabilities, the peer check) walks it.
#include <gtest/gtest.h>

#include "engine/devices/sim/content.h"
#include "gpumigrate/codec/codec.h"
#include "transport/wire/control_channel.h"

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

TEST(CodecRegistry, EntriesAreKeyedByTheirWireFlag) {
  auto codecs = Codecs();
  ASSERT_EQ(codecs.size(), 4u);
  for (size_t i = 0; i < codecs.size(); ++i) {
    const CodecInfo& c = codecs[i];
    EXPECT_EQ(static_cast<size_t>(c.kind), i) << c.name;
    EXPECT_EQ(FindCodec(static_cast<uint8_t>(i)), &c);
    ASSERT_TRUE(CodecFromFlags(static_cast<uint8_t>(i)).ok());
    EXPECT_EQ(*CodecFromFlags(static_cast<uint8_t>(i)), c.kind);
    EXPECT_EQ(&CodecOf(c.kind), &c);
    EXPECT_EQ(CodecKindName(c.kind), c.name);
  }
  // The wire values and report names never change (transport/wire/FORMAT.md, golden files, JSON).
  EXPECT_EQ(static_cast<int>(CodecKind::kNone), 0);
  EXPECT_EQ(static_cast<int>(CodecKind::kZstd), 1);
  EXPECT_EQ(static_cast<int>(CodecKind::kShuffleZstd), 2);
  EXPECT_EQ(static_cast<int>(CodecKind::kBf16), 3);
  EXPECT_EQ(CodecKindName(CodecKind::kNone), "none");
  EXPECT_EQ(CodecKindName(CodecKind::kZstd), "zstd");
  EXPECT_EQ(CodecKindName(CodecKind::kShuffleZstd), "shuffle-zstd");
  EXPECT_EQ(CodecKindName(CodecKind::kBf16), "bf16");
  EXPECT_EQ(CodecKindName(static_cast<CodecKind>(9)), "unknown");
}

TEST(CodecRegistry, EveryFlagRoundTrips) {
  const auto raw = Weights(65536 + 4097);  // a short, odd tail
  FrameEncoder enc;
  FrameDecoder dec;
  for (const CodecInfo& c : Codecs()) {
    SCOPED_TRACE(std::string(c.name));
    std::vector<std::byte> out;
    CodecKind used = enc.Encode(c.kind, 1, raw, out);
    EXPECT_EQ(used, c.kind) << "weights shrink under every compressing codec";
    auto payload = used == CodecKind::kNone ? std::span<const std::byte>(raw) : std::span<const std::byte>(out);
    std::vector<std::byte> back(raw.size());
    Status st = dec.Decode(used, payload, back);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(back, raw);
  }
}

TEST(CodecRegistry, UnknownFlagsAreRejectedClearly) {
  for (int f = 4; f < 256; ++f) EXPECT_EQ(FindCodec(static_cast<uint8_t>(f)), nullptr) << f;
  auto bad = CodecFromFlags(9);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorrupt);
  EXPECT_EQ(bad.status().message(), "codec flags 0x9 are not a known codec");
  EXPECT_EQ(CodecFromFlags(0xff).status().message(), "codec flags 0xff are not a known codec");
  FrameDecoder dec;
  std::vector<std::byte> payload(16), raw(16);
  Status st = dec.Decode(static_cast<CodecKind>(9), payload, raw);
  EXPECT_EQ(st.code(), StatusCode::kCorrupt);
  EXPECT_NE(st.message().find("not a known codec"), std::string::npos) << st.message();
  FrameEncoder enc;
  std::vector<std::byte> out;
  EXPECT_EQ(enc.Encode(static_cast<CodecKind>(9), 1, Weights(4096), out), CodecKind::kNone) << "sent raw";
}

TEST(CodecRegistry, NoneDecodesOnlyAnExactSizePayload) {
  FrameDecoder dec;
  std::vector<std::byte> payload(10, std::byte{3}), raw(11);
  EXPECT_EQ(dec.Decode(CodecKind::kNone, payload, raw).code(), StatusCode::kCorrupt);
}

TEST(CodecRegistry, NamesMapToChoicesAndBack) {
  EXPECT_EQ(FindCodecByName("zstd")->kind, CodecKind::kZstd);
  EXPECT_EQ(FindCodecByName("shuffle")->kind, CodecKind::kShuffleZstd);
  EXPECT_EQ(FindCodecByName("shuffle-zstd")->kind, CodecKind::kShuffleZstd);
  EXPECT_EQ(FindCodecByName("bf16")->kind, CodecKind::kBf16);
  EXPECT_EQ(FindCodecByName("none")->kind, CodecKind::kNone);
  EXPECT_EQ(FindCodecByName("auto"), nullptr) << "auto is a choice, not a codec";
  EXPECT_EQ(FindCodecByName("lz4"), nullptr);
  for (const CodecInfo& c : Codecs()) {
    auto choice = ParseCodecChoice(c.flag_name);
    ASSERT_TRUE(choice.ok()) << c.flag_name;
    EXPECT_EQ(FixedCodec(*choice), c.kind);
    EXPECT_EQ(ParseCodecChoice(choice->ToString())->mode, choice->mode) << choice->ToString();
  }
  EXPECT_EQ(ParseCodecChoice("none")->ToString(), "none");
  EXPECT_EQ(ParseCodecChoice("zstd:3")->ToString(), "zstd:3");
  EXPECT_EQ(ParseCodecChoice("shuffle-zstd:2")->ToString(), "shuffle:2");
  EXPECT_EQ(ParseCodecChoice("auto")->ToString(), "auto:1");
  EXPECT_EQ(ParseCodecChoice("bf16")->ToString(), "bf16") << "one setting: no level";
  EXPECT_EQ(ParseCodecChoice("bf16")->mode, CodecChoice::Mode::kBf16);
  EXPECT_EQ(ParseCodecChoice("bf16:3").status().message(), "codec: bf16 takes no level ('bf16:3')");
  EXPECT_EQ(ParseCodecChoice("none:1").status().message(), "codec: none takes no level ('none:1')");
  EXPECT_EQ(ParseCodecChoice("auto:3")->ToString(), "auto:3") << "auto's level is for the codecs that take one";
  EXPECT_EQ(FixedCodec(*ParseCodecChoice("auto")), std::nullopt);
  EXPECT_EQ(ParseCodecChoice("lz4").status().message(),
            "codec: 'lz4' is not one of none, zstd[:LEVEL], shuffle[:LEVEL], bf16, auto");
}

TEST(CodecRegistry, CapabilitiesAreTheWireSpellings) {
  EXPECT_EQ(DecodeCapabilities(), (std::vector<std::string>{wire::kCapZstd, wire::kCapShuffleZstd, wire::kCapBf16}));
  EXPECT_TRUE(CodecOf(CodecKind::kNone).capability.empty()) << "every peer reads raw bytes";

  const std::vector<std::string> none, zstd_only{wire::kCapZstd}, all = DecodeCapabilities();
  EXPECT_TRUE(PeerDecodes(none, CodecKind::kNone));
  EXPECT_FALSE(PeerDecodes(none, CodecKind::kZstd));
  EXPECT_TRUE(PeerDecodes(zstd_only, CodecKind::kZstd));
  EXPECT_FALSE(PeerDecodes(zstd_only, CodecKind::kShuffleZstd));
  EXPECT_FALSE(PeerDecodes(all, static_cast<CodecKind>(9)));
  // A peer from before the bf16 codec: a source never sends it bf16, and auto needs it.
  const std::vector<std::string> before_bf16{wire::kCapZstd, wire::kCapShuffleZstd};
  EXPECT_FALSE(PeerDecodes(before_bf16, CodecKind::kBf16));
  EXPECT_FALSE(PeerDecodes(before_bf16, *ParseCodecChoice("bf16")));
  EXPECT_FALSE(PeerDecodes(before_bf16, *ParseCodecChoice("auto")));
  EXPECT_TRUE(PeerDecodes(before_bf16, *ParseCodecChoice("shuffle")));
  EXPECT_TRUE(PeerDecodes(all, *ParseCodecChoice("bf16")));

  EXPECT_TRUE(PeerDecodes(none, *ParseCodecChoice("none")));
  EXPECT_FALSE(PeerDecodes(none, *ParseCodecChoice("zstd")));
  EXPECT_TRUE(PeerDecodes(zstd_only, *ParseCodecChoice("zstd")));
  EXPECT_FALSE(PeerDecodes(zstd_only, *ParseCodecChoice("auto"))) << "auto may pick any codec";
  EXPECT_TRUE(PeerDecodes(all, *ParseCodecChoice("auto")));
}

TEST(CodecRegistry, ZeroPages) {
  std::vector<std::byte> page(4096);
  EXPECT_TRUE(IsZeroPage(page));
  EXPECT_TRUE(IsZeroPage({}));
  for (size_t at : {size_t{0}, size_t{7}, size_t{8}, size_t{4095}}) {
    page[at] = std::byte{1};
    EXPECT_FALSE(IsZeroPage(page)) << at;
    page[at] = std::byte{0};
  }
  std::vector<std::byte> odd(13);
  odd[12] = std::byte{1};
  EXPECT_FALSE(IsZeroPage(odd)) << "a byte past the last whole word";
}

}  // namespace
}  // namespace gpumigrate
