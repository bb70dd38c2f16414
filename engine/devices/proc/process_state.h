// Whether a process the proc backend works with has exited.
#pragma once

#include <sys/types.h>

namespace gpumigrate {

// True when `pid` is gone, or is a zombie nobody has reaped yet (kill(pid, 0)
// still succeeds on one, so it alone calls a killed process alive).
bool ProcessExited(pid_t pid);

}  // namespace gpumigrate
