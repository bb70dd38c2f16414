// What tests/support/cuda/fake_app.cc (a CUDA process for the checkpoint tests)
// reports: a shared mapping of one AppProgress in the file named on its command
// line, updated as it goes, so a test reads progress without timing anything.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gpumigrate::cuda::testing {

struct AppProgress {
  std::atomic<uint32_t> ready;             // 1 once memory is allocated and filled
  std::atomic<uint32_t> failed;            // 1 when a CUDA call failed (last_error says which code)
  std::atomic<int32_t> last_error;
  std::atomic<uint64_t> iterations;        // loops done: copy back, verify, synchronise
  std::atomic<uint64_t> verify_failures;   // loops whose copy did not match the pattern
  std::atomic<uint64_t> device_ptr;        // the allocation's device address
  std::atomic<uint64_t> bytes;             // its size
};

// tests/cli/cuda_checkpoint_test.sh reads the file with Python at these offsets.
static_assert(offsetof(AppProgress, iterations) == 16 && offsetof(AppProgress, verify_failures) == 24);

// Maps (creating when `create`) the progress file; nullptr on failure.
inline AppProgress* MapProgress(const std::string& path, bool create) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0), 0600);
  if (fd < 0) return nullptr;
  if (create && ftruncate(fd, sizeof(AppProgress)) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, sizeof(AppProgress), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<AppProgress*>(p);
}

}  // namespace gpumigrate::cuda::testing
