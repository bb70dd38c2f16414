// The destination against a hand-scripted source: frames and messages built
// byte by byte, so cases a well-behaved source never produces (an older round
// arriving after a newer one, a replayed frame, a frame of another session, a
// bad length prefix, a foreign protocol version) can be checked exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "engine/session/page_hashes.h"
#include "gpumigrate/session/session.h"
#include "tests/support/fake_device.h"
#include "transport/wire/control_channel.h"
#include "transport/wire/frame.h"

namespace gpumigrate {
namespace {

namespace v1 = wire::v1;
using testing::FakeDevice;
using namespace std::chrono_literals;

constexpr uint64_t kKey = 0x1234;
constexpr uint32_t kPage = 4096;

std::vector<RegionInfo> Layout() { return {RegionInfo{0, "a", 8 * kPage, kPage, RegionHint::kDynamic}}; }

class ScriptedSource {
 public:
  explicit ScriptedSource(int streams) : dst_(Layout(), DeviceState::kStop) {
    auto [c, dc] = MakePipe("control", 1 << 20);
    control_ = std::move(c);
    dst_control_ = std::move(dc);
    for (int i = 0; i < streams; ++i) {
      auto [d, dd] = MakePipe("data", 1 << 20);
      data_.push_back(std::move(d));
      dst_data_.push_back(std::move(dd));
    }
    SessionStreams s;
    s.control = dst_control_.get();
    for (auto& d : dst_data_) s.data.push_back(d.get());
    opt_.peer_timeout = 5s;
    thread_ = std::thread([this, s] { report_ = RunDestination(dst_, s, opt_); });
  }
  ~ScriptedSource() { Finish(); }

  MigrationReport& Finish() {
    if (thread_.joinable()) {
      control_->Close();
      for (auto& d : data_) d->Close();
      thread_.join();
    }
    return report_;
  }

  void Send(const v1::Envelope& e) { ASSERT_TRUE(wire::SendEnvelope(*control_, e).ok()); }
  Result<v1::Envelope> Recv() { return wire::RecvEnvelope(*control_); }

  void Handshake(uint32_t version = wire::kProtocolVersion) {
    v1::Envelope h;
    h.mutable_hello()->set_protocol_version(version);
    Send(h);
  }
  void ManifestAndReady() {
    auto hello = Recv();
    ASSERT_TRUE(hello.ok() && hello->has_hello());
    v1::Envelope m;
    auto* mf = m.mutable_manifest();
    mf->set_session_id(kKey);
    mf->set_data_streams(static_cast<uint32_t>(data_.size()));
    mf->set_cipher(v1::CIPHER_NONE_INTEGRITY_ONLY);
    mf->set_max_frame_payload_bytes(1 << 20);
    auto* r = mf->add_regions();
    r->set_id(0);
    r->set_name("a");
    r->set_size_bytes(8 * kPage);
    r->set_page_size(kPage);
    r->set_hint(v1::REGION_HINT_DYNAMIC);
    Send(m);
    auto ready = Recv();
    ASSERT_TRUE(ready.ok() && ready->has_ready()) << ready.status().ToString();
  }
  // One page of `value` at page `page`, as frame `seq` of `stream`, in `round`.
  void Frame(int stream, uint64_t seq, uint32_t round, uint64_t page, uint8_t value, uint64_t key = kKey) {
    std::vector<std::byte> payload(kPage, std::byte{value});
    wire::FrameHeader h;
    h.type = wire::FrameType::kPages;
    h.stream_id = static_cast<uint32_t>(stream);
    h.sequence = seq;
    h.round = round;
    h.offset = page * kPage;
    h.raw_length = h.payload_length = kPage;
    auto hb = wire::EncodeHeader(h);
    auto tag = wire::ComputeTag(key, hb, payload);
    ASSERT_TRUE(data_[stream]->WriteAll(hb).ok());
    ASSERT_TRUE(data_[stream]->WriteAll(payload).ok());
    ASSERT_TRUE(data_[stream]->WriteAll(tag).ok());
  }
  // A frame with any payload and codec flags, tagged correctly.
  void RawFrame(int stream, uint64_t seq, uint64_t page, uint8_t codec, std::vector<std::byte> payload,
                uint32_t raw_length) {
    wire::FrameHeader h;
    h.type = wire::FrameType::kPages;
    h.codec_flags = codec;
    h.stream_id = static_cast<uint32_t>(stream);
    h.sequence = seq;
    h.offset = page * kPage;
    h.raw_length = raw_length;
    h.payload_length = static_cast<uint32_t>(payload.size());
    auto hb = wire::EncodeHeader(h);
    auto tag = wire::ComputeTag(kKey, hb, payload);
    ASSERT_TRUE(data_[stream]->WriteAll(hb).ok());
    // A destination may refuse the frame from its header alone (an unknown
    // codec) and close its end before the payload is written: the verdict is
    // the Abort the test reads, not whether these writes found a reader.
    (void)data_[stream]->WriteAll(payload);
    (void)data_[stream]->WriteAll(tag);
  }
  void RoundEnd(uint32_t round, std::vector<uint64_t> counts) {
    v1::Envelope e;
    e.mutable_round_end()->set_round(round);
    for (uint64_t c : counts) e.mutable_round_end()->add_frames_per_stream(c);
    Send(e);
  }
  // Prepare with digests of `pages` (page -> value; others zero), then Commit.
  Result<v1::Envelope> PrepareAndCommit(const std::map<uint64_t, uint8_t>& pages, std::vector<uint64_t> counts) {
    PageHashes hashes(Layout());
    for (auto [p, v] : pages) {
      std::vector<std::byte> bytes(kPage, std::byte{v});
      hashes.Set(0, p, HashPage(bytes));
    }
    v1::Envelope e;
    auto* p = e.mutable_prepare();
    for (uint64_t c : counts) p->add_frames_per_stream(c);
    auto* d = p->add_digests();
    d->set_region(0);
    d->set_digest(hashes.RegionDigest(0));
    Send(e);
    GM_ASSIGN_OR_RETURN(v1::Envelope prepared, Recv());
    if (!prepared.has_prepared()) return prepared;
    v1::Envelope c;
    c.mutable_commit();
    Send(c);
    return Recv();
  }

  FakeDevice& device() { return dst_; }
  Stream& control() { return *control_; }

 private:
  FakeDevice dst_;
  std::unique_ptr<Stream> control_, dst_control_;
  std::vector<std::unique_ptr<Stream>> data_, dst_data_;
  DestinationOptions opt_;
  MigrationReport report_;
  std::thread thread_;
};

// Streams are not ordered with each other: a page's round-1 copy may arrive after
// its round-2 copy. The destination keeps the newer one.
TEST(DestinationProtocol, OlderRoundNeverOverwritesNewer) {
  ScriptedSource s(2);
  s.Handshake();
  s.ManifestAndReady();
  s.Frame(1, 0, 2, 0, 0xBB);  // round 2 first, on stream 1
  s.Frame(0, 0, 1, 0, 0xAA);  // then the stale round 1, on stream 0
  s.Frame(0, 1, 1, 3, 0x33);
  s.RoundEnd(2, {2, 1});
  auto applied = s.Recv();
  ASSERT_TRUE(applied.ok() && applied->has_round_applied()) << applied.status().ToString();
  auto running = s.PrepareAndCommit({{0, 0xBB}, {3, 0x33}}, {2, 1});
  ASSERT_TRUE(running.ok()) << running.status().ToString();
  EXPECT_TRUE(running->has_running()) << wire::EnvelopeKind(*running);
  EXPECT_EQ(s.device().memory(0)[0], std::byte{0xBB});
  EXPECT_EQ(s.device().memory(0)[3 * kPage], std::byte{0x33});
  EXPECT_EQ(s.Finish().outcome, Outcome::kCompleted);
}

TEST(DestinationProtocol, ReplayedFrameIsRejected) {
  ScriptedSource s(1);
  s.Handshake();
  s.ManifestAndReady();
  s.Frame(0, 0, 0, 1, 0x11);
  s.Frame(0, 0, 0, 1, 0x11);  // the same frame again
  auto abort = s.Recv();
  ASSERT_TRUE(abort.ok() && abort->has_abort()) << abort.status().ToString();
  EXPECT_NE(abort->abort().reason().find("data stream 0, frame 1: sequence 0 where 1 was expected"), std::string::npos)
      << abort->abort().reason();
  MigrationReport& r = s.Finish();
  EXPECT_EQ(r.outcome, Outcome::kAborted);
  EXPECT_EQ(s.device().State(), DeviceState::kError);
}

TEST(DestinationProtocol, FrameOfAnotherSessionIsRejected) {
  ScriptedSource s(1);
  s.Handshake();
  s.ManifestAndReady();
  s.Frame(0, 0, 0, 1, 0x11, /*key=*/kKey + 1);
  auto abort = s.Recv();
  ASSERT_TRUE(abort.ok() && abort->has_abort()) << abort.status().ToString();
  EXPECT_NE(abort->abort().reason().find("tag mismatch"), std::string::npos) << abort->abort().reason();
  EXPECT_EQ(s.Finish().outcome, Outcome::kAborted);
}

// A correctly tagged frame whose compressed payload is not what it claims: the
// decoder's checks, not the tag, must stop it.
TEST(DestinationProtocol, CompressedPayloadThatDoesNotDecodeIsRejected) {
  ScriptedSource s(1);
  s.Handshake();
  s.ManifestAndReady();
  s.RawFrame(0, 0, 2, /*zstd*/ 1, std::vector<std::byte>(100, std::byte{7}), kPage);
  auto abort = s.Recv();
  ASSERT_TRUE(abort.ok() && abort->has_abort()) << abort.status().ToString();
  EXPECT_NE(abort->abort().reason().find("data stream 0, frame 0: zstd payload is not a zstd frame"),
            std::string::npos)
      << abort->abort().reason();
  EXPECT_EQ(s.Finish().outcome, Outcome::kAborted);
}

TEST(DestinationProtocol, UnknownCodecIsRejected) {
  ScriptedSource s(1);
  s.Handshake();
  s.ManifestAndReady();
  s.RawFrame(0, 0, 2, /*codec*/ 9, std::vector<std::byte>(kPage, std::byte{7}), kPage);
  auto abort = s.Recv();
  ASSERT_TRUE(abort.ok() && abort->has_abort()) << abort.status().ToString();
  EXPECT_NE(abort->abort().reason().find("codec flags 0x9 are not a known codec"), std::string::npos)
      << abort->abort().reason();
}

TEST(DestinationProtocol, ForeignProtocolVersionIsRefusedNamingBoth) {
  ScriptedSource s(1);
  s.Handshake(/*version=*/7);
  auto abort = s.Recv();
  ASSERT_TRUE(abort.ok() && abort->has_abort()) << abort.status().ToString();
  const std::string& why = abort->abort().reason();
  EXPECT_NE(why.find("the peer speaks protocol version 7, this build"), std::string::npos) << why;
  EXPECT_NE(why.find("speaks version 1: no version in common; upgrade this build"), std::string::npos) << why;
  EXPECT_EQ(s.Finish().outcome, Outcome::kAborted);
  EXPECT_TRUE(s.device().transitions.empty()) << "nothing is touched before the handshake";
}

TEST(DestinationProtocol, OversizedLengthPrefixIsRejectedBeforeAllocating) {
  ScriptedSource s(1);
  const std::byte huge[4] = {std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0x7f}};
  ASSERT_TRUE(s.control().WriteAll(huge).ok());
  auto abort = s.Recv();
  ASSERT_TRUE(abort.ok() && abort->has_abort()) << abort.status().ToString();
  EXPECT_NE(abort->abort().reason().find("length prefix 2147483647 exceeds"), std::string::npos)
      << abort->abort().reason();
}

TEST(DestinationProtocol, TruncatedMessageEndsTheSessionCleanly) {
  ScriptedSource s(1);
  const std::byte partial[6] = {std::byte{100}, std::byte{0}, std::byte{0}, std::byte{0}, std::byte{1}, std::byte{2}};
  ASSERT_TRUE(s.control().WriteAll(partial).ok());
  s.control().Close();
  MigrationReport& r = s.Finish();
  EXPECT_EQ(r.outcome, Outcome::kAborted);
  EXPECT_NE(r.status.message().find("closed after 2 of 100 bytes"), std::string::npos) << r.status.message();
}

}  // namespace
}  // namespace gpumigrate
