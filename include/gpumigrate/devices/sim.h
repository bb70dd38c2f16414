// The `sim` backend: a synthetic GPU running an LLM-inference workload.
//
// Regions (ids fixed):
//   0 weights      static: written once at load, never again
//   1 kv_cache     dynamic: append-mostly at kv_rate, blocks recycled when full
//   2 activations  dynamic, small ("hot"): every page rewritten every step
//   3 free_pool    zeros, never written
// The workload runs on its own thread while the device is RUNNING or PRE_COPY:
// each step (one decoded token for the batch) is `layers` kernels; each kernel
// rewrites its slice of the activations and appends its share of the step's KV
// bytes. The device can stop between any two kernels, so at a stop point the
// activation pages show the QEMU-test pattern: pages [0, k) hold step s and
// pages [k, n) hold step s - 1.
//
// A source device stores one version (the step that last wrote it) per page
// and derives contents from it, so it may be far larger than host RAM. A
// destination device stores real bytes (untouched pages cost no memory) and, once
// RUNNING, continues the workload from the loaded device state.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "gpumigrate/common/clock.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct SimSpec {
  uint64_t size_bytes = uint64_t{4} << 30;
  double static_fraction = 0.6;                  // weights
  double kv_fraction = 0.3;                      // KV cache (capped by what is left)
  double kv_fill = 0.5;                          // KV cache already written at start
  uint64_t hot_bytes = uint64_t{32} << 20;       // activations
  double kv_rate_bytes_per_s = 64.0 * (1 << 20); // KV append rate
  uint32_t page_size = 64 << 10;
  uint64_t seed = 1;
  std::chrono::microseconds step_period{20000};  // one decode step
  uint32_t layers = 32;                          // kernels per step (stop points)
  bool noise = false;  // data=noise: weights and KV cache hold random bytes (incompressible), not bf16 values

  // Canonical "sim:size=...,..." form, parseable by ParseSimSpec.
  std::string ToString() const;
};

// Parses "sim:llm", "sim" or "sim:key=value,...". Keys: size, static, kv, kv_fill,
// kv_rate, hot, page, seed, step, layers, data (bf16 or noise); unset keys take
// the sim:llm values.
Result<SimSpec> ParseSimSpec(std::string_view text);

using SimRole = DeviceRole;  // the name sim callers use

// Where the workload stands: the step in progress and the next kernel (layer) to run.
struct SimPosition {
  uint64_t step = 0;
  uint32_t layer = 0;
  uint64_t kv_cursor_bytes = 0;
};

class SimDevice : public Device {
 public:
  // Source devices start RUNNING with their workload going; destination devices
  // start in STOP, zero-filled.
  // The workload steps on `clock` (borrowed; outlives the device).
  static Result<std::unique_ptr<SimDevice>> Create(const SimSpec& spec, SimRole role, Clock& clock = SystemClock());

  virtual const SimSpec& spec() const = 0;
  virtual SimRole role() const = 0;
  // Consistent only while the workload is paused (any state but RUNNING/PRE_COPY).
  virtual SimPosition Position() const = 0;
  // Kernels run since creation (or since the state was loaded); for tests and demos.
  virtual uint64_t KernelsRun() const = 0;
  // The workload checks its own memory, as a guest would after a resume: every
  // activation page must carry the canary of the step that last wrote it given
  // Position(), with contents intact. Needs the workload paused. Returns the
  // number of pages checked, or an error naming the first bad page.
  virtual Result<uint64_t> SelfCheck() = 0;
};

// After a completed migration: the destination keeps the workload running for
// `run_after`, then pauses it and runs the workload's own memory self-check
// (every activation page carries the canary of the step that last wrote it).
struct SimResumeCheck {
  SimPosition resumed_at;
  uint64_t kernels_run = 0;             // on the destination during run_after
  std::chrono::nanoseconds run_after{0};
  Status status;                        // of the pause and the self-check
  uint64_t pages_checked = 0;
  bool ok() const { return status.ok(); }
  // {resumed_at_step, resumed_at_layer, kernels_run_after_resume, self_check}
  std::string ToJson() const;
  std::string ToLine() const;  // "  destination: resumed at step ..."
};
SimResumeCheck RunResumeCheck(SimDevice& dest, std::chrono::nanoseconds run_after, Clock& clock);

}  // namespace gpumigrate
