// Runs tests/support/cuda/fake_app.cc as a child process for a test and reads
// its progress (fake_app.h). The child gets the test's environment plus the
// given variables; it is killed and reaped when the AppProcess goes.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/cuda/fake_app.h"

extern char** environ;

namespace gpumigrate::cuda::testing {

class AppProcess {
 public:
  AppProcess(const std::string& app, const std::string& progress_path,
             const std::vector<std::pair<std::string, std::string>>& env) {
    progress_ = MapProgress(progress_path, true);
    if (progress_ == nullptr) {  // no app: progress() reads a blank record, WaitReady fails
      progress_ = &unmapped_;
      reaped_ = true;
      return;
    }
    std::vector<std::string> vars;
    for (char** e = environ; *e != nullptr; ++e) vars.emplace_back(*e);
    for (const auto& [k, v] : env) vars.push_back(k + "=" + v);
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> envp;
      for (auto& v : vars) envp.push_back(v.data());
      envp.push_back(nullptr);
      std::string a0 = app, a1 = progress_path;
      char* argv[] = {a0.data(), a1.data(), nullptr};
      execve(app.c_str(), argv, envp.data());
      _exit(127);
    }
  }
  ~AppProcess() { Kill(); }
  AppProcess(const AppProcess&) = delete;
  AppProcess& operator=(const AppProcess&) = delete;

  int pid() const { return pid_; }
  AppProgress& progress() const { return *progress_; }
  bool Exited() {
    if (reaped_ || pid_ <= 0) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) reaped_ = true;
    return reaped_;
  }

  // Waits until pred() holds; false when the app exited first or `guard` passed
  // (a limit against a hang, not a measurement: nothing depends on how long).
  bool WaitUntil(const std::function<bool()>& pred, std::chrono::seconds guard = std::chrono::seconds(60)) {
    const auto end = std::chrono::steady_clock::now() + guard;
    while (!pred()) {
      if (Exited() || std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  bool WaitReady() { return pid_ > 0 && WaitUntil([&] { return progress_->ready.load() == 1; }); }

  void Kill() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      reaped_ = true;
    }
  }

 private:
  AppProgress unmapped_{};  // when the progress file cannot be mapped
  AppProgress* progress_ = nullptr;
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace gpumigrate::cuda::testing
