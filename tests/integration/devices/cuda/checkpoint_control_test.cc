// Suspend and resume (include/gpumigrate/cuda_checkpoint.h) of real processes
// running against the driver double: tests/support/cuda/fake_app.cc is the CUDA
// process, this test the controller, and the fake's state file in a private
// folder joins them.
#include "gpumigrate/cuda_checkpoint.h"

#include <sys/uio.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <gtest/gtest.h>

#include "tests/support/cuda/app_process.h"
#include "tests/support/cuda/fake/fake_shared_state.h"
#include "tests/support/cuda/fresh_fake.h"

namespace gpumigrate {
namespace {

using cuda::fake::SharedStateView;
using cuda::testing::AppProcess;
using cuda::testing::ScopedEnv;
using std::chrono::milliseconds;

std::string g_dir;  // the fake's state folder, for the app and for this process

// Every test of this binary controls its apps through the one fake instance
// CudaDriver loads, so the folder is set once, before the first load.
class FakeEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    char tmpl[] = "/tmp/gm-cuda-ckpt-XXXXXX";
    g_dir = mkdtemp(tmpl);
    setenv("GPUMIGRATE_LIBCUDA", GM_CUDA_FAKE, 1);
    setenv("GPUMIGRATE_FAKE_CUDA_DIR", g_dir.c_str(), 1);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(g_dir, ec);
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new FakeEnvironment);

class CheckpointControl : public ::testing::Test {
 protected:
  std::unique_ptr<AppProcess> StartApp(std::vector<std::pair<std::string, std::string>> env = {}) {
    const std::string progress = g_dir + "/progress." + std::to_string(++apps_);
    auto app = std::make_unique<AppProcess>(GM_CUDA_FAKE_APP, progress, env);
    EXPECT_TRUE(app->WaitReady()) << "the fake app did not start";
    return app;
  }
  // The app's published counters (the fake's state file).
  static bool Watch(int pid, const std::function<bool(const cuda::fake::SharedState&)>& pred) {
    SharedStateView view(g_dir, pid);
    return view.ok() && pred(*view.get());
  }
  // Reads `bytes` of the app's memory at `addr`: false when the pages are gone.
  static bool Readable(int pid, uint64_t addr, size_t bytes) {
    std::vector<char> buf(bytes);
    iovec local{buf.data(), bytes};
    iovec remote{reinterpret_cast<void*>(addr), bytes};
    return process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(bytes);
  }
  static CudaProcessState State(int pid) {
    auto info = QueryCudaProcess(pid);
    EXPECT_TRUE(info.ok()) << info.status().message();
    return info.ok() ? info->state : CudaProcessState::kFailed;
  }

  int apps_ = 0;
};

TEST_F(CheckpointControl, SuspendAndResumeKeepMemoryAndStopTheAppOnlyWhileSuspended) {
  auto app = StartApp();
  auto& p = app->progress();
  ASSERT_TRUE(app->WaitUntil([&] { return p.iterations.load() >= 1; }));
  auto info = QueryCudaProcess(app->pid());
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->state, CudaProcessState::kRunning);
  EXPECT_TRUE(std::filesystem::exists("/proc/" + std::to_string(app->pid()) + "/task/" +
                                      std::to_string(info->restore_tid)))
      << "the restore thread " << info->restore_tid << " is not a thread of the app";
  const uint64_t dptr = p.device_ptr.load();
  // process_vm_readv needs ptrace rights over the child (Yama's ptrace_scope < 2).
  const bool can_read = Readable(app->pid(), dptr, 4096);
  if (!can_read) std::cerr << "note: cannot read the app's memory (ptrace_scope?): page checks skipped\n";

  Status st = SuspendCudaProcess(app->pid(), milliseconds(60000));
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(State(app->pid()), CudaProcessState::kCheckpointed);
  EXPECT_TRUE(Watch(app->pid(), [](auto& s) { return s.device_used_bytes.load() == 0; }));
  if (can_read) {
    EXPECT_FALSE(Readable(app->pid(), dptr, 4096)) << "checkpointed device memory is still there";
  }
  // Its one thread reaches the gate and waits there; from then on it cannot count.
  ASSERT_TRUE(app->WaitUntil([&] { return Watch(app->pid(), [](auto& s) { return s.waiting_calls.load() > 0; }); }));
  const uint64_t frozen = p.iterations.load();
  EXPECT_EQ(State(app->pid()), CudaProcessState::kCheckpointed);
  EXPECT_EQ(p.iterations.load(), frozen);

  st = ResumeCudaProcess(app->pid());
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(State(app->pid()), CudaProcessState::kRunning);
  ASSERT_TRUE(app->WaitUntil([&] { return p.iterations.load() > frozen + 2; }));
  if (can_read) {
    EXPECT_TRUE(Readable(app->pid(), dptr, 4096));
  }
  EXPECT_EQ(p.verify_failures.load(), 0u) << "device memory changed across suspend and resume";
  EXPECT_EQ(p.failed.load(), 0u) << "a CUDA call of the app failed: " << p.last_error.load();
  EXPECT_TRUE(Watch(app->pid(), [&](auto& s) { return s.device_used_bytes.load() >= p.bytes.load(); }));
}

TEST_F(CheckpointControl, ALockTimesOutWhileTheAppIsInsideALongCallAndItStaysRunning) {
  auto app = StartApp({{"GPUMIGRATE_FAKE_CUDA_SLOW", "cuStreamSynchronize=600000"}});
  ASSERT_TRUE(app->WaitUntil(
      [&] { return Watch(app->pid(), [](auto& s) { return s.slow_calls_inside.load() > 0; }); }));
  Status st = SuspendCudaProcess(app->pid(), milliseconds(100));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.message();
  EXPECT_NE(st.message().find("cuCheckpointProcessLock failed: CUDA_ERROR_TIMEOUT"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("did not return within 100 ms); the process is RUNNING"), std::string::npos)
      << st.message();
  EXPECT_EQ(State(app->pid()), CudaProcessState::kRunning);
}

TEST_F(CheckpointControl, StepsFromTheWrongStateAreNamedWithTheStateFound) {
  auto app = StartApp();
  const int pid = app->pid();
  Status st = CudaProcessAction(pid, CudaAction::kRestore);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("cuCheckpointProcessRestore failed: CUDA_ERROR_ILLEGAL_STATE"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("it was RUNNING; it is RUNNING"), std::string::npos) << st.message();
  st = CudaProcessAction(pid, CudaAction::kUnlock);
  EXPECT_NE(st.message().find("cuCheckpointProcessUnlock failed: CUDA_ERROR_ILLEGAL_STATE"), std::string::npos)
      << st.message();
  st = CudaProcessAction(pid, CudaAction::kCheckpoint);
  EXPECT_NE(st.message().find("cuCheckpointProcessCheckpoint failed: CUDA_ERROR_ILLEGAL_STATE"), std::string::npos)
      << st.message();

  ASSERT_TRUE(CudaProcessAction(pid, CudaAction::kLock).ok());
  st = CudaProcessAction(pid, CudaAction::kLock);
  EXPECT_NE(st.message().find("it was LOCKED"), std::string::npos) << st.message();
  st = CudaProcessAction(pid, CudaAction::kRestore);
  EXPECT_NE(st.message().find("cuCheckpointProcessRestore failed: CUDA_ERROR_ILLEGAL_STATE"), std::string::npos);
  ASSERT_TRUE(CudaProcessAction(pid, CudaAction::kCheckpoint).ok());
  st = CudaProcessAction(pid, CudaAction::kUnlock);
  EXPECT_NE(st.message().find("cuCheckpointProcessUnlock failed: CUDA_ERROR_ILLEGAL_STATE"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("it was CHECKPOINTED; it is CHECKPOINTED"), std::string::npos) << st.message();
  ASSERT_TRUE(CudaProcessAction(pid, CudaAction::kRestore).ok());
  ASSERT_TRUE(CudaProcessAction(pid, CudaAction::kUnlock).ok());

  st = ResumeCudaProcess(pid);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("it is RUNNING: nothing to resume"), std::string::npos) << st.message();
  const uint64_t before = app->progress().iterations.load();
  ASSERT_TRUE(app->WaitUntil([&] { return app->progress().iterations.load() > before; }));
  EXPECT_EQ(app->progress().verify_failures.load(), 0u);
}

TEST_F(CheckpointControl, AProcessLeftLockedByAKilledControllerIsReportedAndSuspendRefuses) {
  auto app = StartApp();
  const int pid = app->pid();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t controller = fork();
  if (controller == 0) {  // a gpumigrate that locks the app and dies before checkpointing
    char ok = CudaProcessAction(pid, CudaAction::kLock).ok() ? 'y' : 'n';
    (void)!write(ready[1], &ok, 1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  kill(controller, SIGKILL);
  waitpid(controller, nullptr, 0);
  ASSERT_EQ(ok, 'y');

  EXPECT_EQ(State(pid), CudaProcessState::kLocked);
  Status st = SuspendCudaProcess(pid, milliseconds(1000));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("it is LOCKED, not RUNNING"), std::string::npos) << st.message();
  EXPECT_EQ(State(pid), CudaProcessState::kLocked) << "suspend unlocked a process it did not lock";

  ASSERT_TRUE(ResumeCudaProcess(pid).ok());  // what the operator does next
  EXPECT_EQ(State(pid), CudaProcessState::kRunning);
}

TEST_F(CheckpointControl, AFailedCheckpointIsUnlockedBackAndTheAppRunsOn) {
  auto app = StartApp();
  {
    ScopedEnv fail("GPUMIGRATE_FAKE_CUDA_FAIL", "cuCheckpointProcessCheckpoint=2");
    Status st = SuspendCudaProcess(app->pid(), milliseconds(60000));
    EXPECT_EQ(st.code(), StatusCode::kAborted);
    EXPECT_NE(st.message().find("cuCheckpointProcessCheckpoint failed: CUDA_ERROR_OUT_OF_MEMORY"),
              std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("unlocked again: the process is RUNNING"), std::string::npos) << st.message();
  }
  EXPECT_EQ(State(app->pid()), CudaProcessState::kRunning);
  const uint64_t before = app->progress().iterations.load();
  ASSERT_TRUE(app->WaitUntil([&] { return app->progress().iterations.load() > before; }));
}

TEST_F(CheckpointControl, AFailedCheckpointAndUnlockLeaveItInDoubtAndSaySo) {
  auto app = StartApp();
  {
    ScopedEnv fail("GPUMIGRATE_FAKE_CUDA_FAIL", "cuCheckpointProcessCheckpoint=2,cuCheckpointProcessUnlock=999");
    Status st = SuspendCudaProcess(app->pid(), milliseconds(60000));
    EXPECT_EQ(st.code(), StatusCode::kInDoubt);
    EXPECT_NE(st.message().find("cuCheckpointProcessUnlock failed: CUDA_ERROR_UNKNOWN"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("the process is LOCKED"), std::string::npos) << st.message();
  }
  ASSERT_TRUE(ResumeCudaProcess(app->pid()).ok());
  EXPECT_EQ(State(app->pid()), CudaProcessState::kRunning);
}

TEST_F(CheckpointControl, ProcessesWithoutCudaAreNamed) {
  auto self = QueryCudaProcess(getpid());  // this process never called cuInit
  EXPECT_EQ(self.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(self.status().message().find("knows no CUDA state in it"), std::string::npos)
      << self.status().message();
  EXPECT_NE(self.status().message().find("cuCheckpointProcessGetState failed: CUDA_ERROR_INVALID_VALUE"),
            std::string::npos);

  auto app = StartApp();  // killed: its state file stays behind, its pid is gone
  const int pid = app->pid();
  app->Kill();
  Status st = SuspendCudaProcess(pid, milliseconds(1000));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_EQ(QueryCudaProcess(-3).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CheckpointControl, ADriverWithoutTheCheckpointApiIsNamed) {
  ScopedEnv old("GPUMIGRATE_LIBCUDA", GM_CUDA_FAKE_OLD);
  auto info = QueryCudaProcess(getpid());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(info.status().message().find("lacks cuCheckpointProcessGetState"), std::string::npos)
      << info.status().message();
  ScopedEnv none("GPUMIGRATE_LIBCUDA", "/nonexistent/libcuda.so.1");
  EXPECT_EQ(ResumeCudaProcess(getpid()).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace gpumigrate
