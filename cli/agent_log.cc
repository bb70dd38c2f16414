#include "cli/agent_log.h"

#include <sys/stat.h>
#include <systemd/sd-journal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "cli/print.h"

namespace gpumigrate::cli {

bool JournalStreamIs(const char* journal_stream, int fd) {
  if (journal_stream == nullptr) return false;
  unsigned long long dev = 0, ino = 0;
  if (std::sscanf(journal_stream, "%llu:%llu", &dev, &ino) != 2) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == dev && static_cast<unsigned long long>(st.st_ino) == ino;
}

AgentLog::AgentLog() : journal_(JournalStreamIs(std::getenv("JOURNAL_STREAM"), STDERR_FILENO)) {}

void AgentLog::Line(int priority, const std::string& message,
                    const std::vector<std::pair<std::string, std::string>>& fields) {
  if (!journal_) {
    Print(stderr, "gpumigrate agent: {}\n", message);
    return;
  }
  std::vector<std::string> parts = {"MESSAGE=" + message, fmt::format("PRIORITY={}", priority),
                                    "SYSLOG_IDENTIFIER=gpumigrate-agent"};
  for (const auto& [k, v] : fields) parts.push_back(k + "=" + v);
  std::vector<iovec> iov;
  for (auto& p : parts) iov.push_back({p.data(), p.size()});
  if (sd_journal_sendv(iov.data(), static_cast<int>(iov.size())) < 0) {
    Print(stderr, "gpumigrate agent: {}\n", message);  // the journal refused it: stderr still reaches it
  }
}

void AgentLog::JobEvent(const nlohmann::ordered_json& e) {
  const std::string phase = e.value("phase", "");
  const int priority = phase == "failed" || phase == "in-doubt" || phase == "lost" ? 4 : 6;
  Line(priority, e.value("message", ""),
       {{"GPUMIGRATE_VM", e.value("vm", "")},
        {"GPUMIGRATE_JOB", std::to_string(e.value("job", int64_t{0}))},
        {"GPUMIGRATE_KIND", e.value("kind", "")},
        {"GPUMIGRATE_PHASE", phase}});
}

}  // namespace gpumigrate::cli
