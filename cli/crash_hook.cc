#include "cli/crash_hook.h"

#include <charconv>
#include <csignal>
#include <cstdlib>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "cli/print.h"

namespace gpumigrate::cli {

std::function<void(Phase, uint32_t)> WithCrashHook(std::function<void(Phase, uint32_t)> next) {
  const char* env = std::getenv("GPUMIGRATE_TEST_CRASH_AT");
  if (env == nullptr || *env == '\0') return next;
  std::string spec(env), phase = spec;
  std::optional<uint32_t> round;
  if (size_t colon = spec.find(':'); colon != std::string::npos) {
    phase = spec.substr(0, colon);
    uint32_t n = 0;
    std::from_chars(spec.data() + colon + 1, spec.data() + spec.size(), n);
    round = n;
  }
  return [next = std::move(next), phase, round](Phase p, uint32_t r) {
    if (next) next(p, r);
    if (PhaseName(p) == phase && (!round || *round == r)) {
      Print(stderr, "GPUMIGRATE_TEST_CRASH_AT: killing this process at {} (round {})\n", phase, r);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  };
}

}  // namespace gpumigrate::cli
