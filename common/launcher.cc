// The process launcher: each child runs under a /bin/sh of its own session that
// redirects its output to the job's files and, once it exits, writes its exit
// status to the job's rc file (through a rename, so a reader never sees half of
// it). The shell, not the agent, waits for the child: an agent killed or
// restarted leaves the child running and still learns how it ended.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/common/launcher.h"

extern char** environ;

namespace gpumigrate {
namespace {

// Field 22 of /proc/PID/stat (start time in clock ticks since boot) tells a
// reused process id apart; "" when the process is gone. Sets *zombie.
std::string StartTime(int64_t pid, bool* zombie) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat;
  if (!std::getline(in, stat)) return "";
  const size_t close = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return "";
  std::istringstream rest(stat.substr(close + 2));
  std::string field, state;
  rest >> state;
  *zombie = state == "Z";
  for (int i = 4; i <= 22 && rest >> field; ++i) {
  }
  return field;
}

// The shell forwards SIGTERM (the agent's Kill) to the child and waits on: a
// trapped signal interrupts `wait`, so it waits again while the child exists
// (a zombie still answers kill -0 until that wait reaps it). The first `wait`
// is unconditional: dash may reap a child that exits at once before the loop's
// first `kill -0`, and only `wait` still knows its status (without it, 2 of 3
// such jobs were recorded as exit 127).
constexpr const char* kWrapper =
    "out=$1; err=$2; rc=$3; shift 3; c=; trap '[ -n \"$c\" ] && kill -TERM $c 2>/dev/null' TERM; "
    "\"$@\" >\"$out\" 2>\"$err\" </dev/null & c=$!; wait $c; s=$?; "
    "while kill -0 $c 2>/dev/null; do wait $c; s=$?; done; "
    "echo $s >\"$rc.tmp\"; mv -f \"$rc.tmp\" \"$rc\"";

class ProcessLauncher : public Launcher {
 public:
  Result<Started> Start(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
                        const std::string& rc) override {
    std::vector<std::string> args = {"/bin/sh", "-c", kWrapper, "gpumigrate-agent-job", out, err, rc};
    args.insert(args.end(), argv.begin(), argv.end());
    std::vector<char*> cargs;
    for (auto& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);  // SIGPIPE ignored by the agent is not inherited
    pid_t pid = 0;
    const int e = posix_spawn(&pid, "/bin/sh", nullptr, &attr, cargs.data(), environ);
    posix_spawnattr_destroy(&attr);
    if (e != 0) return Unavailable(fmt::format("cannot start {}: {}", argv.empty() ? "" : argv[0], std::strerror(e)));
    bool zombie = false;
    return Started{pid, StartTime(pid, &zombie)};
  }

  bool Alive(int64_t id, const std::string& token) override {
    bool zombie = false;
    const std::string now = StartTime(id, &zombie);
    if (now.empty() || now != token) return false;
    if (zombie) {
      int status = 0;
      waitpid(static_cast<pid_t>(id), &status, WNOHANG);  // ours: reap it
      return false;
    }
    return true;
  }

  // The agent's only children are these shells: whatever has exited is one.
  void Reap() override {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }

  void Kill(int64_t id, const std::string& token) override {
    if (Alive(id, token)) ::kill(static_cast<pid_t>(id), SIGTERM);  // the shell, which passes it on
  }
};

}  // namespace

std::unique_ptr<Launcher> MakeProcessLauncher() { return std::make_unique<ProcessLauncher>(); }

int AwaitExit(Launcher& launcher, const Launcher::Started& child, const std::string& rc,
              std::chrono::milliseconds limit) {
  auto ended_within = [&](std::chrono::milliseconds wait) {
    const auto until = std::chrono::steady_clock::now() + wait;
    while (launcher.Alive(child.id, child.token)) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  };
  if (!ended_within(limit)) {
    launcher.Kill(child.id, child.token);
    ended_within(std::chrono::seconds(10));
    return -1;
  }
  int status = -1;
  std::ifstream in(rc);
  if (!(in >> status)) return -1;
  return status;
}

}  // namespace gpumigrate
