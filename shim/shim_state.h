// The state libgpumigrate_shim shares between its server (shim.cc) and the
// calls the application makes before gm_shim_start (registration.cc): the
// regions, the pause gate, the destination's adopted state. Everything under
// Shim::mu unless said otherwise. Internal: not part of the shim's C API.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpumigrate/shim.h"

#define GM_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpumigrate::shimcore {

struct Region {
  std::string name;
  std::byte* addr = nullptr;
  size_t size = 0;
  uint32_t hint = 0;
  uint32_t flags = 0;
  int memfd = -1;  // >= 0: allocated by gm_shim_alloc (and unmapped by shutdown)
  bool registered = false;
  uint64_t dptr = 0;  // != 0: a CUDA region (addr is null), served by cuda_regions.cc
};

struct Shim {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Region> regions;
  gm_shim_save_fn save = nullptr;
  void* save_ctx = nullptr;
  size_t state_hint = 0;

  bool serving = false;
  bool adopt = false;
  // Pause gate.
  bool paused = false;
  int active = 0;
  bool held = false;
  bool released = false;
  // Destination.
  std::vector<std::byte> loaded;
  bool adopted = false;

  int listen_fd = -1;
  std::string path;
  std::atomic<bool> stop{false};
  std::thread server;
};

// The one shim of the process (never destroyed: the server thread may outlive
// static destructors).
Shim& S();

// Sets the calling thread's gm_shim_last_error() text; returns -err.
int Fail(int err, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
const std::string& LastError();
// A line on stderr, "gpumigrate-shim[PID]: ...".
void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
size_t PageSize();
// Adds a region (before gm_shim_start; names are unique): 0 or Fail().
int AddRegion(Region r);

}  // namespace gpumigrate::shimcore
