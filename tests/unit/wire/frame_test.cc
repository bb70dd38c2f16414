#include "transport/wire/frame.h"

#include <gtest/gtest.h>

namespace gpumigrate::wire {
namespace {

FrameHeader Sample() {
  FrameHeader h;
  h.type = FrameType::kPages;
  h.stream_id = 3;
  h.region = 2;
  h.sequence = 0x0102030405060708ull;
  h.round = 7;
  h.offset = 1ull << 40;
  h.raw_length = 65536;
  h.payload_length = 65536;
  return h;
}

TEST(Frame, HeaderRoundTripsAndIsLittleEndian) {
  HeaderBytes b = EncodeHeader(Sample());
  EXPECT_EQ(b[0], std::byte{'G'});
  EXPECT_EQ(b[3], std::byte{'1'});
  EXPECT_EQ(b[16], std::byte{0x08});  // sequence, low byte first
  auto h = DecodeHeader(b);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->sequence, Sample().sequence);
  EXPECT_EQ(h->offset, Sample().offset);
  EXPECT_EQ(h->round, 7u);
  EXPECT_EQ(h->type, FrameType::kPages);
}

TEST(Frame, DecodeRejectsDamagedHeaders) {
  HeaderBytes b = EncodeHeader(Sample());
  auto magic = b;
  magic[1] ^= std::byte{0x40};
  EXPECT_NE(DecodeHeader(magic).status().message().find("bad frame magic"), std::string::npos);
  auto version = b;
  version[4] = std::byte{9};
  EXPECT_NE(DecodeHeader(version).status().message().find("version 9"), std::string::npos);
  auto type = b;
  type[6] = std::byte{0};
  EXPECT_NE(DecodeHeader(type).status().message().find("unknown frame type 0"), std::string::npos);
  auto reserved = b;
  reserved[28] = std::byte{1};
  EXPECT_FALSE(DecodeHeader(reserved).ok());
}

TEST(Frame, TagCoversHeaderPayloadAndKey) {
  HeaderBytes b = EncodeHeader(Sample());
  std::vector<std::byte> payload(1000, std::byte{7});
  Tag t = ComputeTag(42, b, payload);
  EXPECT_EQ(t, ComputeTag(42, b, payload));
  EXPECT_NE(t, ComputeTag(43, b, payload));  // another session
  auto p2 = payload;
  p2[999] ^= std::byte{1};
  EXPECT_NE(t, ComputeTag(42, b, p2));
  auto b2 = b;
  b2[40] ^= std::byte{1};
  EXPECT_NE(t, ComputeTag(42, b2, payload));
}

}  // namespace
}  // namespace gpumigrate::wire
