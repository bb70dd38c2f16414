// Suspend and resume against the REAL driver (libcuda.so.1) on a real GPU: a
// child process allocates device memory and fills it, this process suspends and
// resumes it through include/gpumigrate/devices/cuda_checkpoint.h, and the child checks
// its memory. Skips, with the reason, where no driver, no checkpoint API or no
// device is found. ctest label `gpu`.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/devices/cuda/driver_loader.h"
#include "gpumigrate/devices/cuda_checkpoint.h"

namespace gpumigrate {
namespace {

using namespace cuda;  // NOLINT

constexpr size_t kBytes = 64u << 20;

void Say(int fd, const std::string& s) { (void)!write(fd, s.data(), s.size()); }

std::string Hear(int fd) {
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Whatever an ASSERT leaves behind, the child must not stay LOCKED or
// CHECKPOINTED on a real GPU: try to resume it, then kill and reap it.
class ChildGuard {
 public:
  explicit ChildGuard(pid_t pid) : pid_(pid) {}
  ~ChildGuard() {
    if (pid_ <= 0) return;
    if (auto info = QueryCudaProcess(pid_); info.ok() && info->state != CudaProcessState::kRunning) {
      (void)ResumeCudaProcess(pid_);
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  // The child was reaped by the test itself.
  void Release() { pid_ = -1; }
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;

 private:
  pid_t pid_;
};

// The CUDA process: never returns. Says "ready", or "skip: why" / "error: what".
[[noreturn]] void Child(int to_parent, int from_parent) {
  LoadedDriver d;
  if (std::string e = LoadDriver(kNeedCore | kNeedMemory, &d); !e.empty()) Say(to_parent, "skip: " + e), _exit(0);
  const DriverApi& a = d.api;
  int count = 0;
  if (CUresult r = a.cuInit(0)) Say(to_parent, "skip: cuInit: " + ResultText(a, r)), _exit(0);
  if (a.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) Say(to_parent, "skip: no CUDA device"), _exit(0);
  CUcontext ctx = nullptr;
  CUdeviceptr p = 0;
  std::vector<uint32_t> want(kBytes / 4), got(kBytes / 4);
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<uint32_t>(i * 2654435761u);
  if (a.cuDevicePrimaryCtxRetain(&ctx, 0) || a.cuCtxSetCurrent(ctx) || a.cuMemAlloc(&p, kBytes) ||
      a.cuMemcpyHtoD(p, want.data(), kBytes)) {
    Say(to_parent, "error: setting up device memory failed"), _exit(1);
  }
  Say(to_parent, "ready");
  Hear(from_parent);  // "verify", after the parent's suspend and resume
  const CUresult r = a.cuMemcpyDtoH(got.data(), p, kBytes);
  Say(to_parent, r != CUDA_SUCCESS ? "error: cuMemcpyDtoH " + ResultText(a, r) : got == want ? "intact" : "changed");
  _exit(0);
}

TEST(CudaCheckpointGpu, SuspendAndResumeKeepDeviceMemory) {
  unsetenv("GPUMIGRATE_LIBCUDA");  // the real driver, whatever the environment says
  LoadedDriver probe;
  if (std::string e = LoadDriver(kNeedCore | kNeedMemory | kNeedCheckpoint, &probe); !e.empty()) GTEST_SKIP() << e;
  int up[2], down[2];
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  const pid_t pid = fork();  // before this process touches CUDA: a CUDA context does not survive fork
  if (pid == 0) Child(up[1], down[0]);
  ChildGuard guard(pid);
  const std::string hello = Hear(up[0]);
  if (hello.rfind("skip: ", 0) == 0) {
    waitpid(pid, nullptr, 0);
    guard.Release();
    GTEST_SKIP() << hello.substr(6);
  }
  ASSERT_EQ(hello, "ready");
  auto info = QueryCudaProcess(pid);
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->state, CudaProcessState::kRunning);
  Status st = SuspendCudaProcess(pid, std::chrono::seconds(30));
  ASSERT_TRUE(st.ok()) << st.message();
  info = QueryCudaProcess(pid);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state, CudaProcessState::kCheckpointed);
  st = ResumeCudaProcess(pid);
  ASSERT_TRUE(st.ok()) << st.message();
  Say(down[1], "verify");
  EXPECT_EQ(Hear(up[0]), "intact");
  int status = 0;
  waitpid(pid, &status, 0);
  guard.Release();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace gpumigrate
