// The record stream of several VFIO devices (state_mux.h): pieces of any size
// reach each member in order; damage is refused naming the byte.
#include "engine/devices/vfio/state_mux.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

namespace gpumigrate::vfio {
namespace {

std::vector<std::byte> Record(uint32_t member, std::string_view bytes) {
  std::vector<std::byte> r(kMuxHeaderBytes + bytes.size());
  PutMuxHeader(r, member, bytes.size());
  std::memcpy(r.data() + kMuxHeaderBytes, bytes.data(), bytes.size());
  return r;
}

struct Sink {
  std::map<size_t, std::string> got;
  MuxReader reader{3,
                   [this](size_t m, std::span<const std::byte> b) {
                     got[m].append(reinterpret_cast<const char*>(b.data()), b.size());
                     return Status::Ok();
                   },
                   [](size_t m) { return "device " + std::to_string(m); }};
};

std::vector<std::byte> Stream() {
  std::vector<std::byte> s;
  for (auto [m, text] : std::vector<std::pair<uint32_t, std::string>>{
           {0, "alpha"}, {2, "gamma-one"}, {0, "-more"}, {1, std::string(5000, 'b')}, {2, "-two"}}) {
    auto r = Record(m, text);
    s.insert(s.end(), r.begin(), r.end());
  }
  return s;
}

TEST(StateMux, PiecesOfAnySizeReachEachMemberInOrder) {
  const auto s = Stream();
  std::mt19937 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    Sink k;
    for (size_t pos = 0; pos < s.size();) {
      size_t n = std::min<size_t>(s.size() - pos, trial == 0 ? 1 : 1 + rng() % 40);
      ASSERT_TRUE(k.reader.Feed(std::span(s).subspan(pos, n)).ok());
      pos += n;
    }
    ASSERT_TRUE(k.reader.Finish().ok());
    EXPECT_EQ(k.got[0], "alpha-more");
    EXPECT_EQ(k.got[1], std::string(5000, 'b'));
    EXPECT_EQ(k.got[2], "gamma-one-two");
    EXPECT_EQ(k.reader.position(), s.size());
  }
}

TEST(StateMux, DamageIsRefusedNamingTheByte) {
  auto s = Stream();
  {
    Sink k;
    auto bad = s;
    bad[kMuxHeaderBytes + 5] ^= std::byte{1};  // the second record's magic
    Status st = k.reader.Feed(bad);
    EXPECT_EQ(st.code(), StatusCode::kCorrupt);
    EXPECT_NE(st.message().find("byte 21: not a device record"), std::string::npos) << st.message();
  }
  {
    Sink k;
    Status st = k.reader.Feed(Record(3, "x"));
    EXPECT_NE(st.message().find("a record for device 3 of the source, but this destination has 3 device(s)"),
              std::string::npos)
        << st.message();
  }
  {
    Sink k;
    std::vector<std::byte> h(kMuxHeaderBytes);
    PutMuxHeader(h, 1, 0);
    EXPECT_NE(k.reader.Feed(h).message().find("a record of 0 bytes for device 1"), std::string::npos);
    Sink k2;
    PutMuxHeader(h, 1, kMaxMuxRecordBytes + 1);
    EXPECT_EQ(k2.reader.Feed(h).code(), StatusCode::kCorrupt);
  }
  {
    Sink k;
    ASSERT_TRUE(k.reader.Feed(std::span(s).first(kMuxHeaderBytes + 3)).ok());
    Status st = k.reader.Finish();
    EXPECT_NE(st.message().find("ended at byte 19, inside a record of device 0: 2 bytes missing"), std::string::npos)
        << st.message();
    Sink k2;
    ASSERT_TRUE(k2.reader.Feed(std::span(s).first(7)).ok());
    EXPECT_NE(k2.reader.Finish().message().find("inside a record header (7 of 16 bytes)"), std::string::npos);
  }
}

TEST(StateMux, AMemberWriteErrorStopsTheStream) {
  int calls = 0;
  MuxReader r(
      2, [&](size_t, std::span<const std::byte>) { return ++calls == 1 ? Internal("disk on fire") : Status::Ok(); },
      [](size_t m) { return std::to_string(m); });
  auto s = Stream();
  Status st = r.Feed(s);
  EXPECT_EQ(st.message(), "disk on fire");
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace gpumigrate::vfio
