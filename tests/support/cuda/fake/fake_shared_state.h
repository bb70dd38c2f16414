// The state file through which the checkpoint API of libcuda-fake.so crosses
// processes: a process that calls cuInit publishes
// $GPUMIGRATE_FAKE_CUDA_DIR/gm-fake-cuda.PID (default dir /dev/shm), a shared
// mapping of one SharedState, and runs a service thread; cuCheckpointProcess*
// called from another process (the controller, gpumigrate) maps the file and
// posts one request at a time:
//
//   controller                                   target's service thread
//   flock(file, LOCK_EX)
//   wait response_seq == request_seq (idle)
//   op, arg = ...; ++request_seq; futex wake ──▶ futex wait on request_seq wakes
//                                                runs op (GateLock, release or
//                                                restore memory, transition)
//   futex wait on response_seq (checking     ◀── result = r; response_seq =
//   kill(pid, 0) every 50 ms)                    request_seq; futex wake
//   flock(file, LOCK_UN)
//
// The state, the waiting and slow calls and the device's used bytes are
// published here by the target as they change, so GetState needs no request and
// tests can watch the target (ReadSharedState). A controller killed mid-request
// leaves the request to finish; the next one wakes the target (in case the dead
// one never did) and waits for it; the target also re-checks request_seq every
// 100 ms, so a lost wakeup cannot stall it. The file is created
// under a temporary name and renamed, so a reader never sees it half written;
// it holds the target's start time so a reused pid is not taken for it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumigrate::cuda::fake {

inline constexpr uint32_t kSharedMagic = 0x67'6d'66'63;  // "gmfc"
inline constexpr uint32_t kSharedVersion = 1;

enum class Op : uint32_t { kNone = 0, kLock = 1, kCheckpoint = 2, kRestore = 3, kUnlock = 4 };

struct SharedState {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  int32_t service_tid;
  uint64_t start_time;  // field 22 of /proc/PID/stat
  // Published by the target.
  std::atomic<int32_t> state;  // CUprocessState
  std::atomic<uint32_t> waiting_calls;
  std::atomic<uint32_t> slow_calls_inside;
  std::atomic<uint64_t> device_used_bytes;  // over all devices
  // The mailbox. request_seq and response_seq are futex words.
  std::atomic<uint32_t> request_seq;
  std::atomic<uint32_t> response_seq;
  std::atomic<uint32_t> op;
  std::atomic<uint32_t> arg;  // Lock: timeoutMs
  std::atomic<int32_t> result;
};
// tests/cli/cuda_checkpoint_test.sh reads the file with Python at these offsets.
static_assert(offsetof(SharedState, state) == 24 && offsetof(SharedState, slow_calls_inside) == 32);
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

// "DIR/gm-fake-cuda.PID".
std::string SharedStatePath(const std::string& dir, int pid);
// Field 22 of /proc/PID/stat (start time in clock ticks), or 0.
uint64_t ProcessStartTime(int pid);

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void FutexWakeAll(std::atomic<uint32_t>* word);

// A mapping of a live target's state file, or none (ok() false) when the file
// is missing, malformed, or belongs to a process that is gone or whose pid was
// reused. Owns the mapping and the descriptor.
class SharedStateView {
 public:
  SharedStateView(const std::string& dir, int pid);
  ~SharedStateView();
  SharedStateView(const SharedStateView&) = delete;
  SharedStateView& operator=(const SharedStateView&) = delete;

  bool ok() const { return state_ != nullptr; }
  SharedState* get() const { return state_; }
  int fd() const { return fd_; }
  // The target is still there (kill(pid, 0) and the same start time).
  bool TargetAlive() const;

 private:
  int pid_;
  int fd_ = -1;
  SharedState* state_ = nullptr;
};

}  // namespace gpumigrate::cuda::fake
