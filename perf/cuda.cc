// Cost per GiB of the cuda:PID device's two data paths through the shim, each
// beside its floor measured in the same run:
//   staging  Device::Read of a whole CUDA region in 1 MiB reads (as the session
//            reads), 1 and 2 reader threads: cuMemcpyDtoH into the shim's pinned
//            slot, a socket round trip, a memcpy out of the slot. Floors: one
//            cuMemcpyDtoH of the region into pinned memory, and memcpy.
//   hashing  a full digest pass over the region (DirtyTracker::Start; Sync costs
//            the same), with the gm_hash_pages kernel (gpu-hash) and with host
//            hashing of staged pages (host-hash). Peer: page_hash.h on host memory.
// The process is its own CUDA workload: it allocates device memory through the
// driver ($GPUMIGRATE_LIBCUDA: the driver double here, where "device memory" is
// host memory and the kernel runs on the CPU; libcuda.so.1 on a GPU machine),
// registers it with the shim and connects a cuda: device to its own pid.
//   cuda [SIZE=512MiB] [REPS=3]
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/devices/cuda/driver_loader.h"
#include "engine/devices/cuda/page_hash.h"
#include "gpumigrate/devices/cuda.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/shim.h"
#include "gpumigrate/common/stats.h"
#include "gpumigrate/common/units.h"

using namespace gpumigrate;
using SteadyClock = std::chrono::steady_clock;

namespace {

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

[[noreturn]] void Die(const std::string& why) {
  fmt::print(stderr, "perf/cuda: {}\n", why);
  std::exit(1);
}

struct Gpu {
  cuda::LoadedDriver drv;
  cuda::CUcontext ctx = nullptr;
  cuda::CUdeviceptr mem = 0;
};

// Allocates `size` bytes of device memory holding random bf16-like words.
Gpu Open(uint64_t size) {
  Gpu g;
  if (std::string e = cuda::LoadDriver(cuda::kNeedCore | cuda::kNeedMemory, &g.drv); !e.empty()) Die(e);
  const cuda::DriverApi& a = g.drv.api;
  if (a.cuInit(0) != 0 || a.cuDevicePrimaryCtxRetain(&g.ctx, 0) != 0 || a.cuCtxSetCurrent(g.ctx) != 0 ||
      a.cuMemAlloc(&g.mem, size) != 0) {
    Die(fmt::format("cannot set up {} of device memory on {}", FormatBytes(static_cast<double>(size)), g.drv.path));
  }
  std::vector<uint64_t> chunk((64u << 20) / 8);
  std::mt19937_64 rng(7);
  for (uint64_t off = 0; off < size; off += chunk.size() * 8) {
    for (auto& w : chunk) w = rng() & 0x3fff3fff3fff3fffull;
    const uint64_t n = std::min<uint64_t>(chunk.size() * 8, size - off);
    if (a.cuMemcpyHtoD(g.mem + off, chunk.data(), n) != 0) Die("cuMemcpyHtoD failed");
  }
  return g;
}

std::unique_ptr<ProcDevice> Connect(CudaHash hash) {
  auto dev = ProcDevice::Connect(ProcSpecForCuda(CudaSpec{getpid(), kCudaDefaultPageSize, hash}), ProcRole::kSource);
  if (!dev.ok()) Die(dev.status().message());
  return std::move(dev).value();
}

// Reads the whole region in 1 MiB reads from `threads` threads; returns ms.
double ReadAll(ProcDevice& dev, uint64_t size, int threads) {
  const uint64_t chunk = 1u << 20;
  auto t0 = SteadyClock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      std::vector<std::byte> buf(chunk);
      for (uint64_t off = t * chunk; off < size; off += threads * chunk) {
        if (Status st = dev.Read(0, off, std::span(buf.data(), std::min(chunk, size - off))); !st.ok()) {
          Die(st.message());
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  return Ms(SteadyClock::now() - t0);
}

void PrintFloors(Gpu& g, uint64_t size, int reps, double* memcpy_ms, double* dtoh_ms) {
  std::vector<std::byte> a(size), b(size);
  std::memset(a.data(), 1, size);
  std::memset(b.data(), 2, size);
  std::vector<double> copy, dtoh, hash;
  const bool pinned = g.drv.api.cuMemHostRegister(b.data(), size, cuda::CU_MEMHOSTREGISTER_PORTABLE) == 0;
  uint64_t sink = 0;
  for (int i = 0; i < reps; ++i) {
    auto t0 = SteadyClock::now();
    std::memcpy(b.data(), a.data(), size);
    auto t1 = SteadyClock::now();
    if (g.drv.api.cuMemcpyDtoH(b.data(), g.mem, size) != 0) Die("cuMemcpyDtoH failed");
    auto t2 = SteadyClock::now();
    for (uint64_t off = 0; off < size; off += kCudaDefaultPageSize) sink ^= cuda::HashPage(b.data() + off, kCudaDefaultPageSize);
    auto t3 = SteadyClock::now();
    copy.push_back(Ms(t1 - t0));
    dtoh.push_back(Ms(t2 - t1));
    hash.push_back(Ms(t3 - t2));
  }
  if (pinned) (void)g.drv.api.cuMemHostUnregister(b.data());
  const double gib = static_cast<double>(size) / (1u << 30);
  *memcpy_ms = UpperMedian(copy);
  *dtoh_ms = UpperMedian(dtoh);
  nlohmann::ordered_json j;
  j["bench"] = "cuda_floors";
  j["driver"] = g.drv.path;
  j["region_bytes"] = size;
  j["memcpy_ms_per_gib"] = *memcpy_ms / gib;
  j["dtoh_pinned_ms_per_gib"] = *dtoh_ms / gib;
  j["dtoh_into_pinned"] = pinned;
  j["host_page_hash_ms_per_gib"] = UpperMedian(hash) / gib;
  j["sink"] = sink & 1;
  fmt::print("{}\n", j.dump());
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = 512u << 20;
  int reps = 3;
  if (argc > 1) {
    auto s = ParseSize(argv[1]);
    if (!s.ok()) Die(s.status().message());
    size = *s / kCudaDefaultPageSize * kCudaDefaultPageSize;
  }
  if (argc > 2) reps = std::max(1, std::atoi(argv[2]));
  const double gib = static_cast<double>(size) / (1u << 30);
  Gpu g = Open(size);
  if (gm_shim_register_cuda("bench", g.mem, size, GM_SHIM_HINT_STATIC, 0) != 0 || gm_shim_start() != 0) {
    Die(gm_shim_last_error());
  }
  double memcpy_ms = 0, dtoh_ms = 0;
  PrintFloors(g, size, reps, &memcpy_ms, &dtoh_ms);
  auto dev = Connect(CudaHash::kAuto);
  double read1_ms = 0;
  for (int threads : {1, 2}) {
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) ms.push_back(ReadAll(*dev, size, threads));
    nlohmann::ordered_json j;
    j["bench"] = "cuda_staging";
    j["driver"] = g.drv.path;
    j["region_bytes"] = size;
    j["reader_threads"] = threads;
    j["read_ms_per_gib"] = UpperMedian(ms) / gib;
    j["read_gb_per_s"] = static_cast<double>(size) / UpperMedian(ms) / 1e6;
    j["floor_dtoh_pinned_ms_per_gib"] = dtoh_ms / gib;
    j["floor_memcpy_ms_per_gib"] = memcpy_ms / gib;
    j["vs_dtoh"] = UpperMedian(ms) / dtoh_ms;
    fmt::print("{}\n", j.dump());
    if (threads == 1) read1_ms = UpperMedian(ms);
  }
  dev.reset();
  for (CudaHash h : {CudaHash::kGpu, CudaHash::kHost}) {
    auto d = ProcDevice::Connect(ProcSpecForCuda(CudaSpec{getpid(), kCudaDefaultPageSize, h}), ProcRole::kSource);
    if (!d.ok()) {
      fmt::print("{}\n", nlohmann::ordered_json{{"bench", "cuda_hash"}, {"hash", CudaHashName(h)},
                                                {"skipped", d.status().message()}}.dump());
      continue;
    }
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      auto t0 = SteadyClock::now();
      if (Status st = (*d)->Tracker()->Start(); !st.ok()) Die(st.message());
      ms.push_back(Ms(SteadyClock::now() - t0));
      (void)(*d)->Tracker()->Stop();
    }
    nlohmann::ordered_json j;
    j["bench"] = "cuda_hash";
    j["driver"] = g.drv.path;
    j["tracker"] = (*d)->TrackerName();
    j["reason"] = (*d)->TrackerReason();
    j["region_bytes"] = size;
    j["page_bytes"] = kCudaDefaultPageSize;
    j["digest_pass_ms_per_gib"] = UpperMedian(ms) / gib;
    j["digest_bytes_per_gib"] = (1u << 30) / kCudaDefaultPageSize * 8;
    j["peer_staging_read_of_all_ms_per_gib"] = read1_ms / gib;  // what reading every page instead would cost
    j["floor_dtoh_pinned_ms_per_gib"] = dtoh_ms / gib;
    fmt::print("{}\n", j.dump());
  }
  gm_shim_shutdown();
  return 0;
}
