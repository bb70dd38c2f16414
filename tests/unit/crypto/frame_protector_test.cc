#include "transport/crypto/frame_protector.h"

#include <gtest/gtest.h>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "tests/support/device_compare.h"

namespace gpumigrate {
namespace {

std::array<std::byte, 32> Key(uint8_t v) {
  std::array<std::byte, 32> k;
  k.fill(std::byte{v});
  return k;
}

wire::HeaderBytes Header(uint64_t seq) {
  wire::FrameHeader h;
  h.type = wire::FrameType::kPages;
  h.sequence = seq;
  h.raw_length = h.payload_length = 1000;
  return wire::EncodeHeader(h);
}

TEST(AesGcm, SealsAndOpensAndRejectsEveryKindOfTampering) {
  FrameKeys keys{.aes_gcm = true, .aes_key = Key(1)};
  auto seal = MakeFrameProtector(keys);
  auto open = MakeFrameProtector(keys);
  std::vector<std::byte> plain(1000, std::byte{0x42}), scratch;
  wire::Tag tag;
  auto hb = Header(7);
  auto sealed = seal->Seal(hb, 2, 7, plain, scratch, tag);
  ASSERT_TRUE(sealed.ok());
  std::vector<std::byte> wire(sealed->begin(), sealed->end());
  EXPECT_NE(wire, plain) << "the payload must be encrypted";

  auto ok = wire;
  ASSERT_TRUE(open->Open(hb, 2, 7, ok, tag).ok());
  EXPECT_EQ(ok, plain);

  auto bad_payload = wire;
  bad_payload[500] ^= std::byte{1};
  EXPECT_NE(open->Open(hb, 2, 7, bad_payload, tag).message().find("authentication failed"), std::string::npos);
  auto bad_header = hb;
  bad_header[24] ^= std::byte{1};
  auto w2 = wire;
  EXPECT_FALSE(open->Open(bad_header, 2, 7, w2, tag).ok());
  auto w3 = wire;
  EXPECT_FALSE(open->Open(hb, 3, 7, w3, tag).ok()) << "another stream's nonce";
  auto w4 = wire;
  EXPECT_FALSE(open->Open(hb, 2, 8, w4, tag).ok()) << "a replay under another sequence";
  auto bad_tag = tag;
  bad_tag[0] ^= std::byte{1};
  auto w5 = wire;
  EXPECT_FALSE(open->Open(hb, 2, 7, w5, bad_tag).ok());
  auto other = MakeFrameProtector(FrameKeys{.aes_gcm = true, .aes_key = Key(2)});
  auto w6 = wire;
  EXPECT_FALSE(other->Open(hb, 2, 7, w6, tag).ok()) << "another session's key";
}

// The stream threads seal each frame in its own buffer (FrameSender): the same
// bytes and tag as Seal into scratch, under both protectors, and they open.
TEST(FrameProtector, SealInPlaceGivesSealsBytesAndTag) {
  for (bool aes : {true, false}) {
    FrameKeys keys{.aes_gcm = aes, .integrity_key = 77, .aes_key = Key(3)};
    auto a = MakeFrameProtector(keys);
    auto b = MakeFrameProtector(keys);
    std::vector<std::byte> plain(1000), scratch;
    for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<std::byte>(i * 13);
    const auto header = Header(9);
    wire::Tag t1, t2;
    auto sealed = a->Seal(header, 2, 9, plain, scratch, t1);
    ASSERT_TRUE(sealed.ok());
    std::vector<std::byte> expect(sealed->begin(), sealed->end());
    std::vector<std::byte> in_place = plain;
    ASSERT_TRUE(b->SealInPlace(header, 2, 9, in_place, t2).ok());
    EXPECT_EQ(in_place, expect) << (aes ? "aes" : "integrity");
    EXPECT_EQ(t1, t2);
    ASSERT_TRUE(b->Open(header, 2, 9, in_place, t2).ok());
    EXPECT_EQ(in_place, plain);
  }
}

TEST(AesGcm, SamePayloadUnderAnotherNonceLooksDifferent) {
  auto p = MakeFrameProtector(FrameKeys{.aes_gcm = true, .aes_key = Key(1)});
  std::vector<std::byte> plain(64, std::byte{0}), s1, s2;
  wire::Tag t1, t2;
  auto a = p->Seal(Header(1), 0, 1, plain, s1, t1);
  auto b = p->Seal(Header(2), 0, 2, plain, s2, t2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(s1, s2);
}

TEST(Hkdf, DeterministicAndSeparatedBySessionAndLabel) {
  std::vector<std::byte> secret(32, std::byte{9});
  auto a = DeriveKey(secret, 1, "data");
  auto b = DeriveKey(secret, 1, "data");
  auto c = DeriveKey(secret, 2, "data");
  auto d = DeriveKey(secret, 1, "join");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_NE(*a, *d);
}

struct Devices {
  SimSpec spec = *ParseSimSpec("sim:size=16MiB,hot=1MiB,kv_rate=16MiB/s,page=16KiB,step=2ms");
  std::unique_ptr<SimDevice> src = *SimDevice::Create(spec, SimRole::kSource);
  std::unique_ptr<SimDevice> dst = *SimDevice::Create(spec, SimRole::kDestination);
};

TEST(EncryptedMigration, EqualAtStopUnderAesGcm) {
  Devices d;
  LocalMigrationOptions opt;
  opt.data_streams = 2;
  opt.source.aes_key = Key(5);
  opt.destination.aes_key = Key(5);
  ::testing::AssertionResult equal = ::testing::AssertionFailure() << "commit never reached";
  opt.destination.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kCommitReceived) equal = testing::DevicesEqual(*d.src, *d.dst);
  };
  auto res = MigrateLocally(*d.src, *d.dst, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kCompleted) << res.source.status.ToString();
  EXPECT_TRUE(equal);
}

TEST(EncryptedMigration, WrongKeyFailsAuthentication) {
  Devices d;
  LocalMigrationOptions opt;
  opt.source.aes_key = Key(5);
  opt.destination.aes_key = Key(6);
  auto res = MigrateLocally(*d.src, *d.dst, opt);
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_NE(res.source.status.message().find("authentication failed"), std::string::npos)
      << res.source.status.message();
  EXPECT_EQ(d.src->State(), DeviceState::kRunning);
}

TEST(EncryptedMigration, NoDowngradeAndNoKeylessDecryption) {
  {
    Devices d;
    LocalMigrationOptions opt;
    opt.destination.aes_key = Key(5);  // the destination demands encryption
    auto res = MigrateLocally(*d.src, *d.dst, opt);
    EXPECT_EQ(res.source.outcome, Outcome::kAborted);
    EXPECT_NE(res.source.status.message().find("requires AES-256-GCM"), std::string::npos)
        << res.source.status.message();
  }
  {
    Devices d;
    LocalMigrationOptions opt;
    opt.source.aes_key = Key(5);
    auto res = MigrateLocally(*d.src, *d.dst, opt);
    EXPECT_EQ(res.source.outcome, Outcome::kAborted);
    EXPECT_NE(res.source.status.message().find("no session key"), std::string::npos) << res.source.status.message();
  }
}

}  // namespace
}  // namespace gpumigrate
