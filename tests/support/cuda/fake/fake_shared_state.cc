#include "tests/support/cuda/fake/fake_shared_state.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace gpumigrate::cuda::fake {

std::string SharedStatePath(const std::string& dir, int pid) { return dir + "/gm-fake-cuda." + std::to_string(pid); }

uint64_t ProcessStartTime(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return 0;
  const size_t close = line.rfind(')');  // the command name may hold spaces and ')'
  if (close == std::string::npos) return 0;
  std::istringstream fields(line.substr(close + 2));
  std::string f;
  // Fields after the name start at 3 (state); the start time is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> f)) return 0;
  }
  return std::strtoull(f.c_str(), nullptr, 10);
}

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
  // Shared (not FUTEX_PRIVATE): the word lives in a mapping of another process.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, timeout_ms >= 0 ? &ts : nullptr,
          nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

SharedStateView::SharedStateView(const std::string& dir, int pid) : pid_(pid) {
  if (pid <= 0) return;
  fd_ = open(SharedStatePath(dir, pid).c_str(), O_RDWR | O_CLOEXEC);
  if (fd_ < 0) return;
  struct stat st{};
  if (fstat(fd_, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(SharedState)) return;
  void* p = mmap(nullptr, sizeof(SharedState), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) return;
  auto* s = static_cast<SharedState*>(p);
  if (s->magic != kSharedMagic || s->version != kSharedVersion || s->pid != pid) {
    munmap(p, sizeof(SharedState));
    return;
  }
  state_ = s;
  if (!TargetAlive()) {
    munmap(p, sizeof(SharedState));
    state_ = nullptr;
  }
}

SharedStateView::~SharedStateView() {
  if (state_ != nullptr) munmap(state_, sizeof(SharedState));
  if (fd_ >= 0) close(fd_);
}

bool SharedStateView::TargetAlive() const {
  if (state_ == nullptr) return false;
  if (kill(pid_, 0) != 0 && errno == ESRCH) return false;
  const uint64_t start = ProcessStartTime(pid_);
  // A zombie (killed, not yet reaped) still has its stat; its service is gone.
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z') return false;
  return start != 0 && start == state_->start_time;
}

}  // namespace gpumigrate::cuda::fake
