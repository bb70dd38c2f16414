// Benchmark: migration over loopback TCP beside raw loopback TCP moving the
// same number of bytes in the same run, for bf16 (realistic) and incompressible
// data, with and without TLS + AES-256-GCM and zstd. One JSON object per line.
//
//   network_migration [--size SIZE] [--streams N]
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/dirty_tracker.h"
#include "gpumigrate/local_migration.h"
#include "gpumigrate/sim.h"
#include "gpumigrate/units.h"

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

// Plain blocking sockets, one thread per side per stream: the floor.
double RawTcp(uint64_t bytes, uint32_t streams) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  listen(lfd, 16);
  socklen_t len = sizeof a;
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
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

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = uint64_t{1} << 30;
  uint32_t streams = 2;
  std::string write_bf16;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--size") size = *ParseSize(argv[i + 1]);
    else if (k == "--streams") streams = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    else if (k == "--write-bf16") write_bf16 = argv[i + 1];
    else {
      fmt::print(stderr, "usage: network_migration [--size SIZE] [--streams N] [--write-bf16 FILE]\n");
      return 2;
    }
  }
  if (!write_bf16.empty()) {
    // The sim's bf16 weights as a file, e.g. to back a QEMU guest's RAM with the same bytes.
    SimSpec spec = *ParseSimSpec(fmt::format("sim:size={},static=1,kv=0,hot=0,kv_rate=0", size));
    auto dev = *SimDevice::Create(spec, SimRole::kSource);
    FILE* f = std::fopen(write_bf16.c_str(), "wb");
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
  // Warm-up: the first migration in a process pays one-time costs (generator
  // tables, allocator growth) that are not part of any configuration.
  {
    SimSpec spec = *ParseSimSpec("sim:size=64MiB,kv_rate=0,hot=64KiB");
    auto src = *SimDevice::Create(spec, SimRole::kSource);
    auto dst = *SimDevice::Create(spec, SimRole::kDestination);
    LocalMigrationOptions opt;
    (void)MigrateOverLoopback(*src, *dst, opt, false, nullptr);
  }
  double raw = RawTcp(size, streams);
  fmt::print("{}\n", nlohmann::ordered_json{{"benchmark", "raw_loopback_tcp"}, {"bytes", size}, {"streams", streams},
                                            {"bytes_per_s", raw}}
                         .dump());
  struct Case { const char* data; const char* security; const char* codec; };
  const Case cases[] = {{"bf16", "tcp", "none"},  {"bf16", "tls", "none"},  {"bf16", "tcp", "zstd"},
                        {"bf16", "tls", "zstd"},  {"noise", "tcp", "none"}, {"noise", "tls", "none"},
                        {"noise", "tls", "zstd"}};
  for (const Case& c : cases) {
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
      return 1;
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
  }
  return 0;
}
