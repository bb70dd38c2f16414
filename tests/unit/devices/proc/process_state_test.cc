// ProcessExited: a killed process is exited as soon as it is a zombie, before
// anyone reaps it (the proc backend names a lost shim by this).
#include "engine/devices/proc/process_state.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

TEST(ProcessState, ALiveProcessHasNotExited) { EXPECT_FALSE(ProcessExited(getpid())); }

TEST(ProcessState, AnUnreapedZombieHasExited) {
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  // Not reaped: the child stays a zombie, which kill(pid, 0) still finds.
  bool exited = false;
  for (int i = 0; i < 200 && !exited; ++i) {
    exited = ProcessExited(child);
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(kill(child, 0), 0) << "a zombie is still there for kill(pid, 0)";
  EXPECT_TRUE(exited);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_TRUE(ProcessExited(child)) << "reaped: gone";
}

}  // namespace
}  // namespace gpumigrate
