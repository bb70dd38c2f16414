// The target side of the checkpoint API: publishes the state file
// (fake_shared_state.h) at the first cuInit and runs the service thread that
// carries out the requests of controllers in other processes.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>

#include "tests/support/cuda/fake/fake_gate.h"
#include "tests/support/cuda/fake/fake_libcuda.h"
#include "tests/support/cuda/fake/fake_shared_state.h"

namespace gpumigrate::cuda::fake {
namespace {

// How long the service sleeps before it re-checks for a request whose poster
// died before waking it (a lost wakeup must not stall the target for ever).
constexpr int kServiceRecheckMs = 100;

std::atomic<SharedState*> g_shared{nullptr};
std::string* g_path = nullptr;  // for the unlink at exit
pid_t g_owner = 0;  // the process that published the file: only it unlinks it

const char* CallName(Op op) {
  switch (op) {
    case Op::kLock: return "cuCheckpointProcessLock";
    case Op::kCheckpoint: return "cuCheckpointProcessCheckpoint";
    case Op::kRestore: return "cuCheckpointProcessRestore";
    case Op::kUnlock: return "cuCheckpointProcessUnlock";
    case Op::kNone: break;
  }
  return "";
}

CUresult Serve(Op op, uint32_t arg) {
  // $GPUMIGRATE_FAKE_CUDA_FAIL of the target fails the step here, in the target,
  // before anything is done (a failure the controller only sees as a result).
  if (CUresult f = InjectedFailure(CallName(op))) return f;
  switch (op) {
    case Op::kLock:
      return GateLock(arg);
    case Op::kCheckpoint: {
      // Only the service changes the state away from LOCKED, so the check holds.
      if (GateState() != CU_PROCESS_STATE_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
      if (CUresult r = ReleaseAllDeviceMemory()) return r;  // released nothing
      return GateTransition(CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED);
    }
    case Op::kRestore: {
      if (GateState() != CU_PROCESS_STATE_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
      if (CUresult r = RestoreAllDeviceMemory()) return r;
      return GateTransition(CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED);
    }
    case Op::kUnlock:
      return GateTransition(CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING);
    case Op::kNone:
      break;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

void ServiceLoop(SharedState* s) {
  uint32_t served = s->response_seq.load();
  for (;;) {
    const uint32_t req = s->request_seq.load();
    if (req == served) {
      FutexWait(&s->request_seq, req, kServiceRecheckMs);
      continue;
    }
    const CUresult r = Serve(static_cast<Op>(s->op.load()), s->arg.load());
    uint64_t used = 0;
    for (int d = 0; d < GetConfig().devices; ++d) used += DeviceUsedBytes(d);
    s->device_used_bytes.store(used);
    s->result.store(r);
    s->response_seq.store(req);
    FutexWakeAll(&s->response_seq);
    served = req;
  }
}

// Creates and fills the file under the temporary name `tmp`; the caller renames
// it into place once the service runs.
SharedState* Create(const std::string& tmp) {
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  void* p = MAP_FAILED;
  if (ftruncate(fd, sizeof(SharedState)) == 0) {
    p = mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (p == MAP_FAILED) {
    unlink(tmp.c_str());
    return nullptr;
  }
  auto* s = new (p) SharedState{};
  s->version = kSharedVersion;
  s->pid = getpid();
  s->start_time = ProcessStartTime(getpid());
  s->state.store(GateState());
  s->magic = kSharedMagic;
  return s;
}

}  // namespace

void StartService() {
  const std::string path = SharedStatePath(GetConfig().dir, getpid());
  const std::string tmp = path + ".tmp";
  SharedState* s = Create(tmp);
  if (s == nullptr) {
    std::fprintf(stderr, "libcuda-fake: cannot publish %s; the checkpoint API will not find this process\n",
                 path.c_str());
    return;
  }
  std::atomic<int> tid{0};
  std::thread([s, &tid] {
    tid.store(static_cast<int>(gettid()));
    tid.notify_one();
    ServiceLoop(s);
  }).detach();
  tid.wait(0);
  s->service_tid = tid.load();
  g_shared.store(s);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    std::fprintf(stderr, "libcuda-fake: cannot publish %s\n", path.c_str());
    return;
  }
  g_path = new std::string(path);
  g_owner = getpid();
  std::atexit([] {
    if (g_path != nullptr && g_owner == getpid()) unlink(g_path->c_str());
  });
  // A child forked after cuInit has no service thread and is not the process the
  // file names: it must neither publish into the parent's file nor unlink it.
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(nullptr, nullptr, [] { g_shared.store(nullptr); });  // g_owner is the parent's pid
  });
}

void PublishGate(CUprocessState state, const GateCounters& counters) {
  SharedState* s = g_shared.load();
  if (s == nullptr) return;
  s->state.store(state);
  s->waiting_calls.store(counters.waiting);
  s->slow_calls_inside.store(counters.slow_inside);
}

void PublishDeviceUsed(uint64_t bytes) {
  if (SharedState* s = g_shared.load()) s->device_used_bytes.store(bytes);
}

}  // namespace gpumigrate::cuda::fake
