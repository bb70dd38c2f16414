// Suspend and resume (include/gpumigrate/devices/cuda_checkpoint.h) of real processes
// running against the driver double: tests/support/cuda/fake_app.cc is the CUDA
// process, this test the controller, and the fake's state file in a private
// folder joins them.
#include "gpumigrate/devices/cuda_checkpoint.h"

#include <sys/file.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <iostream>
#include <thread>

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
    const char* dir = mkdtemp(tmpl);
    ASSERT_NE(dir, nullptr) << "mkdtemp: " << std::strerror(errno);
    g_dir = dir;
    setenv("GPUMIGRATE_LIBCUDA", GM_CUDA_FAKE, 1);
    setenv("GPUMIGRATE_FAKE_CUDA_DIR", g_dir.c_str(), 1);
  }
  void TearDown() override {
    if (g_dir.empty()) return;
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

  // Runs `fn` on a thread: false when it has not returned within `guard` (a
  // limit against a hang, not a measurement); then `unstick` is called so that
  // the thread can finish, and it is joined either way.
  static bool ReturnsWithin(const std::function<void()>& fn, std::chrono::seconds guard,
                            const std::function<void()>& unstick) {
    std::promise<void> done;
    auto finished = done.get_future();
    std::thread t([&] {
      fn();
      done.set_value();
    });
    const bool in_time = finished.wait_for(guard) == std::future_status::ready;
    if (!in_time) unstick();
    t.join();
    return in_time;
  }
  // Writes `state` into the app's published state, as a newer driver would
  // report it (the app's gate republishes only when its own state changes).
  static void ForceState(int pid, int32_t state) {
    SharedStateView view(g_dir, pid);
    ASSERT_TRUE(view.ok());
    view.get()->state.store(state);
  }

  int apps_ = 0;
};

// A process without CUDA: a child that only sleeps (this test process is a CUDA
// process too once the controller has called cuInit).
class NonCudaChild {
 public:
  NonCudaChild() {
    pid_ = fork();
    if (pid_ == 0) {
      for (;;) pause();
    }
  }
  ~NonCudaChild() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  int pid() const { return pid_; }

 private:
  pid_t pid_;
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
  // Time for the app to count, were it not stopped (it loops in well under a
  // millisecond); a stopped app passes however long this is.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(State(app->pid()), CudaProcessState::kCheckpointed);
  EXPECT_EQ(p.iterations.load(), frozen) << "the app counted while CHECKPOINTED";

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
  NonCudaChild plain;  // never called cuInit
  auto self = QueryCudaProcess(plain.pid());
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

// A controller SIGKILLed after posting its request (request_seq bumped) but
// before waking the target left the target's service asleep: the next
// controller must still get its answer, not wait for ever.
TEST_F(CheckpointControl, ARequestPostedWithoutAWakeupDoesNotHangTheNextController) {
  auto app = StartApp();
  const int pid = app->pid();
  {
    SharedStateView view(g_dir, pid);
    ASSERT_TRUE(view.ok());
    view.get()->op.store(static_cast<uint32_t>(cuda::fake::Op::kNone));
    view.get()->request_seq.fetch_add(1);  // and no FutexWakeAll: the controller died here
  }
  Status st;
  const bool returned = ReturnsWithin([&] { st = CudaProcessAction(pid, CudaAction::kLock); },
                                      std::chrono::seconds(20), [&] {
                                        SharedStateView view(g_dir, pid);
                                        if (view.ok()) cuda::fake::FutexWakeAll(&view.get()->request_seq);
                                      });
  EXPECT_TRUE(returned) << "a controller hung behind a request whose poster died before waking the target";
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(State(pid), CudaProcessState::kLocked);
  ASSERT_TRUE(ResumeCudaProcess(pid).ok());
  const uint64_t before = app->progress().iterations.load();
  ASSERT_TRUE(app->WaitUntil([&] { return app->progress().iterations.load() > before; }));
}

// --timeout bounds the whole lock, also the wait behind another controller that
// holds the target's request slot.
TEST_F(CheckpointControl, ALockQueuedBehindAnotherControllerKeepsItsTimeout) {
  auto app = StartApp();
  const int pid = app->pid();
  SharedStateView other(g_dir, pid);  // another controller, in the middle of a request
  ASSERT_TRUE(other.ok());
  ASSERT_EQ(flock(other.fd(), LOCK_EX), 0);
  Status st;
  const bool returned = ReturnsWithin([&] { st = SuspendCudaProcess(pid, milliseconds(200)); },
                                      std::chrono::seconds(20), [&] { flock(other.fd(), LOCK_UN); });
  flock(other.fd(), LOCK_UN);
  EXPECT_TRUE(returned) << "suspend --timeout 200ms waited for ever behind another controller";
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.message();
  EXPECT_NE(st.message().find("CUDA_ERROR_TIMEOUT"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("the process is RUNNING"), std::string::npos) << st.message();
  EXPECT_EQ(State(pid), CudaProcessState::kRunning);
}

// The checkpoint fails inside the target (its own environment injects it):
// nothing is released, the process stays LOCKED, suspend unlocks it back and the
// app runs on with its memory intact.
TEST_F(CheckpointControl, ACheckpointFailingInTheTargetReleasesNothingAndIsUnlockedBack) {
  auto app = StartApp({{"GPUMIGRATE_FAKE_CUDA_FAIL", "cuCheckpointProcessCheckpoint=2"}});
  const int pid = app->pid();
  auto& p = app->progress();
  const uint64_t bytes = p.bytes.load();

  ASSERT_TRUE(CudaProcessAction(pid, CudaAction::kLock).ok());
  Status st = CudaProcessAction(pid, CudaAction::kCheckpoint);
  EXPECT_NE(st.message().find("cuCheckpointProcessCheckpoint failed: CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
      << st.message();
  EXPECT_EQ(State(pid), CudaProcessState::kLocked);
  EXPECT_TRUE(Watch(pid, [&](auto& s) { return s.device_used_bytes.load() >= bytes; })) << "memory was released";
  ASSERT_TRUE(CudaProcessAction(pid, CudaAction::kUnlock).ok());

  st = SuspendCudaProcess(pid, milliseconds(60000));
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.message();
  EXPECT_NE(st.message().find("unlocked again: the process is RUNNING"), std::string::npos) << st.message();
  EXPECT_EQ(State(pid), CudaProcessState::kRunning);
  EXPECT_TRUE(Watch(pid, [&](auto& s) { return s.device_used_bytes.load() >= bytes; }));
  const uint64_t before = p.iterations.load();
  ASSERT_TRUE(app->WaitUntil([&] { return p.iterations.load() > before + 2; }));
  EXPECT_EQ(p.verify_failures.load(), 0u) << "device memory changed";
  EXPECT_EQ(p.failed.load(), 0u) << "a CUDA call of the app failed: " << p.last_error.load();
}

// The controller initialises the driver itself (the fake's Restore refuses a
// process that has not, as the documentation says the driver may); a restore
// still refused that way names persistence mode.
TEST_F(CheckpointControl, RestoreNotInitializedNamesPersistenceMode) {
  auto app = StartApp();
  const int pid = app->pid();
  ASSERT_TRUE(SuspendCudaProcess(pid, milliseconds(60000)).ok());
  {
    ScopedEnv fail("GPUMIGRATE_FAKE_CUDA_FAIL", "cuCheckpointProcessRestore=3");
    Status st = ResumeCudaProcess(pid);
    EXPECT_EQ(st.code(), StatusCode::kInDoubt) << st.message();
    EXPECT_NE(st.message().find("cuCheckpointProcessRestore failed: CUDA_ERROR_NOT_INITIALIZED"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("enable persistence mode (nvidia-smi -pm 1)"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("the process is CHECKPOINTED"), std::string::npos) << st.message();
  }
  Status st = ResumeCudaProcess(pid);  // cuInit was called: the fake restores
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(State(pid), CudaProcessState::kRunning);
}

// Only CUDA_ERROR_INVALID_VALUE from GetState means "no CUDA in it"; other
// errors keep their own code and words.
TEST_F(CheckpointControl, GetStateErrorsOtherThanInvalidValueKeepTheirCode) {
  auto app = StartApp();
  {
    ScopedEnv fail("GPUMIGRATE_FAKE_CUDA_FAIL", "cuCheckpointProcessGetState=801");
    auto info = QueryCudaProcess(app->pid());
    EXPECT_EQ(info.status().code(), StatusCode::kUnimplemented) << info.status().message();
    EXPECT_NE(info.status().message().find("cuCheckpointProcessGetState failed: CUDA_ERROR_NOT_SUPPORTED"),
              std::string::npos)
        << info.status().message();
    EXPECT_EQ(info.status().message().find("knows no CUDA state"), std::string::npos) << info.status().message();
  }
  {
    ScopedEnv fail("GPUMIGRATE_FAKE_CUDA_FAIL", "cuCheckpointProcessGetState=3");
    Status st = SuspendCudaProcess(app->pid(), milliseconds(1000));
    EXPECT_NE(st.code(), StatusCode::kInvalidArgument) << st.message();
    EXPECT_NE(st.message().find("CUDA_ERROR_NOT_INITIALIZED"), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find("knows no CUDA state"), std::string::npos) << st.message();
  }
  EXPECT_EQ(State(app->pid()), CudaProcessState::kRunning);
}

// A failing cuInit in the controller is named.
TEST_F(CheckpointControl, AFailingCuInitIsNamed) {
  auto app = StartApp();
  ScopedEnv fail("GPUMIGRATE_FAKE_CUDA_FAIL", "cuInit=100");
  auto info = QueryCudaProcess(app->pid());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable) << info.status().message();
  EXPECT_NE(info.status().message().find("cuInit failed: CUDA_ERROR_NO_DEVICE"), std::string::npos)
      << info.status().message();
}

// CUDA 13's CHECKPOINTING (4) and RESTORING (5): named, and neither suspend nor
// resume acts on a process in them.
TEST_F(CheckpointControl, CheckpointingAndRestoringAreNamedAndLeftAlone) {
  auto app = StartApp();
  const int pid = app->pid();
  for (const auto& [value, name] : {std::pair{4, "CHECKPOINTING"}, std::pair{5, "RESTORING"}}) {
    ForceState(pid, value);
    auto info = QueryCudaProcess(pid);
    ASSERT_TRUE(info.ok()) << info.status().message();
    EXPECT_EQ(CudaProcessStateName(info->state), name);
    Status st = SuspendCudaProcess(pid, milliseconds(1000));
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.message();
    EXPECT_NE(st.message().find(std::string("it is ") + name + ": a checkpoint or restore is in progress"),
              std::string::npos)
        << st.message();
    st = ResumeCudaProcess(pid);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.message();
    EXPECT_NE(st.message().find("in progress"), std::string::npos) << st.message();
  }
  ForceState(pid, 0);
  EXPECT_EQ(State(pid), CudaProcessState::kRunning) << "suspend or resume acted on a process in progress";
}

// Another controller locks the process between our state query (RUNNING) and
// our lock: that is a refusal (it holds the process now), not "in doubt".
TEST_F(CheckpointControl, ALockLostToAnotherControllerIsARefusalNotInDoubt) {
  auto app = StartApp();
  const int pid = app->pid();
  SharedStateView other(g_dir, pid);  // the other controller: it holds the request slot
  ASSERT_TRUE(other.ok());
  ASSERT_EQ(flock(other.fd(), LOCK_EX), 0);
  Status st;
  std::thread suspend([&] { st = SuspendCudaProcess(pid, milliseconds(30000)); });
  // Suspend reads RUNNING at once, then waits for the slot. (Were this thread
  // late, suspend would find LOCKED first and refuse with other words.)
  std::this_thread::sleep_for(milliseconds(300));
  cuda::fake::SharedState* s = other.get();
  s->op.store(static_cast<uint32_t>(cuda::fake::Op::kLock));
  s->arg.store(0);
  const uint32_t seq = s->request_seq.fetch_add(1) + 1;
  cuda::fake::FutexWakeAll(&s->request_seq);
  while (s->response_seq.load() != seq) cuda::fake::FutexWait(&s->response_seq, s->response_seq.load(), 50);
  ASSERT_EQ(s->result.load(), 0);
  flock(other.fd(), LOCK_UN);
  suspend.join();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.message();
  EXPECT_NE(st.message().find("held by another controller"), std::string::npos) << st.message();
  EXPECT_EQ(State(pid), CudaProcessState::kLocked) << "suspend touched a process another controller holds";
  ASSERT_TRUE(ResumeCudaProcess(pid).ok());
}

}  // namespace
}  // namespace gpumigrate
