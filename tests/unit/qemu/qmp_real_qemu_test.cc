// QmpClient against a real qemu-system-x86_64 (no guest: -machine none), to
// hold the client to what QEMU really sends. Skips when QEMU is not on PATH.
// QEMU is killed on every path out of the test (QemuProcess's destructor).
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gpumigrate/qemu/qmp.h"

extern char** environ;

namespace gpumigrate {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

std::string FindOnPath(const std::string& name) {
  const char* path = getenv("PATH");
  std::string dirs = path ? path : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + name;
    if (end > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// A QEMU child; SIGKILLed and reaped unless it has exited by itself.
class QemuProcess {
 public:
  ~QemuProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool Start(const std::vector<std::string>& argv) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    return posix_spawn(&pid_, args[0], nullptr, nullptr, args.data(), environ) == 0;
  }
  // True when QEMU exited within `timeout`.
  bool WaitExit(milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return true;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
};

struct TempDir {
  std::filesystem::path path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

TEST(QmpRealQemu, HandshakeQueriesCapabilitiesErrorsAndQuit) {
  std::string qemu = FindOnPath("qemu-system-x86_64");
  if (qemu.empty()) GTEST_SKIP() << "qemu-system-x86_64 is not on PATH";
  char dir_template[] = "/tmp/gm-qmp-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  TempDir tmp{dir_template};
  const std::filesystem::path& dir = tmp.path;
  std::string sock = (dir / "qmp.sock").string();
  QemuProcess proc;
  ASSERT_TRUE(proc.Start({qemu, "-machine", "none", "-nodefaults", "-display", "none", "-qmp",
                          "unix:" + sock + ",server=on,wait=off"}));
  QmpOptions o;
  o.connect_timeout = milliseconds(10000);  // QEMU starting on a busy machine
  auto client = QmpClient::Connect(sock, o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  QmpClient& c = **client;
  EXPECT_GE(c.version().major, 7);

  constexpr milliseconds kT{5000};
  auto st = c.QueryStatus(kT);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_FALSE(st->status.empty());

  Status caps = c.SetMigrationCapabilities(
      {{"events", true}, {"return-path", true}, {"x-ignore-shared", true}, {"pause-before-switchover", true}}, kT);
  EXPECT_TRUE(caps.ok()) << caps.ToString();
  auto shown = c.Execute("query-migrate-capabilities", nullptr, kT);
  ASSERT_TRUE(shown.ok()) << shown.status().ToString();
  int on = 0;
  for (const auto& cap : *shown) {
    if (cap.value("state", false)) ++on;
  }
  EXPECT_EQ(on, 4) << shown->dump();

  auto mig = c.QueryMigrate(kT);
  ASSERT_TRUE(mig.ok()) << mig.status().ToString();
  EXPECT_TRUE(!mig->contains("status") || (*mig)["status"] == "none") << mig->dump();

  auto unknown = c.Execute("gm-no-such-command", nullptr, kT);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(c.last_error_class(), "CommandNotFound");
  EXPECT_NE(unknown.status().message().find("gm-no-such-command"), std::string::npos);

  auto hmp = c.HumanMonitorCommand("info status", kT);
  ASSERT_TRUE(hmp.ok()) << hmp.status().ToString();
  EXPECT_NE(hmp->find("VM status"), std::string::npos) << *hmp;

  // One QMP client per socket: a second one gets no greeting while we are connected.
  QmpOptions brief = o;
  brief.connect_timeout = milliseconds(300);
  auto second = QmpClient::Connect(sock, brief);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kDeadlineExceeded) << second.status().ToString();
  EXPECT_NE(second.status().message().find("one QMP client per socket"), std::string::npos);
  // Ours can close and come back, and QEMU has kept the capabilities.
  Status again = c.Reconnect();
  ASSERT_TRUE(again.ok()) << again.ToString();
  auto kept = c.Execute("query-migrate-capabilities", nullptr, kT);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, *shown);

  auto quit = c.Execute("quit", nullptr, kT);
  EXPECT_TRUE(quit.ok() || quit.status().code() == StatusCode::kUnavailable) << quit.status().ToString();
  EXPECT_TRUE(proc.WaitExit(milliseconds(5000)));
  auto after = c.Execute("query-status", nullptr, milliseconds(1000));
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable) << after.status().ToString();
}

}  // namespace
}  // namespace gpumigrate
