// Cost of one read-and-clear (DirtyTracker::Sync) over a region of a live process
// at 0.1 %, 1 % and 10 % dirty pages, for each proc tracker, beside the cost of
// hashing the same memory (XXH3-64, the hash tracker's floor) and of copying it
// (memcpy), all measured in this run. Also the writer's cost per first write to a
// page (the write-protect fault) for each tracker.
//
// The process is its own workload: the region is exposed through the real shim and
// the proc device connects to our own pid, as `migrate --device proc:PID` would.
//   tracker_cost [SIZE=1GiB] [REPS=5]
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/shim.h"
#include "gpumigrate/common/stats.h"
#include "gpumigrate/common/units.h"

using namespace gpumigrate;
using SteadyClock = std::chrono::steady_clock;

namespace {

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Region {
  std::byte* mem = nullptr;
  size_t size = 0;
  void* map = nullptr;
};

// Exposes `size` bytes of `kind` memory through the shim, every page written once.
Region Expose(const std::string& kind, size_t size) {
  Region r;
  r.size = size;
  if (kind == "memfd") {
    r.mem = static_cast<std::byte*>(gm_shim_alloc("bench", size, GM_SHIM_HINT_DYNAMIC, 0));
  } else {
    r.map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r.mem = static_cast<std::byte*>(r.map);
    if (gm_shim_register("bench", r.mem, size, GM_SHIM_HINT_DYNAMIC, 0) != 0) r.mem = nullptr;
  }
  if (r.mem == nullptr) {
    fmt::print(stderr, "tracker_cost: {}\n", gm_shim_last_error());
    std::exit(1);
  }
  for (size_t off = 0; off < size; off += 4096) r.mem[off] = std::byte{1};
  if (gm_shim_start() != 0) {
    fmt::print(stderr, "tracker_cost: {}\n", gm_shim_last_error());
    std::exit(1);
  }
  return r;
}

// What every measurement of one kind of memory shares.
struct Bench {
  std::string kind;  // anon | memfd
  uint64_t size = 0, page = 0, pages = 0;
  double gib = 0;
  int reps = 0;
};

// The peers and the floor over the same memory, in this run.
struct Peers {
  std::vector<double> hash_ms, copy_ms;
};

// Hashes (XXH3-64, page by page) and copies the region `reps` times, then prints
// the peers' line.
Peers MeasurePeers(const Bench& b, const Region& reg) {
  Peers peers;
  std::vector<std::byte> dst(b.size);
  std::memset(dst.data(), 0, b.size);  // touch it: fresh memory costs far more than the copy
  uint64_t sink = 0;
  for (int i = 0; i < b.reps; ++i) {
    auto t0 = SteadyClock::now();
    for (uint64_t p = 0; p < b.pages; ++p) sink ^= XXH3_64bits(reg.mem + p * b.page, b.page);
    auto t1 = SteadyClock::now();
    std::memcpy(dst.data(), reg.mem, b.size);
    auto t2 = SteadyClock::now();
    peers.hash_ms.push_back(Ms(t1 - t0));
    peers.copy_ms.push_back(Ms(t2 - t1));
  }
  dst = {};
  nlohmann::ordered_json j;
  j["bench"] = "tracker_cost";
  j["memory"] = b.kind;
  j["region_bytes"] = b.size;
  j["xxh3_pages_ms"] = UpperMedian(peers.hash_ms);
  j["xxh3_gb_per_s"] = static_cast<double>(b.size) / UpperMedian(peers.hash_ms) / 1e6;
  j["memcpy_ms"] = UpperMedian(peers.copy_ms);
  j["memcpy_gb_per_s"] = static_cast<double>(b.size) / UpperMedian(peers.copy_ms) / 1e6;
  j["sink"] = sink & 1;
  fmt::print("{}\n", j.dump());
  return peers;
}

// One dirty fraction's reps: the writer's cost, the read-and-clear's and how
// many reports were exact.
struct FractionRuns {
  std::vector<double> sync_ms, write_us;
  uint64_t reported_ok = 0;
};

// `reps` times: writes n distinct pages (a random stride walk, a new `stamp`
// each), then reads and clears the tracker. False after printing why a sync failed.
bool RunFraction(const Bench& b, Region& reg, DirtyTracker* tr, uint64_t n, std::mt19937_64& rng, uint8_t& stamp,
                 FractionRuns& out) {
  for (int i = 0; i < b.reps; ++i) {
    // n distinct pages: a random stride walk.
    std::vector<uint64_t> which(n);
    uint64_t start = rng() % b.pages, stride = (b.pages / std::max<uint64_t>(n, 1)) | 1;
    for (uint64_t k = 0; k < n; ++k) which[k] = (start + k * stride) % b.pages;
    auto w0 = SteadyClock::now();
    stamp = static_cast<uint8_t>(stamp % 250 + 1);
    (void)gm_shim_enter();
    for (uint64_t p : which) reg.mem[p * b.page + 8] = static_cast<std::byte>(stamp);
    gm_shim_leave();
    auto w1 = SteadyClock::now();
    DirtyBitmap bm(b.pages);
    auto s0 = SteadyClock::now();
    if (Status st = tr->Sync(0, bm); !st.ok()) {
      fmt::print(stderr, "tracker_cost: sync: {}\n", st.message());
      return false;
    }
    out.sync_ms.push_back(Ms(SteadyClock::now() - s0));
    if (n > 0) out.write_us.push_back(Ms(w1 - w0) * 1e3 / static_cast<double>(n));
    std::sort(which.begin(), which.end());
    which.erase(std::unique(which.begin(), which.end()), which.end());
    bool exact = bm.Count() == which.size();
    for (uint64_t p : which) exact = exact && bm.Test(p);
    out.reported_ok += exact ? 1 : 0;
  }
  return true;
}

// One tracker's start, then its read-and-clear at each dirty fraction, a line
// each. 1 after printing why it failed, else 0.
int MeasureTracker(const Bench& b, Region& reg, ProcTracking t, const Peers& peers, uint8_t& stamp) {
  auto dev = ProcDevice::Connect(ProcSpec{getpid(), t, 0}, ProcRole::kSource);
  if (!dev.ok()) {
    fmt::print(stderr, "tracker_cost: {}\n", dev.status().message());
    return 1;
  }
  DirtyTracker* tr = (*dev)->Tracker();
  auto t0 = SteadyClock::now();
  if (Status st = tr->Start(); !st.ok()) {
    fmt::print(stderr, "tracker_cost: start: {}\n", st.message());
    return 1;
  }
  double start_ms = Ms(SteadyClock::now() - t0);
  std::mt19937_64 rng(42);
  for (double frac : {0.0, 0.001, 0.01, 0.1}) {
    const uint64_t n = static_cast<uint64_t>(static_cast<double>(b.pages) * frac);
    FractionRuns runs;
    if (!RunFraction(b, reg, tr, n, rng, stamp, runs)) return 1;
    nlohmann::ordered_json j;
    j["bench"] = "tracker_cost";
    j["memory"] = b.kind;
    j["tracker"] = (*dev)->TrackerName();
    j["region_bytes"] = b.size;
    j["dirty_fraction"] = frac;
    j["dirty_pages"] = n;
    j["read_and_clear_ms"] = UpperMedian(runs.sync_ms);
    j["read_and_clear_ms_per_gib"] = UpperMedian(runs.sync_ms) / b.gib;
    j["peer_xxh3_same_memory_ms"] = UpperMedian(peers.hash_ms);
    j["floor_memcpy_same_memory_ms"] = UpperMedian(peers.copy_ms);
    j["vs_hashing"] = UpperMedian(runs.sync_ms) / UpperMedian(peers.hash_ms);
    if (!runs.write_us.empty()) j["writer_us_per_first_write"] = UpperMedian(runs.write_us);
    j["start_ms"] = start_ms;
    j["exact_reports"] = fmt::format("{}/{}", runs.reported_ok, b.reps);
    fmt::print("{}\n", j.dump());
  }
  (void)tr->Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = uint64_t{1} << 30;
  int reps = 5;
  if (argc > 1) {
    auto s = ParseSize(argv[1]);
    if (!s.ok()) {
      fmt::print(stderr, "tracker_cost: {}\n", s.status().message());
      return 2;
    }
    size = *s;
  }
  if (argc > 2) reps = std::max(1, std::atoi(argv[2]));
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  size = size / page * page;
  const uint64_t pages = size / page;
  const double gib = static_cast<double>(size) / (1 << 30);

  // A new value at each rep of every tracker (the same pages come round again), so
  // every write changes the page and hashing must see it.
  uint8_t stamp = 1;
  for (const std::string kind : {"anon", "memfd"}) {
    const Bench b{kind, size, page, pages, gib, reps};
    Region reg = Expose(kind, size);
    // Peers and floor over the same memory, in this run.
    const Peers peers = MeasurePeers(b, reg);
    for (ProcTracking t : {ProcTracking::kPagemapScan, ProcTracking::kSyncWp, ProcTracking::kHash}) {
      if (int rc = MeasureTracker(b, reg, t, peers, stamp); rc != 0) return rc;
    }
    gm_shim_shutdown();
    if (reg.map != nullptr) munmap(reg.map, size);
  }
  return 0;
}
