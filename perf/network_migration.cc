// Benchmark: migration over loopback TCP beside raw loopback TCP moving the
// same number of bytes in the same run, for bf16 (realistic) and incompressible
// data, with and without TLS + AES-256-GCM and zstd. One JSON object per line.
//
//   network_migration [--size SIZE] [--streams N] [--floors-only 1]
//
// The floors: raw loopback TCP (one sending and one receiving thread per
// stream), and the encrypted floor: the same streams carrying the same bytes in
// 1 MiB frames sealed with AES-256-GCM by the sender and opened by the receiver
// (the engine's own frame protector), with no session around them. Each line
// says the CPU seconds it used, so a reader can tell the CPU's share from the
// wait. --floors-only prints only those two lines (perf/pipeline.py's floors).
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/units.h"
#include "transport/crypto/frame_protector.h"

using namespace gpumigrate;
using SteadyClock = std::chrono::steady_clock;

namespace {

// Random bytes that never change: what compression cannot help with.
class NoiseDevice final : public Device, public DirtyTracker {
 public:
  NoiseDevice(uint64_t size, bool source) : info_{{0, "noise", size, 65536, RegionHint::kStatic}}, mem_(size) {
    state_ = source ? DeviceState::kRunning : DeviceState::kStop;
    if (source) {
      std::mt19937_64 rng(7);
      for (size_t i = 0; i + 8 <= size; i += 8) {
        uint64_t v = rng();
        std::memcpy(mem_.data() + i, &v, 8);
      }
    }
  }
  std::string Describe() const override { return "noise"; }
  const std::vector<RegionInfo>& Regions() const override { return info_; }
  DeviceState State() const override { return state_; }
  Status SetState(DeviceState s) override { state_ = s; return Status::Ok(); }
  bool ConcurrentReads() const override { return true; }
  Status Read(uint32_t, uint64_t off, std::span<std::byte> out) override {
    std::memcpy(out.data(), mem_.data() + off, out.size());
    return Status::Ok();
  }
  Status Write(uint32_t, uint64_t off, std::span<const std::byte> in) override {
    std::memcpy(mem_.data() + off, in.data(), in.size());
    return Status::Ok();
  }
  Status WriteZeros(uint32_t, uint64_t off, uint64_t len) override {
    std::memset(mem_.data() + off, 0, len);
    return Status::Ok();
  }
  Result<std::vector<std::byte>> SaveState() override { return std::vector<std::byte>(16); }
  Status LoadState(std::span<const std::byte>) override { return Status::Ok(); }
  PendingBytes PendingEstimate() const override { return {16}; }
  DirtyTracker* Tracker() override { return this; }
  std::string Name() const override { return "none"; }
  Status Start() override { return Status::Ok(); }
  Status Sync(uint32_t, DirtyBitmap&) override { return Status::Ok(); }
  Status Stop() override { return Status::Ok(); }

 private:
  std::vector<RegionInfo> info_;
  std::vector<std::byte> mem_;
  DeviceState state_;
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

bool SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = recv(fd, p, n, MSG_WAITALL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// A listening socket on 127.0.0.1 at a free port; `a` is its address.
int ListenLoopback(sockaddr_in& a) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  a = sockaddr_in{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  listen(lfd, 16);
  socklen_t len = sizeof a;
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  return lfd;
}

struct Floor {
  double bytes_per_s = 0;
  double cpu_s = 0;
};

// The encrypted floor: per stream, a sender that seals 1 MiB frames of noise
// (header, payload, tag) and a receiver that opens each, over plain loopback TCP.
Floor EncryptedTcp(uint64_t bytes, uint32_t streams) {
  sockaddr_in a{};
  const int lfd = ListenLoopback(a);
  FrameKeys keys;
  keys.aes_gcm = true;
  for (size_t i = 0; i < keys.aes_key.size(); ++i) keys.aes_key[i] = static_cast<std::byte>(i * 7 + 1);
  constexpr size_t kFrame = 1 << 20;
  constexpr size_t kHeader = 32;
  const uint64_t frames = std::max<uint64_t>(1, bytes / streams / kFrame);
  std::atomic<bool> failed{false};
  std::vector<std::thread> threads;
  const double cpu0 = CpuSeconds();
  auto t0 = SteadyClock::now();
  for (uint32_t s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      auto protector = MakeFrameProtector(keys);
      std::vector<std::byte> payload(kFrame), scratch, header(kHeader);
      std::mt19937_64 rng(s);
      for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
        uint64_t v = rng();
        std::memcpy(payload.data() + i, &v, 8);
      }
      for (uint64_t seq = 0; seq < frames && !failed; ++seq) {
        std::memcpy(header.data(), &seq, 8);
        std::memcpy(header.data() + 8, &s, 4);
        wire::Tag tag{};
        auto sealed = protector->Seal(header, s, seq, payload, scratch, tag);
        if (!sealed.ok() || !SendAll(fd, header.data(), header.size()) ||
            !SendAll(fd, sealed->data(), sealed->size()) || !SendAll(fd, tag.data(), tag.size())) {
          failed = true;
        }
      }
      close(fd);
    });
    threads.emplace_back([&] {
      int fd = accept(lfd, nullptr, nullptr);
      auto protector = MakeFrameProtector(keys);
      std::vector<std::byte> payload(kFrame), header(kHeader);
      wire::Tag tag{};
      for (uint64_t seq = 0; seq < frames && !failed; ++seq) {
        if (!RecvAll(fd, header.data(), header.size()) || !RecvAll(fd, payload.data(), payload.size()) ||
            !RecvAll(fd, tag.data(), tag.size())) {
          failed = true;
          break;
        }
        uint64_t got = 0;
        uint32_t stream = 0;  // connections are accepted in any order: the header says whose frame it is
        std::memcpy(&got, header.data(), 8);
        std::memcpy(&stream, header.data() + 8, 4);
        if (got != seq || !protector->Open(header, stream, seq, payload, tag).ok()) {
          failed = true;
          break;
        }
      }
      close(fd);
    });
  }
  for (auto& t : threads) t.join();
  Floor f;
  f.bytes_per_s = failed ? 0 : static_cast<double>(frames * kFrame * streams) /
                                  std::chrono::duration<double>(SteadyClock::now() - t0).count();
  f.cpu_s = CpuSeconds() - cpu0;
  close(lfd);
  return f;
}

// One core reading the sim's weights (it generates them on read): the device-read
// stage of every sim line, per data kind. Bytes/s.
double SimReadRate(bool noise) {
  SimSpec spec = *ParseSimSpec(fmt::format("sim:size=256MiB,static=1,kv=0,hot=0,kv_rate=0{}", noise ? ",data=noise" : ""));
  auto dev = *SimDevice::Create(spec, SimRole::kSource);
  std::vector<std::byte> buf(1 << 20);
  const RegionInfo& w = dev->Regions()[0];
  const auto t0 = SteadyClock::now();
  uint64_t done = 0;
  while (SteadyClock::now() - t0 < std::chrono::milliseconds(500)) {
    (void)dev->Read(w.id, done % (w.size_bytes - buf.size() + 1) / buf.size() * buf.size(), buf);
    done += buf.size();
  }
  return static_cast<double>(done) / std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Plain blocking sockets, one thread per side per stream: the floor.
double RawTcp(uint64_t bytes, uint32_t streams) {
  sockaddr_in a{};
  const int lfd = ListenLoopback(a);
  std::vector<std::thread> threads;
  auto t0 = SteadyClock::now();
  for (uint32_t s = 0; s < streams; ++s) {
    threads.emplace_back([&, s] {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
      std::vector<char> buf(1 << 20, static_cast<char>(s));
      for (uint64_t sent = 0; sent < bytes / streams;) sent += static_cast<uint64_t>(send(fd, buf.data(), buf.size(), 0));
      close(fd);
    });
    threads.emplace_back([&] {
      int fd = accept(lfd, nullptr, nullptr);
      std::vector<char> buf(1 << 20);
      while (recv(fd, buf.data(), buf.size(), 0) > 0) {
      }
      close(fd);
    });
  }
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  close(lfd);
  return static_cast<double>(bytes) / secs;
}

Floor RawTcpFloor(uint64_t bytes, uint32_t streams) {
  const double cpu0 = CpuSeconds();
  Floor f;
  f.bytes_per_s = RawTcp(bytes, streams);
  f.cpu_s = CpuSeconds() - cpu0;
  return f;
}

// The sim's bf16 weights as a file, e.g. to back a QEMU guest's RAM with the same bytes.
int WriteBf16(const std::string& path, uint64_t size) {
  SimSpec spec = *ParseSimSpec(fmt::format("sim:size={},static=1,kv=0,hot=0,kv_rate=0", size));
  auto dev = *SimDevice::Create(spec, SimRole::kSource);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 1;
  std::vector<std::byte> buf(1 << 20);
  const RegionInfo& w = dev->Regions()[0];
  for (uint64_t off = 0; off < w.size_bytes; off += buf.size()) {
    uint64_t n = std::min<uint64_t>(buf.size(), w.size_bytes - off);
    (void)dev->Read(w.id, off, std::span(buf).first(n));
    std::fwrite(buf.data(), 1, n, f);
  }
  std::fclose(f);
  return 0;
}

// --floors-only: the raw and encrypted floors and the sim's read rate, a line
// each; 1 when a floor moved nothing.
int PrintFloors(uint64_t size, uint32_t streams) {
  const Floor raw = RawTcpFloor(size, streams);
  const Floor enc = EncryptedTcp(size, streams);
  for (const auto& [name, f] : {std::pair{"raw_loopback_tcp", raw}, std::pair{"encrypted_loopback_tcp", enc}}) {
    fmt::print("{}\n", nlohmann::ordered_json{{"benchmark", name}, {"bytes", size}, {"streams", streams},
                                              {"bytes_per_s", f.bytes_per_s}, {"cpu_s", f.cpu_s},
                                              {"cpu_s_per_gb", f.cpu_s * 1e9 / static_cast<double>(size)}}
                             .dump());
  }
  for (bool noise : {false, true}) {
    fmt::print("{}\n", nlohmann::ordered_json{{"benchmark", "sim_read"}, {"data", noise ? "noise" : "bf16"},
                                              {"per_core_bytes_per_s", SimReadRate(noise)}}
                             .dump());
  }
  return raw.bytes_per_s > 0 && enc.bytes_per_s > 0 ? 0 : 1;
}

// Warm-up: the first migration in a process pays one-time costs (generator
// tables, allocator growth) that are not part of any configuration.
void WarmUp() {
  SimSpec spec = *ParseSimSpec("sim:size=64MiB,kv_rate=0,hot=64KiB");
  auto src = *SimDevice::Create(spec, SimRole::kSource);
  auto dst = *SimDevice::Create(spec, SimRole::kDestination);
  LocalMigrationOptions opt;
  (void)MigrateOverLoopback(*src, *dst, opt, false, nullptr);
}

// One configuration of the loopback migration.
struct Case {
  const char* data;
  const char* security;
  const char* codec;
};

// Migrates one configuration over loopback and prints its line beside the raw
// TCP floor (`raw`, bytes/s). False after printing the migration's error.
bool RunCase(const Case& c, uint64_t size, uint32_t streams, double raw) {
  LocalMigrationOptions opt;
  opt.data_streams = streams;
  opt.source.codec = *ParseCodecChoice(c.codec);
  opt.source.downtime_target = std::chrono::seconds(10);
  std::string security;
  LocalMigrationResult res;
  if (std::string(c.data) == "bf16") {
    SimSpec spec = *ParseSimSpec(fmt::format("sim:size={},static=0.9,kv=0.05,kv_rate=0,hot=64KiB", size));
    auto src = *SimDevice::Create(spec, SimRole::kSource);
    auto dst = *SimDevice::Create(spec, SimRole::kDestination);
    res = MigrateOverLoopback(*src, *dst, opt, std::string(c.security) == "tls", &security);
  } else {
    NoiseDevice src(size, true), dst(size, false);
    res = MigrateOverLoopback(src, dst, opt, std::string(c.security) == "tls", &security);
  }
  const MigrationReport& r = res.source;
  if (r.outcome != Outcome::kCompleted) {
    fmt::print("{}\n", nlohmann::ordered_json{{"benchmark", "migration"}, {"error", r.status.message()}}.dump());
    return false;
  }
  const RoundReport& r0 = r.rounds.front();
  double secs = r0.ms / 1e3;
  fmt::print("{}\n", nlohmann::ordered_json{{"benchmark", "loopback_migration"},
                                            {"data", c.data},
                                            {"security", c.security},
                                            {"codec", c.codec},
                                            {"streams", streams},
                                            {"raw_bytes", r0.raw_bytes},
                                            {"wire_bytes", r0.bytes},
                                            {"raw_bytes_per_s", static_cast<double>(r0.raw_bytes) / secs},
                                            {"wire_bytes_per_s", static_cast<double>(r0.bytes) / secs},
                                            {"floor_raw_tcp_bytes_per_s", raw},
                                            {"peer_qemu", "perf/run qemu moves the same bytes with QEMU"},
                                            {"compression_ratio", r.compression_ratio}}
                         .dump());
  std::fflush(stdout);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = uint64_t{1} << 30;
  uint32_t streams = 2;
  bool floors_only = false;
  std::string write_bf16;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--size") size = *ParseSize(argv[i + 1]);
    else if (k == "--streams") streams = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    else if (k == "--write-bf16") write_bf16 = argv[i + 1];
    else if (k == "--floors-only") floors_only = std::string(argv[i + 1]) != "0";
    else {
      fmt::print(stderr, "usage: network_migration [--size SIZE] [--streams N] [--floors-only 1] [--write-bf16 FILE]\n");
      return 2;
    }
  }
  if (!write_bf16.empty()) return WriteBf16(write_bf16, size);
  if (floors_only) return PrintFloors(size, streams);
  WarmUp();
  double raw = RawTcp(size, streams);
  fmt::print("{}\n", nlohmann::ordered_json{{"benchmark", "raw_loopback_tcp"}, {"bytes", size}, {"streams", streams},
                                            {"bytes_per_s", raw}}
                         .dump());
  const Case cases[] = {{"bf16", "tcp", "none"},  {"bf16", "tls", "none"},  {"bf16", "tcp", "zstd"},
                        {"bf16", "tls", "zstd"},  {"noise", "tcp", "none"}, {"noise", "tls", "none"},
                        {"noise", "tls", "zstd"}};
  for (const Case& c : cases) {
    if (!RunCase(c, size, streams, raw)) return 1;
  }
  return 0;
}
