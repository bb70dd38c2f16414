// The target process's side of "Lock blocks further CUDA API calls": every
// gated call enters through CallGuard (fake_libcuda.h), which waits while the
// process is LOCKED or CHECKPOINTED (or a lock is being taken) and counts the
// calls in flight, so that a lock can wait for them to return. The service
// thread (fake_service.cc) drives the transitions through these functions.
// Thread safety: all functions may be called from any thread.
#pragma once

#include <cstdint>

#include "engine/devices/cuda/cuda_abi.h"

namespace gpumigrate::cuda::fake {

CUprocessState GateState();
// RUNNING -> LOCKED once no call is in flight; new calls wait meanwhile. With
// timeout_ms > 0 and calls still in flight when it expires: stays RUNNING,
// returns CUDA_ERROR_TIMEOUT. Other states: CUDA_ERROR_ILLEGAL_STATE.
CUresult GateLock(unsigned timeout_ms);
// Sets `to` when the state is `from`, else CUDA_ERROR_ILLEGAL_STATE. Unlocking
// (to RUNNING) wakes the waiting calls.
CUresult GateTransition(CUprocessState from, CUprocessState to);

// Counters for tests (also published in the state file): calls now waiting at
// the gate, and calls now inside a $GPUMIGRATE_FAKE_CUDA_SLOW sleep.
struct GateCounters {
  uint32_t waiting = 0;
  uint32_t slow_inside = 0;
};
GateCounters GetGateCounters();

// Called by the gate, under its lock, whenever its state or counters change
// (fake_service.cc mirrors them into the state file).
void PublishGate(CUprocessState state, const GateCounters& counters);

}  // namespace gpumigrate::cuda::fake
