// Benchmark: in-process migration throughput and stun, each beside its floor
// and a peer measured in the same run. Prints one JSON object per line.
//
//   inprocess_migration [--device SPEC] [--streams N] [--repeat N]
//
// Figures:
//   memcpy             bytes/s of memcpy between pre-touched buffers (the copy floor)
//   pipe               raw bytes through the in-memory stream pair, one thread each side
//   source_read        the sim source generating its pages (what reading the device costs)
//   migration          bytes sent / pre-copy time of round 0, beside the three above
//   stun               measured stun beside its floor (final bytes / measured bandwidth)
//                      and the switchover policy's prediction
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"

using namespace gpumigrate;
using SteadyClock = std::chrono::steady_clock;

namespace {

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void Emit(const nlohmann::ordered_json& j) { fmt::print("{}\n", j.dump()); }

double MeasureMemcpy(size_t bytes, int reps) {
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes, std::byte{2});
  std::memcpy(b.data(), a.data(), bytes);  // touch both
  auto t = SteadyClock::now();
  for (int i = 0; i < reps; ++i) {
    std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
  }
  return static_cast<double>(bytes) * reps / Seconds(t, SteadyClock::now());
}

double MeasurePipe(size_t total, size_t chunk) {
  auto pipe = MakePipe("bench", 8 << 20);  // no structured binding: the lambda captures it (clang 14)
  auto& a = pipe.first;
  auto& b = pipe.second;
  std::vector<std::byte> src(chunk, std::byte{3}), dst(chunk);
  auto t = SteadyClock::now();
  std::thread writer([&] {
    for (size_t done = 0; done < total; done += chunk) (void)a->WriteAll(src);
  });
  for (size_t done = 0; done < total; done += chunk) (void)b->ReadExact(dst);
  writer.join();
  return static_cast<double>(total) / Seconds(t, SteadyClock::now());
}

double MeasureSourceRead(SimDevice& dev) {
  std::vector<std::byte> buf(1 << 20);
  (void)dev.Read(0, 0, buf);  // builds the generator's tables outside the timing
  uint64_t bytes = 0;
  auto t = SteadyClock::now();
  for (const auto& r : dev.Regions()) {
    if (r.hint != RegionHint::kStatic) continue;
    for (uint64_t off = 0; off + buf.size() <= r.size_bytes && bytes < (uint64_t{512} << 20); off += buf.size()) {
      (void)dev.Read(r.id, off, buf);
      bytes += buf.size();
    }
  }
  return static_cast<double>(bytes) / Seconds(t, SteadyClock::now());
}

}  // namespace

int main(int argc, char** argv) {
  std::string spec_text = "sim:size=2GiB";
  uint32_t streams = 2;
  int repeat = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--device") spec_text = argv[i + 1];
    else if (k == "--streams") streams = static_cast<uint32_t>(std::stoul(argv[i + 1]));
    else if (k == "--repeat") repeat = std::stoi(argv[i + 1]);
    else {
      fmt::print(stderr, "usage: inprocess_migration [--device SPEC] [--streams N] [--repeat N]\n");
      return 2;
    }
  }
  auto spec = ParseSimSpec(spec_text);
  if (!spec.ok()) {
    fmt::print(stderr, "{}\n", spec.status().message());
    return 2;
  }

  double memcpy_bps = MeasureMemcpy(256 << 20, 8);
  Emit({{"benchmark", "memcpy"}, {"bytes_per_s", memcpy_bps}});
  double pipe_bps = MeasurePipe(size_t{2} << 30, 1 << 20);
  Emit({{"benchmark", "pipe"}, {"bytes_per_s", pipe_bps}, {"floor_memcpy_bytes_per_s", memcpy_bps}});

  for (int rep = 0; rep < repeat; ++rep) {
    auto src = *SimDevice::Create(*spec, SimRole::kSource);
    auto dst = *SimDevice::Create(*spec, SimRole::kDestination);
    double read_bps = MeasureSourceRead(*src);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // workload warm-up
    LocalMigrationOptions opt;
    opt.data_streams = streams;
    auto res = MigrateLocally(*src, *dst, opt);
    const MigrationReport& r = res.source;
    if (r.outcome != Outcome::kCompleted) {
      Emit({{"benchmark", "migration"}, {"error", r.status.message()}});
      return 1;
    }
    const RoundReport& r0 = r.rounds.front();
    double r0_bps = static_cast<double>(r0.bytes) / (r0.ms / 1e3);
    Emit({{"benchmark", "migration"},
          {"device", spec->ToString()},
          {"streams", streams},
          {"round0_bytes_per_s", r0_bps},
          {"floor_memcpy_bytes_per_s", memcpy_bps},
          {"peer_pipe_bytes_per_s", pipe_bps},
          {"peer_source_read_bytes_per_s", read_bps},
          {"bytes_sent", r.bytes_sent},
          {"total_ms", r.total_ms},
          {"rounds", r.rounds.size()}});
    const RoundReport& fin = r.rounds.back();
    // The stun can be no shorter than moving the final bytes at the bandwidth measured in pre-copy.
    double floor_ms = static_cast<double>(fin.bytes) / r.bandwidth_bytes_per_s * 1e3;
    nlohmann::ordered_json bd;
    for (const auto& [k, v] : r.stun_breakdown_ms.Phases()) bd[std::string(k)] = v;
    Emit({{"benchmark", "stun"},
          {"stun_ms", r.stun_ms},
          {"floor_ms", floor_ms},
          {"predicted_stun_ms", r.predicted_stun_ms},
          {"final_bytes", fin.bytes},
          {"bandwidth_bytes_per_s", r.bandwidth_bytes_per_s},
          {"stun_breakdown_ms", bd}});
  }
  return 0;
}
