#include "cli/crash_hook.h"

#include <signal.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "cli/print.h"

namespace gpumigrate::cli {

namespace {

struct At {
  std::string phase;
  std::optional<uint32_t> round;
  bool Matches(Phase p, uint32_t r) const { return PhaseName(p) == phase && (!round || *round == r); }
};

At ParseAt(const std::string& spec) {
  At at{spec, std::nullopt};
  if (size_t colon = spec.find(':'); colon != std::string::npos) {
    at.phase = spec.substr(0, colon);
    uint32_t n = 0;
    std::from_chars(spec.data() + colon + 1, spec.data() + spec.size(), n);
    at.round = n;
  }
  return at;
}

std::function<void(Phase, uint32_t)> WithSignalHook(std::function<void(Phase, uint32_t)> next) {
  const char* env = std::getenv("GPUMIGRATE_TEST_SIGNAL_AT");
  if (env == nullptr || *env == '\0') return next;
  std::string spec(env);
  const size_t atsign = spec.rfind('@');
  int pid = 0;
  if (atsign != std::string::npos) {
    std::from_chars(spec.data() + atsign + 1, spec.data() + spec.size(), pid);
  }
  if (pid <= 0) {
    Print(stderr, "GPUMIGRATE_TEST_SIGNAL_AT='{}' is not PHASE[:ROUND]@PID: ignored\n", spec);
    return next;
  }
  auto fired = std::make_shared<bool>(false);
  return [next = std::move(next), at = ParseAt(spec.substr(0, atsign)), pid, fired](Phase p, uint32_t r) {
    if (next) next(p, r);
    if (*fired || !at.Matches(p, r)) return;
    *fired = true;
    Print(stderr, "GPUMIGRATE_TEST_SIGNAL_AT: SIGUSR1 to {} at {} (round {})\n", pid, at.phase, r);
    ::kill(pid, SIGUSR1);
    // The fault takes hold before we go on: the proxy says so by creating the
    // file GPUMIGRATE_TEST_SIGNAL_ARMED names (a loaded machine can take far
    // longer than any fixed wait); without it, 100 ms.
    const char* armed = std::getenv("GPUMIGRATE_TEST_SIGNAL_ARMED");
    if (armed == nullptr || *armed == '\0') {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (::access(armed, F_OK) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        Print(stderr, "GPUMIGRATE_TEST_SIGNAL_AT: {} did not appear within 10 s: going on\n", armed);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
}

}  // namespace

std::function<void(Phase, uint32_t)> WithCrashHook(std::function<void(Phase, uint32_t)> next) {
  next = WithSignalHook(std::move(next));
  const char* env = std::getenv("GPUMIGRATE_TEST_CRASH_AT");
  if (env == nullptr || *env == '\0') return next;
  const At at = ParseAt(env);
  return [next = std::move(next), at](Phase p, uint32_t r) {
    if (next) next(p, r);
    if (at.Matches(p, r)) {
      Print(stderr, "GPUMIGRATE_TEST_CRASH_AT: killing this process at {} (round {})\n", at.phase, r);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  };
}

}  // namespace gpumigrate::cli
