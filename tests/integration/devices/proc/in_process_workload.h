// A workload inside the test process: one region (memfd, anonymous or THP)
// exposed through the real shim, and writer threads that bracket their writes
// with gm_shim_enter/leave. The proc device then connects to our own pid.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "engine/devices/proc/trackers.h"
#include "gpumigrate/common/bitmap.h"
#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/devices/proc.h"
#include "gpumigrate/shim.h"

namespace gpumigrate::testing {

// Why this kernel cannot run a forced tracker, or empty when it can.
inline std::string KernelLacks(ProcTracking t) {
  proc::KernelTracking k = proc::ProbeKernelTracking();
  if (t == ProcTracking::kPagemapScan && !(k.wp_async && k.pagemap_scan)) return k.detail;
  if (t == ProcTracking::kSyncWp && !k.userfaultfd) return k.detail;
  return {};
}

enum class MemKind { kMemfd, kAnon, kThp };
inline const char* MemKindName(MemKind k) { return k == MemKind::kMemfd ? "memfd" : k == MemKind::kAnon ? "anon" : "thp"; }

class InProcessWorkload {
 public:
  InProcessWorkload(MemKind kind, size_t size, uint32_t flags = 0) : size_(size) {
    if (kind == MemKind::kMemfd) {
      mem_ = static_cast<std::byte*>(gm_shim_alloc("test", size, GM_SHIM_HINT_DYNAMIC, flags));
    } else {
      const size_t huge = 2u << 20;
      map_len_ = size + huge;
      void* p = mmap(nullptr, map_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      map_ = p == MAP_FAILED ? nullptr : p;
      auto base = reinterpret_cast<uintptr_t>(map_);
      mem_ = reinterpret_cast<std::byte*>(kind == MemKind::kThp ? (base + huge - 1) & ~(huge - 1) : base);
      if (kind == MemKind::kThp) flags |= GM_SHIM_HUGEPAGE;
      if (gm_shim_register("test", mem_, size, GM_SHIM_HINT_DYNAMIC, flags) != 0) mem_ = nullptr;
    }
    if (mem_ != nullptr) {
      // Every page non-zero to begin with (THP: faulted in as huge pages).
      for (size_t off = 0; off < size; off += 4096) std::memset(mem_ + off, 0x5a, 64);
    }
  }
  ~InProcessWorkload() {
    StopWriters();
    gm_shim_shutdown();
    if (map_ != nullptr) munmap(map_, map_len_);
  }

  bool ok() const { return mem_ != nullptr; }
  std::byte* mem() { return mem_; }
  size_t size() const { return size_; }
  uint64_t writes() const { return writes_.load(); }

  // Threads that keep writing random pages (each write stamps a counter into a
  // random 8-byte-aligned offset of the page) until StopWriters().
  void StartWriters(int n) {
    stop_ = false;
    for (int t = 0; t < n; ++t) {
      threads_.emplace_back([this, t] {
        std::mt19937_64 rng(1234 + t);
        const size_t pages = size_ / 4096;
        while (!stop_.load(std::memory_order_relaxed)) {
          if (gm_shim_enter() != 0) return;
          for (int k = 0; k < 8; ++k) {
            uint64_t p = rng() % pages;
            uint64_t stamp = writes_.fetch_add(1) + 1;
            size_t off = (rng() % (4096 / 8)) * 8;
            // Two writers may pick the same word: an atomic store keeps that
            // collision defined (a plain one is a data race TSan reports).
            std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(mem_ + p * 4096 + off))
                .store(stamp, std::memory_order_relaxed);
          }
          gm_shim_leave();
          if (rng() % 16 == 0) std::this_thread::yield();
        }
      });
    }
  }
  void StopWriters() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  size_t size_;
  std::byte* mem_ = nullptr;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> writes_{0};
  std::vector<std::thread> threads_;
};

// What pre-copy does with a tracker: a copy of region 0 of `dev`, kept up to
// date from the pages each sync reports. Once the writers have stopped and a
// last sync is copied, any page where it and the memory differ was written
// but never reported.
class ShadowCopy {
 public:
  explicit ShadowCopy(Device& dev) : dev_(dev), region_(dev.Regions()[0]), shadow_(region_.size_bytes) {
    EXPECT_TRUE(dev_.Read(0, 0, shadow_).ok());
  }
  // Syncs region 0 and copies the reported pages; returns how many were reported.
  uint64_t SyncAndCopy(DirtyTracker& t) {
    DirtyBitmap bm(region_.pages());
    Status st = t.Sync(0, bm);
    EXPECT_TRUE(st.ok()) << st.ToString();
    for (uint64_t p = bm.NextSet(0); p < bm.pages();) {
      uint64_t end = bm.NextClear(p);
      uint64_t off = p * region_.page_size, len = std::min(end * region_.page_size, region_.size_bytes) - off;
      EXPECT_TRUE(dev_.Read(0, off, std::span(shadow_.data() + off, len)).ok());
      p = bm.NextSet(end);
    }
    return bm.Count();
  }
  // 4 KiB pages where the copy and `mem` differ; *first is the first of them.
  uint64_t Differing(const std::byte* mem, uint64_t* first) const {
    uint64_t bad = 0;
    for (uint64_t p = 0; p < region_.size_bytes / 4096; ++p) {
      if (std::memcmp(shadow_.data() + p * 4096, mem + p * 4096, 4096) != 0 && bad++ == 0) *first = p;
    }
    return bad;
  }

 private:
  Device& dev_;
  RegionInfo region_;
  std::vector<std::byte> shadow_;
};

}  // namespace gpumigrate::testing
