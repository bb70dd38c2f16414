#include "engine/devices/proc/process_state.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <string>

#include <fmt/format.h>

namespace gpumigrate {

bool ProcessExited(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold one).
  const size_t close_paren = line.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < line.size() &&
         (line[close_paren + 2] == 'Z' || line[close_paren + 2] == 'X');
}

}  // namespace gpumigrate
