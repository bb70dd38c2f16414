// A test hook: `GPUMIGRATE_TEST_CRASH_AT=PHASE[:ROUND]` makes this process kill
// itself with SIGKILL the moment the session enters PHASE (a PhaseName such as
// `round-end`, `prepared-sent`; with ROUND, only in that round). End-to-end tests
// use it to have a real peer die at an exact point of the protocol, which no
// timing from outside can hit. Unset (always, outside tests), it does nothing.
#pragma once

#include <cstdint>
#include <functional>

#include "gpumigrate/session.h"

namespace gpumigrate::cli {

// Wraps `next` (may be empty) with the crash check when the variable is set.
std::function<void(Phase, uint32_t)> WithCrashHook(std::function<void(Phase, uint32_t)> next);

}  // namespace gpumigrate::cli
