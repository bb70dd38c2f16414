// Protocol version negotiation (issue 16, item 5): each Hello carries the range
// of versions a peer speaks; both sides speak the newest in both ranges or
// refuse naming both. The "newer peers" here are faked Hellos: this build only
// speaks version 1.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "transport/wire/control_channel.h"

namespace gpumigrate::wire {
namespace {

v1::Hello PeerHello(uint32_t newest, uint32_t oldest = 0, const char* product = "") {
  v1::Hello h;
  h.set_protocol_version(newest);
  h.set_oldest_protocol_version(oldest);
  h.set_product_version(product);
  return h;
}

TEST(ProtocolVersion, OurOwnHelloNegotiatesOurVersion) {
  auto v = NegotiateProtocol(MakeHello("test", {}).hello());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, kProtocolVersion);
}

TEST(ProtocolVersion, OurHelloKeepsTheBytesOfAOneVersionPeer) {
  // While this build speaks one version, the range field stays unset, so a
  // 1.x peer that predates it reads the same Hello as before.
  if (kOldestProtocolVersion != kProtocolVersion) GTEST_SKIP() << "this build speaks a range";
  EXPECT_EQ(MakeHello("test", {}).hello().oldest_protocol_version(), 0u);
}

TEST(ProtocolVersion, ANewerPeerThatStillSpeaksOursIsAcceptedAtOurs) {
  auto v = NegotiateProtocol(PeerHello(kProtocolVersion + 1, kProtocolVersion, "9.0.0"));
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, kProtocolVersion);
}

TEST(ProtocolVersion, ANewerPeerThatDroppedOursIsRefusedNamingBothSides) {
  auto v = NegotiateProtocol(PeerHello(kProtocolVersion + 2, kProtocolVersion + 1, "9.0.0"));
  ASSERT_FALSE(v.ok());
  const std::string why(v.status().message());
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(why.find(fmt::format("the peer (gpumigrate 9.0.0) speaks protocol version {}..{}", kProtocolVersion + 1,
                                 kProtocolVersion + 2)),
            std::string::npos)
      << why;
  EXPECT_NE(why.find(fmt::format("speaks version {}", kProtocolVersion)), std::string::npos) << why;
  EXPECT_NE(why.find("upgrade this build"), std::string::npos) << why;
}

TEST(ProtocolVersion, AnOlderPeerIsToldToUpgrade) {
  if (kOldestProtocolVersion <= 1) {
    // Nothing is older than version 1; a Hello naming 0 is malformed.
    auto v = NegotiateProtocol(PeerHello(0));
    ASSERT_FALSE(v.ok());
    EXPECT_NE(std::string(v.status().message()).find("names protocol versions 0..0"), std::string::npos)
        << v.status().message();
    return;
  }
  auto v = NegotiateProtocol(PeerHello(kOldestProtocolVersion - 1));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(std::string(v.status().message()).find("upgrade the peer"), std::string::npos) << v.status().message();
}

TEST(ProtocolVersion, AnInvertedRangeIsMalformed) {
  auto v = NegotiateProtocol(PeerHello(1, 5));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(std::string(v.status().message()).find("names protocol versions 5..1"), std::string::npos)
      << v.status().message();
}

}  // namespace
}  // namespace gpumigrate::wire
