// How gpumigrate starts and watches child processes: the agent's jobs (each
// migration a `gpumigrate migrate|receive` child) and the path calibration's
// test migrations (engine/estimator/path_runner.cc). A seam: the real one runs
// processes; tests substitute their own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

class Launcher {
 public:
  virtual ~Launcher() = default;
  // Runs argv with stdout in `out`, stderr in `err`, and, once it exits, its exit
  // status written to `rc` (the file outlives the launcher). Returns an id
  // (the process id of the shell that waits for it, for the real launcher) and
  // a token that tells a reused id apart.
  struct Started {
    int64_t id = 0;
    std::string token;
  };
  virtual Result<Started> Start(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
                                const std::string& rc) = 0;
  // Whether the child with this id and token still runs.
  virtual bool Alive(int64_t id, const std::string& token) = 0;
  // Asks it to end (SIGTERM for the real launcher: a migration rolls back).
  virtual void Kill(int64_t id, const std::string& token) = 0;
  // Collects children that have exited (the real launcher's zombie shells).
  virtual void Reap() {}
};

// Children in a session of their own (an agent killed or restarted leaves them
// running); `rc` is written by a /bin/sh that waits for the child.
std::unique_ptr<Launcher> MakeProcessLauncher();

// Waits up to `limit` for a started child to end and returns its exit status
// (from `rc`); one still running then is killed and, once it has ended (at
// most 10 s more), -1 is returned, as for one that left no status.
int AwaitExit(Launcher& launcher, const Launcher::Started& child, const std::string& rc,
              std::chrono::milliseconds limit);

}  // namespace gpumigrate
