// A test hook: `GPUMIGRATE_TEST_CRASH_AT=PHASE[:ROUND]` makes this process kill
// itself with SIGKILL the moment the session enters PHASE (a PhaseName such as
// `round-end`, `prepared-sent`; with ROUND, only in that round). End-to-end tests
// use it to have a real peer die at an exact point of the protocol, which no
// timing from outside can hit. `GPUMIGRATE_TEST_SIGNAL_AT=PHASE[:ROUND]@PID`
// instead sends SIGUSR1 to PID once, at that phase, and waits until the file
// `GPUMIGRATE_TEST_SIGNAL_ARMED` names exists (at most 10 s; unset: 100 ms): the
// fault proxy (tests/support/fault_proxy.py --trigger-signal --armed-file) starts
// its fault then and creates the file once it has.
// Unset (always, outside tests), they do nothing.
#pragma once

#include <cstdint>
#include <functional>

#include "gpumigrate/session/session.h"

namespace gpumigrate::cli {

// Wraps `next` (may be empty) with the signal and crash checks when their variables are set.
std::function<void(Phase, uint32_t)> WithCrashHook(std::function<void(Phase, uint32_t)> next);

}  // namespace gpumigrate::cli
