// gpumigrate-workload: a process that keeps writing its memory, for migrating a
// real running process (`gpumigrate migrate --device proc:PID`), in tests and perf.
//
// Source mode: fills its region, serves the shim, and writes pages at --rate with
// --pattern until it is migrated away (released: exits 0), --run-for passes (then
// checks its own memory and exits 0 or 1) or SIGTERM. Adopt mode: waits for a
// migration, checks that every page equals the source's at stop (from the state
// blob: the version of every page), then writes on for --run-after and checks again.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <xxhash.h>

#include "gpumigrate/shim.h"
#include "gpumigrate/common/units.h"
#include "tools/workload/bursts.h"
#include "tools/workload/pattern.h"

namespace gpumigrate::workload {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

struct Options {
  std::string size = "256MiB";
  std::string memory = "memfd";  // memfd | anon | thp
  std::string rate = "200MB/s";
  std::string pattern = "random";  // random | sequential | hot
  double hot_fraction = 0.1;
  double fill = 1.0;
  uint32_t threads = 1;
  uint64_t seed = 1;
  bool adopt = false;
  bool dma = false;  // flag the region as written where page tables do not see it
  std::string write_via = "direct";  // direct | alias (a second mapping of the memfd)
  std::string run_for;               // source: stop after this long and self-check
  std::string run_after = "0s";      // adopt: write on this long after adopting
  std::string adopt_timeout = "300s";
  std::string dump_hashes;  // file for XXH3 of every page: at release (source), at adoption (destination)
  std::string burst;        // ON/OFF: write for ON, pause for OFF (empty: steadily)
  double burst_on_s = 0, burst_off_s = 0;
};

struct Workload {
  State st;
  std::byte* mem = nullptr;    // the registered mapping
  std::byte* wmem = nullptr;   // where writes go (== mem unless --write-via alias)
  uint64_t pages = 0;
  std::atomic<uint64_t> step{0};

  void Write(uint32_t p) {
    uint32_t v = static_cast<uint32_t>(step.fetch_add(1) + 1);
    FillPage(std::span(wmem + uint64_t{p} * st.page_size, st.page_size), st.seed, p, v);
    st.versions[p] = v;
  }

  // Checks every page; returns pages checked, or -1 after printing the first bad one.
  int64_t Check(const char* when) const {
    uint64_t bad = 0, first = 0;
    std::string first_why;
    for (uint64_t p = 0; p < pages; ++p) {
      std::string why = CheckPage(std::span(mem + p * st.page_size, st.page_size), st.seed, static_cast<uint32_t>(p),
                                  st.versions[p]);
      if (!why.empty()) {
        if (bad++ == 0) {
          first = p;
          first_why = why;
        }
      }
    }
    if (bad != 0) {
      fmt::print(stderr, "workload[{}]: self-check {} FAILED: {} of {} pages wrong; first: page {}: {}\n", getpid(),
                 when, bad, pages, first, first_why);
      return -1;
    }
    return static_cast<int64_t>(pages);
  }
};

// One XXH3-64 per page, little-endian, so two processes' memories compare with cmp.
bool DumpHashes(const Workload& w, const std::string& path) {
  if (path.empty()) return true;
  std::vector<uint64_t> h(w.pages);
  for (uint64_t p = 0; p < w.pages; ++p) h[p] = XXH3_64bits(w.mem + p * w.st.page_size, w.st.page_size);
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  bool ok = std::fwrite(h.data(), 8, h.size(), f) == h.size();
  return std::fclose(f) == 0 && ok;
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

// Writes pages at the given rate until told to stop; thread t of n owns pages p % n == t.
void Writer(Workload& w, const Options& o, double pages_per_s, uint32_t t, uint32_t n,
            std::chrono::steady_clock::time_point until, std::atomic<bool>& released) {
  std::mt19937_64 rng(o.seed * 1000 + t + w.step.load());
  const uint64_t owned = (w.pages - t + n - 1) / n;
  const uint64_t hot = std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(owned) * o.hot_fraction));
  uint64_t cursor = 0;
  const uint32_t burst = 16;
  const double per_thread = pages_per_s / n;
  auto start = std::chrono::steady_clock::now();
  uint64_t written = 0;
  while (!g_stop.load() && std::chrono::steady_clock::now() < until) {
    const double t_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!Writing(t_s, o.burst_on_s, o.burst_off_s)) {  // a pause between bursts
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (gm_shim_enter() != 0) {
      released = true;
      return;
    }
    for (uint32_t k = 0; k < burst; ++k) {
      uint64_t i;
      if (o.pattern == "sequential") {
        i = cursor++ % owned;
      } else if (o.pattern == "hot") {
        i = rng() % hot;
      } else {
        i = rng() % owned;
      }
      w.Write(static_cast<uint32_t>(i * n + t));
    }
    gm_shim_leave();
    written += burst;
    if (per_thread > 0 && o.burst_on_s > 0) {
      // Paced on the ON time alone: wait while ahead of the rate.
      while (!g_stop.load() &&
             static_cast<double>(written) / per_thread >
                 OnSeconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                           o.burst_on_s, o.burst_off_s)) {
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    } else if (per_thread > 0) {
      auto due = start + std::chrono::duration<double>(static_cast<double>(written) / per_thread);
      std::this_thread::sleep_until(due);
    }
  }
}

int Fail(const std::string& what) {
  fmt::print(stderr, "workload[{}]: {}: {}\n", getpid(), what, gm_shim_last_error());
  return 2;
}

int RunWith(const Options& o, uint64_t size_bytes, double rate_bytes_per_s);

int Run(const Options& o) {
  auto size = ParseSize(o.size);
  auto rate = ParseRateBytesPerS(o.rate);
  if (!size.ok() || !rate.ok()) {
    fmt::print(stderr, "workload: {}\n", !size.ok() ? size.status().message() : rate.status().message());
    return 2;
  }
  Options opt = o;
  if (!o.burst.empty()) {
    const auto slash = o.burst.find('/');
    auto on = ParseDuration(o.burst.substr(0, slash));
    auto off = slash == std::string::npos ? on : ParseDuration(o.burst.substr(slash + 1));
    if (slash == std::string::npos || !on.ok() || !off.ok() || *on <= std::chrono::nanoseconds(0) ||
        *off <= std::chrono::nanoseconds(0)) {
      fmt::print(stderr, "workload: --burst {}: give ON/OFF durations, e.g. 300ms/700ms\n", o.burst);
      return 2;
    }
    opt.burst_on_s = std::chrono::duration<double>(*on).count();
    opt.burst_off_s = std::chrono::duration<double>(*off).count();
  }
  return RunWith(opt, *size, *rate);
}

// Maps the region as --memory says (through the shim, or anonymous memory it
// registers) and sets w.mem. 0, or the exit code after printing why.
int MapRegion(const Options& o, Workload& w) {
  uint32_t flags = o.dma ? GM_SHIM_DMA_WRITTEN : 0;
  if (o.memory == "memfd") {
    w.mem = static_cast<std::byte*>(gm_shim_alloc("workload", w.st.size, GM_SHIM_HINT_DYNAMIC, flags));
    if (w.mem == nullptr) return Fail("gm_shim_alloc");
  } else {
    const size_t huge = 2u << 20;
    size_t len = o.memory == "thp" ? w.st.size + huge : w.st.size;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      fmt::print(stderr, "workload: mmap: {}\n", std::strerror(errno));
      return 2;
    }
    auto* base = static_cast<std::byte*>(p);
    if (o.memory == "thp") {
      base = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(base) + huge - 1) & ~(huge - 1));
      flags |= GM_SHIM_HUGEPAGE;
    }
    w.mem = base;
    if (gm_shim_register("workload", w.mem, w.st.size, GM_SHIM_HINT_DYNAMIC, flags) != 0) return Fail("gm_shim_register");
  }
  return 0;
}

// Where writes go: the registered mapping, or with --write-via alias a second
// mapping of the memfd. 0, or the exit code after printing why.
int MapWrites(const Options& o, Workload& w) {
  w.wmem = w.mem;
  if (o.write_via == "alias") {
    if (o.memory != "memfd") {
      fmt::print(stderr, "workload: --write-via alias needs --memory memfd\n");
      return 2;
    }
    // A second mapping of the same memory, as a device's DMA engine would write it:
    // the registered mapping's page tables never see these writes.
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx", reinterpret_cast<unsigned long>(w.mem),
                  reinterpret_cast<unsigned long>(w.mem + w.st.size));
    const int memfd = open(path, O_RDWR | O_CLOEXEC);
    if (memfd < 0) {
      fmt::print(stderr, "workload: open {}: {}\n", path, std::strerror(errno));
      return 2;
    }
    void* alias = mmap(nullptr, w.st.size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
    if (alias == MAP_FAILED) return 2;
    w.wmem = static_cast<std::byte*>(alias);
  }
  return 0;
}

// --threads writers until `until`, a signal or the release; returns once all ended.
void RunWriters(Workload& w, const Options& o, double pages_per_s, std::chrono::steady_clock::time_point until,
                std::atomic<bool>& released) {
  std::vector<std::thread> ts;
  for (uint32_t t = 0; t < o.threads; ++t) {
    ts.emplace_back([&, t] { Writer(w, o, pages_per_s, t, o.threads, until, released); });
  }
  for (auto& t : ts) t.join();
}

// Source: fills the region and writes until migrated away (exit 0), --run-for
// passes or a signal (then the self-check decides).
int RunAsSource(const Options& o, Workload& w, double pages_per_s) {
  uint64_t fill = static_cast<uint64_t>(static_cast<double>(w.pages) * o.fill);
  for (uint64_t p = 0; p < fill; ++p) w.Write(static_cast<uint32_t>(p));
  if (gm_shim_start() != 0) return Fail("gm_shim_start");
  fmt::print("ready pid={} role=source pages={} page_size={}\n", getpid(), w.pages, w.st.page_size);
  std::fflush(stdout);
  auto until = std::chrono::steady_clock::time_point::max();
  if (!o.run_for.empty()) {
    auto d = ParseDuration(o.run_for);
    if (!d.ok()) return 2;
    until = std::chrono::steady_clock::now() + *d;
  }
  std::atomic<bool> released{false};
  RunWriters(w, o, pages_per_s, until, released);
  if (released || gm_shim_released()) {
    if (!DumpHashes(w, o.dump_hashes)) return 2;
    fmt::print("released at step {}: the workload moved to the destination\n", w.step.load());
    std::fflush(stdout);
    gm_shim_shutdown();
    return 0;
  }
  int64_t n = w.Check("at exit");
  gm_shim_shutdown();
  if (n < 0) return 1;
  fmt::print("self-check at exit: {} pages OK at step {}\n", n, w.step.load());
  return 0;
}

// Waits (at most `timeout`) for the migrated state and checks it fits this
// process; fills `got`. 0, or the exit code after printing why.
int AwaitAdoption(const Workload& w, std::chrono::nanoseconds timeout, State& got) {
  void* blob = nullptr;
  size_t len = 0;
  // Wait in slices so SIGTERM/SIGINT end the wait too.
  auto give_up = std::chrono::steady_clock::now() + timeout;
  while (gm_shim_wait_adopt(&blob, &len, 200) != 0) {
    if (g_stop.load()) {
      fmt::print(stderr, "workload[{}]: stopped while waiting to adopt\n", getpid());
      gm_shim_shutdown();
      return 1;
    }
    if (std::chrono::steady_clock::now() >= give_up) return Fail("waiting to adopt");
  }
  std::string why = got.Parse(std::span(static_cast<const std::byte*>(blob), len));
  std::free(blob);
  if (!why.empty() || got.size != w.st.size || got.page_size != w.st.page_size || got.seed != w.st.seed) {
    fmt::print(stderr, "workload[{}]: cannot adopt: {}\n", getpid(),
               !why.empty() ? why : "the source's geometry or seed differs from this process's");
    return 1;
  }
  return 0;
}

// Adopt: waits for a migration, checks every page against the source's at stop,
// then writes on for --run-after and checks again.
int RunAsDestination(const Options& o, Workload& w, double pages_per_s) {
  // The destination's memory exists before data arrives (as a GPU's does): fault it
  // in now rather than page by page while round 0 lands.
  std::memset(w.mem, 0, w.st.size);
  if (gm_shim_start_adopt() != 0) return Fail("gm_shim_start_adopt");
  fmt::print("ready pid={} role=adopt pages={} page_size={}\n", getpid(), w.pages, w.st.page_size);
  std::fflush(stdout);
  auto timeout = ParseDuration(o.adopt_timeout);
  auto after = ParseDuration(o.run_after);
  if (!timeout.ok() || !after.ok()) return 2;
  State got;
  if (int rc = AwaitAdoption(w, *timeout, got); rc != 0) return rc;
  w.st.versions = std::move(got.versions);
  w.step = got.step;
  int64_t n = w.Check("after adopt");
  if (n < 0) return 1;
  if (!DumpHashes(w, o.dump_hashes)) return 2;
  fmt::print("adopted at step {}: {} pages equal to the source at stop\n", got.step, n);
  std::fflush(stdout);
  if (after->count() > 0) {
    std::atomic<bool> released{false};
    auto until = std::chrono::steady_clock::now() + *after;
    RunWriters(w, o, pages_per_s, until, released);
    n = w.Check("after running on");
    if (n < 0) return 1;
    fmt::print("ran on to step {}: {} pages OK\n", w.step.load(), n);
  }
  gm_shim_shutdown();
  return 0;
}

int RunWith(const Options& o, uint64_t size_bytes, double rate_bytes_per_s) {
  Workload w;
  w.st.seed = o.seed;
  w.st.page_size = static_cast<uint32_t>(sysconf(_SC_PAGESIZE));
  w.st.size = (size_bytes + w.st.page_size - 1) / w.st.page_size * w.st.page_size;
  w.pages = w.st.size / w.st.page_size;
  w.st.versions.assign(w.pages, 0);
  if (int rc = MapRegion(o, w); rc != 0) return rc;
  if (int rc = MapWrites(o, w); rc != 0) return rc;
  gm_shim_set_state(&SaveState, &w, 32 + w.pages * 4);
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);

  double pages_per_s = rate_bytes_per_s / static_cast<double>(w.st.page_size);
  return o.adopt ? RunAsDestination(o, w, pages_per_s) : RunAsSource(o, w, pages_per_s);
}

}  // namespace
}  // namespace gpumigrate::workload

int main(int argc, char** argv) {
  using gpumigrate::workload::Options;
  Options o;
  CLI::App app{"gpumigrate-workload: a process that keeps writing its memory, for live-migration tests and perf"};
  app.add_option("--size", o.size, "Region size")->capture_default_str();
  app.add_option("--memory", o.memory, "memfd (shared, mapped by gpumigrate), anon (read with process_vm_readv) or thp")
      ->check(CLI::IsMember({"memfd", "anon", "thp"}))
      ->capture_default_str();
  app.add_option("--rate", o.rate, "Write rate, e.g. 200MB/s (0: as fast as possible)")->capture_default_str();
  app.add_option("--pattern", o.pattern, "random, sequential or hot (random within --hot of the pages)")
      ->check(CLI::IsMember({"random", "sequential", "hot"}))
      ->capture_default_str();
  app.add_option("--hot", o.hot_fraction, "Fraction of pages the hot pattern writes")->capture_default_str();
  app.add_option("--fill", o.fill, "Fraction of pages written before serving")->capture_default_str();
  app.add_option("--threads", o.threads, "Writer threads")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--seed", o.seed, "Content seed (the destination must use the same)")->capture_default_str();
  app.add_flag("--adopt", o.adopt, "Be a destination: wait for a migration, check and continue");
  app.add_flag("--dma", o.dma, "Flag the region as written where page tables do not see it (hash tracking)");
  app.add_option("--write-via", o.write_via,
                 "direct, or alias: write through a second mapping of the memfd, as DMA would (page tables of the "
                 "registered mapping do not see it)")
      ->check(CLI::IsMember({"direct", "alias"}))
      ->capture_default_str();
  app.add_option("--run-for", o.run_for, "Source: stop writing after this long, self-check and exit");
  app.add_option("--run-after", o.run_after, "Adopt: write on this long after adopting, then self-check")
      ->capture_default_str();
  app.add_option("--adopt-timeout", o.adopt_timeout, "Adopt: how long to wait for a migration")->capture_default_str();
  app.add_option("--burst", o.burst,
                 "ON/OFF, e.g. 300ms/700ms: write at --rate for ON, then pause for OFF, repeatedly (default: steadily)");
  app.add_option("--dump-hashes", o.dump_hashes,
                 "Write XXH3 of every page here: at release (source) or on adoption (destination)");
  CLI11_PARSE(app, argc, argv);
  return gpumigrate::workload::Run(o);
}
