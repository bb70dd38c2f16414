// StreamReader (engine/session/stream_reader.h): exact reads through a buffer
// filled by ReadSome, over a scripted stream and over real loopback TCP.
#include "engine/session/stream_reader.h"

#include <deque>
#include <thread>

#include <gtest/gtest.h>

#include "transport/net/tcp.h"

namespace gpumigrate {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 13 + seed) % 251);
  return v;
}

// Hands out `data` in the sizes scripted for ReadSome (then whatever is left),
// counting the calls of each kind; ReadSome unsupported when `some` is false.
class ScriptedStream final : public Stream {
 public:
  ScriptedStream(std::vector<std::byte> data, std::deque<size_t> sizes, bool some = true)
      : data_(std::move(data)), sizes_(std::move(sizes)), some_(some) {}
  std::string Name() const override { return "scripted"; }
  Status WriteAll(std::span<const std::byte>) override { return Status::Ok(); }
  Status ReadExact(std::span<std::byte> out) override {
    ++exact_calls;
    if (at_ + out.size() > data_.size()) {
      return Unavailable(fmt::format("scripted: closed after {} of {} bytes", data_.size() - at_, out.size()));
    }
    std::memcpy(out.data(), data_.data() + at_, out.size());
    at_ += out.size();
    return Status::Ok();
  }
  Result<size_t> ReadSome(std::span<std::byte> out) override {
    if (!some_) return Stream::ReadSome(out);
    ++some_calls;
    size_t n = std::min(out.size(), data_.size() - at_);
    if (!sizes_.empty()) {
      n = std::min(n, sizes_.front());
      sizes_.pop_front();
    }
    std::memcpy(out.data(), data_.data() + at_, n);
    at_ += n;
    return n;
  }
  void Close() override {}
  int exact_calls = 0, some_calls = 0;

 private:
  std::vector<std::byte> data_;
  size_t at_ = 0;
  std::deque<size_t> sizes_;
  bool some_;
};

// Reads `parts` in order through a reader over `s` and checks them against `data`.
void ReadParts(StreamReader& r, const std::vector<std::byte>& data, const std::vector<size_t>& parts) {
  size_t at = 0;
  for (size_t n : parts) {
    std::vector<std::byte> got(n);
    ASSERT_TRUE(r.ReadExact(got).ok()) << "part at " << at;
    ASSERT_TRUE(std::equal(got.begin(), got.end(), data.begin() + static_cast<ptrdiff_t>(at))) << "part at " << at;
    at += n;
  }
}

TEST(StreamReader, SmallFramesCostOneReadPerBufferAcrossEveryBoundary) {
  // 40 frames of header 64 + payload 4096 + tag 16, arriving in odd pieces.
  std::vector<size_t> parts;
  for (int i = 0; i < 40; ++i) parts.insert(parts.end(), {64, 4096, 16});
  size_t total = 0;
  for (size_t n : parts) total += n;
  const auto data = Bytes(total, 5);
  ScriptedStream s(data, {1, 63, 7000, 3, 100000});
  StreamReader r(s, 16 << 10);
  ReadParts(r, data, parts);
  EXPECT_EQ(s.exact_calls, 0);
  EXPECT_LT(s.some_calls, 30) << "120 small reads should take far fewer calls";
  EXPECT_EQ(r.buffered(), 0u);
}

TEST(StreamReader, LargeReadsGoStraightToTheStreamOnceTheBufferIsDrained) {
  const auto data = Bytes(64 + (1 << 20) + 16, 9);
  ScriptedStream s(data, {});
  StreamReader r(s, 64 << 10);
  ReadParts(r, data, {64, 1 << 20, 16});
  EXPECT_EQ(s.exact_calls, 1) << "the megabyte after the first buffer is read directly";
}

TEST(StreamReader, AStreamWithoutReadSomeIsReadDirectly) {
  const auto data = Bytes(5000, 1);
  ScriptedStream s(data, {}, /*some=*/false);
  StreamReader r(s);
  ReadParts(r, data, {64, 4096, 16, 824});
  EXPECT_EQ(s.exact_calls, 4);
}

TEST(StreamReader, TheEndOfTheStreamMidReadSaysHowFarItGot) {
  const auto data = Bytes(100, 2);
  ScriptedStream s(data, {60});
  StreamReader r(s);
  std::vector<std::byte> got(150);
  Status st = r.ReadExact(got);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("scripted: read failed: stream closed after 100 of 150 bytes"), std::string::npos)
      << st.message();
}

TEST(StreamReader, OverLoopbackTcp) {
  auto listener = TcpListener::Listen({"127.0.0.1", 0});
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  std::vector<size_t> parts;
  for (int i = 0; i < 300; ++i) parts.insert(parts.end(), {64, static_cast<size_t>(1 + (i * 977) % 9000), 16});
  parts.push_back(1 << 20);
  size_t total = 0;
  for (size_t n : parts) total += n;
  const auto data = Bytes(total, 3);
  std::thread writer([&] {
    auto c = ConnectTcp({"127.0.0.1", (*listener)->port()}, std::chrono::seconds(5));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    for (size_t at = 0; at < data.size(); at += 3000) {  // in pieces, so reads see partial frames
      const size_t n = std::min<size_t>(3000, data.size() - at);
      ASSERT_TRUE((*c)->WriteAll(std::span(data).subspan(at, n)).ok());
    }
    (*c)->Close();
  });
  auto server = (*listener)->Accept(std::chrono::seconds(5), "server");
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  StreamReader r(**server);
  ReadParts(r, data, parts);
  std::byte one[1];
  EXPECT_EQ(r.ReadExact(one).code(), StatusCode::kUnavailable) << "then the end of the stream";
  writer.join();
}

}  // namespace
}  // namespace gpumigrate
