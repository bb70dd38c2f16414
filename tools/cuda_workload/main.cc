// gpumigrate-cuda-workload: a CUDA process that keeps writing its device memory,
// for migrating a running CUDA workload (`gpumigrate migrate --device cuda:PID`)
// in tests, perf and on a real GPU. It uses only the driver API, loaded with
// dlopen (GPUMIGRATE_LIBCUDA selects the driver double).
//
// Source mode: fills its weights (static) and kv cache (dynamic), registers both
// with gm_shim_register_cuda, serves the shim, and rewrites kv pages at --rate
// (cuMemcpyHtoD and cuMemsetD32 between gm_shim_enter/leave) until it is
// migrated away (released: exits 0), --run-for passes (then checks its memory
// and exits 0 or 1) or SIGTERM. Adopt mode: allocates the same regions, waits
// for a migration, checks every byte of both against the source's version table
// at stop (the state blob), writes on for --run-after and checks again.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "gpumigrate/shim.h"
#include "gpumigrate/common/units.h"
#include "tools/cuda_workload/device_memory.h"
#include "tools/workload/pattern.h"

namespace gpumigrate::cudaworkload {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

struct Options {
  std::string weights = "32MiB";
  std::string kv = "32MiB";
  std::string kv_page = "64KiB";
  std::string rate = "50MB/s";
  uint64_t seed = 1;
  int device = 0;
  bool adopt = false;
  std::string run_for;
  std::string run_after = "0s";
  std::string adopt_timeout = "300s";
  std::string dump_hashes;
};

struct Workload {
  DeviceMemory mem;
  workload::State st;  // kv cache: seed, size, page size, step, version of every page
  std::atomic<uint64_t> step{0};
  std::string error;  // the first failed driver call of the writer
};

int Fail(const std::string& what) {
  fmt::print(stderr, "cuda-workload[{}]: {}\n", getpid(), what);
  return 2;
}

long SaveState(void* ctx, void** blob) {
  auto* w = static_cast<Workload*>(ctx);
  w->st.step = w->step.load();
  auto bytes = w->st.Serialize();
  *blob = std::malloc(bytes.size());
  if (*blob == nullptr) return -ENOMEM;
  std::memcpy(*blob, bytes.data(), bytes.size());
  return static_cast<long>(bytes.size());
}

// Rewrites kv pages at `bytes_per_s` (0: flat out) until `until`, a stop signal or
// release; returns true when released.
bool Writer(Workload& w, double bytes_per_s, std::chrono::steady_clock::time_point until) {
  if (std::string e = w.mem.Bind(); !e.empty()) {
    w.error = e;
    return false;
  }
  std::mt19937_64 rng(w.st.seed * 7919 + w.step.load());
  std::vector<std::byte> scratch;
  const uint32_t burst = 4;
  const double pages_per_s = bytes_per_s / w.st.page_size;
  const auto start = std::chrono::steady_clock::now();
  uint64_t written = 0;
  while (!g_stop.load() && std::chrono::steady_clock::now() < until) {
    if (gm_shim_enter() != 0) return true;
    for (uint32_t k = 0; k < burst && w.error.empty(); ++k) {
      const auto p = static_cast<uint32_t>(rng() % w.mem.kv_pages());
      const auto v = static_cast<uint32_t>(w.step.fetch_add(1) + 1);
      w.error = w.mem.WriteKv(w.st.seed, p, v, scratch);
      w.st.versions[p] = v;
    }
    gm_shim_leave();
    if (!w.error.empty()) return false;
    written += burst;
    if (pages_per_s > 0) {
      std::this_thread::sleep_until(start + std::chrono::duration<double>(static_cast<double>(written) / pages_per_s));
    }
  }
  return false;
}

bool DumpHashes(Workload& w, const std::string& path) {
  if (path.empty()) return true;
  std::vector<uint64_t> h;
  if (std::string e = w.mem.Digests(&h); !e.empty()) {
    Fail("digests for --dump-hashes: " + e);
    return false;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = std::fwrite(h.data(), 8, h.size(), f) == h.size();
  return std::fclose(f) == 0 && ok;
}

int RunSource(Workload& w, const Options& o, double rate) {
  if (std::string e = w.mem.FillWeights(o.seed); !e.empty()) return Fail(e);
  std::vector<std::byte> scratch;
  for (uint32_t p = 0; p < w.mem.kv_pages(); ++p) {
    if (std::string e = w.mem.WriteKv(o.seed, p, 1, scratch); !e.empty()) return Fail(e);
    w.st.versions[p] = 1;
  }
  w.step = 1;
  if (gm_shim_start() != 0) return Fail(std::string("gm_shim_start: ") + gm_shim_last_error());
  fmt::print("ready pid={} role=source weights={} kv_pages={} driver={}\n", getpid(), w.mem.weights_bytes(),
             w.mem.kv_pages(), w.mem.driver_path());
  std::fflush(stdout);
  auto until = std::chrono::steady_clock::time_point::max();
  if (!o.run_for.empty()) {
    auto d = ParseDuration(o.run_for);
    if (!d.ok()) return Fail(d.status().message());
    until = std::chrono::steady_clock::now() + *d;
  }
  bool released = false;
  std::thread t([&] { released = Writer(w, rate, until); });
  t.join();
  if (!w.error.empty()) return Fail("writing the kv cache: " + w.error);
  if (released || gm_shim_released()) {
    if (!DumpHashes(w, o.dump_hashes)) return 2;
    fmt::print("released at step {}: the workload moved to the destination\n", w.step.load());
    std::fflush(stdout);
    gm_shim_shutdown();
    return 0;
  }
  gm_shim_shutdown();
  if (std::string e = w.mem.Check(o.seed, w.st.versions); !e.empty()) {
    fmt::print(stderr, "cuda-workload[{}]: self-check at exit FAILED: {}\n", getpid(), e);
    return 1;
  }
  fmt::print("self-check at exit: weights and {} kv pages OK at step {}\n", w.mem.kv_pages(), w.step.load());
  return 0;
}

// Waits for the migration in slices, so SIGTERM/SIGINT end the wait too.
int WaitAdopt(Workload& w, const Options& o) {
  auto timeout = ParseDuration(o.adopt_timeout);
  if (!timeout.ok()) return Fail(timeout.status().message());
  const auto give_up = std::chrono::steady_clock::now() + *timeout;
  void* blob = nullptr;
  size_t len = 0;
  while (gm_shim_wait_adopt(&blob, &len, 200) != 0) {
    if (g_stop.load()) return Fail("stopped while waiting to adopt");
    if (std::chrono::steady_clock::now() >= give_up) return Fail("no migration arrived in --adopt-timeout");
  }
  workload::State got;
  std::string why = got.Parse(std::span(static_cast<const std::byte*>(blob), len));
  std::free(blob);
  if (why.empty() && (got.size != w.st.size || got.page_size != w.st.page_size || got.seed != w.st.seed)) {
    why = "the source's kv geometry or seed differs from this process's";
  }
  if (!why.empty()) {
    fmt::print(stderr, "cuda-workload[{}]: cannot adopt: {}\n", getpid(), why);
    return 1;
  }
  w.st.versions = std::move(got.versions);
  w.step = got.step;
  return 0;
}

int RunAdopt(Workload& w, const Options& o, double rate) {
  if (gm_shim_start_adopt() != 0) return Fail(std::string("gm_shim_start_adopt: ") + gm_shim_last_error());
  fmt::print("ready pid={} role=adopt weights={} kv_pages={} driver={}\n", getpid(), w.mem.weights_bytes(),
             w.mem.kv_pages(), w.mem.driver_path());
  std::fflush(stdout);
  if (int rc = WaitAdopt(w, o); rc != 0) return rc;
  if (std::string e = w.mem.Bind(); !e.empty()) return Fail(e);
  if (std::string e = w.mem.Check(o.seed, w.st.versions); !e.empty()) {
    fmt::print(stderr, "cuda-workload[{}]: check after adopt FAILED: {}\n", getpid(), e);
    return 1;
  }
  if (!DumpHashes(w, o.dump_hashes)) return 2;
  fmt::print("adopted at step {}: weights and {} kv pages equal to the source at stop\n", w.step.load(),
             w.mem.kv_pages());
  std::fflush(stdout);
  auto after = ParseDuration(o.run_after);
  if (!after.ok()) return Fail(after.status().message());
  if (after->count() > 0) {
    std::thread t([&] { (void)Writer(w, rate, std::chrono::steady_clock::now() + *after); });
    t.join();
    if (!w.error.empty()) return Fail("writing the kv cache: " + w.error);
    if (std::string e = w.mem.Check(o.seed, w.st.versions); !e.empty()) {
      fmt::print(stderr, "cuda-workload[{}]: check after running on FAILED: {}\n", getpid(), e);
      return 1;
    }
    fmt::print("ran on to step {}: weights and {} kv pages OK\n", w.step.load(), w.mem.kv_pages());
  }
  gm_shim_shutdown();
  return 0;
}

int Run(const Options& o) {
  auto weights = ParseSize(o.weights);
  auto kv = ParseSize(o.kv);
  auto page = ParseSize(o.kv_page);
  auto rate = ParseRateBytesPerS(o.rate);
  if (!weights.ok() || !kv.ok() || !page.ok() || !rate.ok()) return Fail("bad size or rate");
  if (*page < 4096 || *page > (64u << 20) || (*page & (*page - 1)) != 0) return Fail("--kv-page: a power of two >= 4KiB");
  auto round = [&](uint64_t v) { return std::max<uint64_t>(*page, (v + *page - 1) / *page * *page); };
  Workload w;
  if (std::string e = w.mem.Open(o.device, round(*weights), round(*kv), static_cast<uint32_t>(*page)); !e.empty()) {
    return Fail(e);
  }
  w.st.seed = o.seed;
  w.st.size = w.mem.kv_bytes();
  w.st.page_size = static_cast<uint32_t>(*page);
  w.st.versions.assign(w.mem.kv_pages(), 0);
  if (gm_shim_register_cuda("weights", w.mem.weights(), w.mem.weights_bytes(), GM_SHIM_HINT_STATIC, 0) != 0 ||
      gm_shim_register_cuda("kv-cache", w.mem.kv(), w.mem.kv_bytes(), GM_SHIM_HINT_DYNAMIC, 0) != 0) {
    return Fail(std::string("gm_shim_register_cuda: ") + gm_shim_last_error());
  }
  gm_shim_set_state(&SaveState, &w, 32 + uint64_t{w.mem.kv_pages()} * 4);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  return o.adopt ? RunAdopt(w, o, *rate) : RunSource(w, o, *rate);
}

}  // namespace
}  // namespace gpumigrate::cudaworkload

int main(int argc, char** argv) {
  gpumigrate::cudaworkload::Options o;
  CLI::App app{"gpumigrate-cuda-workload: a CUDA process that keeps writing its device memory (driver API only)"};
  app.add_option("--weights", o.weights, "Static region size (written once)")->capture_default_str();
  app.add_option("--kv", o.kv, "Dynamic region size (kv cache, rewritten at --rate)")->capture_default_str();
  app.add_option("--kv-page", o.kv_page, "Unit of a kv write")->capture_default_str();
  app.add_option("--rate", o.rate, "kv write rate, e.g. 50MB/s (0: as fast as possible)")->capture_default_str();
  app.add_option("--seed", o.seed, "Content seed (the destination must use the same)")->capture_default_str();
  app.add_option("--device", o.device, "CUDA device ordinal")->capture_default_str();
  app.add_flag("--adopt", o.adopt, "Be a destination: wait for a migration, check every byte and continue");
  app.add_option("--run-for", o.run_for, "Source: stop writing after this long, check and exit");
  app.add_option("--run-after", o.run_after, "Adopt: write on this long after adopting, then check")
      ->capture_default_str();
  app.add_option("--adopt-timeout", o.adopt_timeout, "Adopt: how long to wait for a migration")->capture_default_str();
  app.add_option("--dump-hashes", o.dump_hashes,
                 "Write a digest of every 64 KiB of both regions here: at release (source) or adoption (destination)");
  CLI11_PARSE(app, argc, argv);
  return gpumigrate::cudaworkload::Run(o);
}
