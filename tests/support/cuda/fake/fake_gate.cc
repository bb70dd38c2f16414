#include "tests/support/cuda/fake/fake_gate.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/support/cuda/fake/fake_libcuda.h"

namespace gpumigrate::cuda::fake {
namespace {

struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  CUprocessState state = CU_PROCESS_STATE_RUNNING;
  bool locking = false;  // a lock waits for the calls in flight; new calls wait too
  uint32_t in_flight = 0;
  GateCounters counters;

  void Publish() { PublishGate(state, counters); }
};

Gate& TheGate() {
  static Gate* gate = new Gate;  // never destroyed: detached threads may use it at exit
  return *gate;
}

}  // namespace

CallGuard::CallGuard(const char* call) {
  if (!Initialized()) {
    result_ = CUDA_ERROR_NOT_INITIALIZED;
    return;
  }
  if (CUresult f = InjectedFailure(call)) {
    result_ = f;
    return;
  }
  Gate& g = TheGate();
  std::unique_lock lock(g.mu);
  if (g.state != CU_PROCESS_STATE_RUNNING || g.locking) {
    ++g.counters.waiting;
    g.Publish();
    g.cv.wait(lock, [&] { return g.state == CU_PROCESS_STATE_RUNNING && !g.locking; });
    --g.counters.waiting;
    g.Publish();
  }
  ++g.in_flight;
  entered_ = true;
  if (const unsigned ms = SlowMs(call); ms > 0) {
    ++g.counters.slow_inside;
    g.Publish();
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    lock.lock();
    --g.counters.slow_inside;
    g.Publish();
  }
}

CallGuard::~CallGuard() {
  if (!entered_) return;
  Gate& g = TheGate();
  std::lock_guard lock(g.mu);
  --g.in_flight;
  g.cv.notify_all();
}

CUprocessState GateState() {
  Gate& g = TheGate();
  std::lock_guard lock(g.mu);
  return g.state;
}

GateCounters GetGateCounters() {
  Gate& g = TheGate();
  std::lock_guard lock(g.mu);
  return g.counters;
}

CUresult GateLock(unsigned timeout_ms) {
  Gate& g = TheGate();
  std::unique_lock lock(g.mu);
  if (g.state != CU_PROCESS_STATE_RUNNING || g.locking) return CUDA_ERROR_ILLEGAL_STATE;
  g.locking = true;
  const auto idle = [&] { return g.in_flight == 0; };
  bool ok = true;
  if (timeout_ms == 0) {
    g.cv.wait(lock, idle);
  } else {
    ok = g.cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), idle);
  }
  g.locking = false;
  if (ok) g.state = CU_PROCESS_STATE_LOCKED;
  g.Publish();
  g.cv.notify_all();  // on a timeout, the calls that waited go on
  return ok ? CUDA_SUCCESS : CUDA_ERROR_TIMEOUT;
}

CUresult GateTransition(CUprocessState from, CUprocessState to) {
  Gate& g = TheGate();
  std::lock_guard lock(g.mu);
  if (g.state != from || g.locking) return CUDA_ERROR_ILLEGAL_STATE;
  g.state = to;
  g.Publish();
  g.cv.notify_all();
  return CUDA_SUCCESS;
}

}  // namespace gpumigrate::cuda::fake
