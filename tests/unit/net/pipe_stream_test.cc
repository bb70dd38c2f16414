#include "gpumigrate/common/stream.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/net/fault_stream.h"

namespace gpumigrate {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  return v;
}

TEST(Pipe, CarriesBytesInOrderThroughASmallBuffer) {
  auto pipe = MakePipe("t", 1000);  // no structured binding: lambdas capture these (clang 14)
  auto& a = pipe.first;
  auto& b = pipe.second;
  auto data = Bytes(100000, 3);
  std::thread writer([&] { ASSERT_TRUE(a->WriteAll(data).ok()); });
  std::vector<std::byte> got(data.size());
  ASSERT_TRUE(b->ReadExact(got).ok());
  writer.join();
  EXPECT_EQ(got, data);
}

TEST(Pipe, WriterBlocksWhenTheReaderIsSlow) {
  auto pipe = MakePipe("t", 4096);  // no structured binding: lambdas capture these (clang 14)
  auto& a = pipe.first;
  auto& b = pipe.second;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto data = Bytes(10000, 1);
    EXPECT_TRUE(a->WriteAll(data).ok());
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(done.load()) << "10000 bytes cannot fit in a 4096-byte pipe";
  std::vector<std::byte> got(10000);
  ASSERT_TRUE(b->ReadExact(got).ok());
  writer.join();
  EXPECT_TRUE(done.load());
}

TEST(Pipe, CloseDeliversWhatWasWrittenThenEndOfStream) {
  auto [a, b] = MakePipe("t", 4096);
  auto data = Bytes(100, 9);
  ASSERT_TRUE(a->WriteAll(data).ok());
  a->Close();
  std::vector<std::byte> got(100);
  ASSERT_TRUE(b->ReadExact(got).ok());
  EXPECT_EQ(got, data);
  std::vector<std::byte> more(1);
  Status s = b->ReadExact(more);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("closed after 0 of 1 bytes"), std::string::npos);
  EXPECT_FALSE(b->WriteAll(data).ok());
}

TEST(Pipe, CloseWakesABlockedReader) {
  auto pipe = MakePipe("t", 4096);  // no structured binding: lambdas capture these (clang 14)
  auto& b = pipe.second;
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    b->Close();
  });
  std::vector<std::byte> got(10);
  EXPECT_FALSE(b->ReadExact(got).ok());
  closer.join();
}

TEST(FaultStream, CutsAtTheExactByte) {
  auto [a, b] = MakePipe("t", 1 << 16);
  FaultStream f(std::move(a), FaultPlan{.cut_at_byte = 150});
  auto data = Bytes(100, 1);
  ASSERT_TRUE(f.WriteAll(data).ok());
  Status s = f.WriteAll(data);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("cut at byte 150"), std::string::npos);
  std::vector<std::byte> got(150);
  ASSERT_TRUE(b->ReadExact(got).ok());
  std::vector<std::byte> more(1);
  EXPECT_FALSE(b->ReadExact(more).ok());
}

TEST(FaultStream, FlipsOneBit) {
  auto [a, b] = MakePipe("t", 1 << 16);
  FaultStream f(std::move(a), FaultPlan{.flip_at_byte = 105});
  auto d1 = Bytes(100, 1), d2 = Bytes(100, 2);
  ASSERT_TRUE(f.WriteAll(d1).ok());
  ASSERT_TRUE(f.WriteAll(d2).ok());
  std::vector<std::byte> got(200);
  ASSERT_TRUE(b->ReadExact(got).ok());
  EXPECT_EQ(got[105], d2[5] ^ std::byte{1});
  EXPECT_EQ(got[104], d2[4]);
  EXPECT_EQ(got[5], d1[5]);
}

}  // namespace
}  // namespace gpumigrate
