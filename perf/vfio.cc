// The engine's cost of moving a VFIO device's migration stream, per GiB, over
// the fake kernel (no VFIO hardware here): a stop-and-copy migration of a fake
// device whose state is SIZE bytes, beside the floors measured in the same run:
// memcpy of SIZE bytes, and the fake alone (its data fd read to the end and
// written to a resuming fake, no engine). The engine's overhead is what the
// migration costs beyond the fake alone: framing, integrity tags, the in-memory
// streams, the destination's ordered writes.
//   vfio [SIZE=256MiB] [FRAME=1MiB] [REPS=3]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <fcntl.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/devices/vfio/vfio_device.h"
#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/common/units.h"
#include "tests/support/vfio/fake_vfio_device.h"
#include "tests/support/vfio/vfio_test_util.h"

using namespace gpumigrate;
using namespace gpumigrate::vfio;
using SteadyClock = std::chrono::steady_clock;

namespace {

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

fake::FakeVfioConfig Config(uint64_t size, uint32_t initial) {
  fake::FakeVfioConfig c;
  c.migration_flags = VFIO_MIGRATION_STOP_COPY;
  c.memory_bytes = size;
  c.chunk_bytes = 64 << 10;
  c.max_read_bytes = 1 << 20;
  c.initial_state = initial;
  return c;
}

// The fake alone: STOP_COPY read to the end into a resuming fake, frame-sized
// reads and writes, no engine.
double FakeAlone(uint64_t size, size_t frame) {
  fake::FakeHost src(Config(size, kStateRunning)), dst(Config(size, kStateStop));
  int s = src.kernel.Open(src.path.c_str(), O_RDWR), d = dst.kernel.Open(dst.path.c_str(), O_RDWR);
  fake::Bind(src.kernel, s);
  fake::Bind(dst.kernel, d);
  int sfd = -1, dfd = -1;
  std::vector<std::byte> buf(frame);
  auto t0 = SteadyClock::now();
  fake::SetMig(src.kernel, s, kStateStopCopy, &sfd);
  fake::SetMig(dst.kernel, d, kStateResuming, &dfd);
  for (;;) {
    size_t got = 0;
    ssize_t r;
    while (got < frame && (r = src.kernel.Read(sfd, buf.data() + got, frame - got)) > 0) got += r;
    if (got == 0) break;
    for (size_t off = 0; off < got;) off += dst.kernel.Write(dfd, buf.data() + off, got - off);
  }
  fake::SetMig(dst.kernel, d, kStateStop);
  return Ms(SteadyClock::now() - t0);
}

double Memcpy(uint64_t size) {
  std::vector<std::byte> a(size, std::byte{1}), b(size);
  auto t0 = SteadyClock::now();
  std::memcpy(b.data(), a.data(), size);
  double ms = Ms(SteadyClock::now() - t0);
  return b[size / 2] == std::byte{1} ? ms : -1;
}

// A whole stop-and-copy migration through the engine: its total time.
double Engine(uint64_t size, size_t frame, bool* ok) {
  fake::FakeHost src(Config(size, kStateRunning)), dst(Config(size, kStateRunning));
  auto s = VfioDevice::Open({{src.path}}, DeviceRole::kSource, src.kernel);
  auto d = VfioDevice::Open({{dst.path}}, DeviceRole::kDestination, dst.kernel);
  if (!s.ok() || !d.ok()) return *ok = false, 0;
  LocalMigrationOptions opt;
  opt.source.stop_and_copy = true;
  opt.source.max_frame_payload_bytes = static_cast<uint32_t>(frame);
  auto t0 = SteadyClock::now();
  auto res = MigrateLocally(**s, **d, opt);
  double ms = Ms(SteadyClock::now() - t0);
  *ok = res.source.outcome == Outcome::kCompleted && dst.dev->Memory() == src.dev->Memory();
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = uint64_t{256} << 20, frame = 1 << 20;
  int reps = 3;
  if (argc > 1) {
    auto v = ParseSize(argv[1]);
    if (v.ok()) size = *v;
  }
  if (argc > 2) {
    auto v = ParseSize(argv[2]);
    if (v.ok()) frame = *v;
  }
  if (argc > 3) reps = std::max(1, std::atoi(argv[3]));
  double best_engine = 1e300, best_fake = 1e300, best_memcpy = 1e300;
  bool ok = true;
  for (int i = 0; i < reps; ++i) {
    bool run_ok = false;
    best_engine = std::min(best_engine, Engine(size, frame, &run_ok));
    ok = ok && run_ok;
    best_fake = std::min(best_fake, FakeAlone(size, frame));
    best_memcpy = std::min(best_memcpy, Memcpy(size));
  }
  const double gib = static_cast<double>(size) / (1u << 30);
  nlohmann::ordered_json j;
  j["bench"] = "vfio_stream";
  j["stream_bytes"] = size;
  j["frame_payload_bytes"] = frame;
  j["reps"] = reps;
  j["byte_identical"] = ok;
  j["memcpy_ms_per_gib"] = best_memcpy / gib;
  j["fake_alone_ms_per_gib"] = best_fake / gib;
  j["engine_ms_per_gib"] = best_engine / gib;
  j["engine_overhead_ms_per_gib"] = (best_engine - best_fake) / gib;
  fmt::print("{}\n", j.dump());
  return ok ? 0 : 1;
}
