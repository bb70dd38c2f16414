// Where `gpumigrate agent` logs: its stderr, or, when systemd connected that
// stderr to the journal (JOURNAL_STREAM names it: "DEV:INODE" of the stream,
// systemd.exec(5)), the journal itself through libsystemd's sd_journal_send,
// with structured fields: SYSLOG_IDENTIFIER=gpumigrate-agent, PRIORITY, and
// for a job's events GPUMIGRATE_VM, GPUMIGRATE_JOB, GPUMIGRATE_KIND and
// GPUMIGRATE_PHASE (journalctl GPUMIGRATE_VM=llm-1 follows one VM).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpumigrate::cli {

class AgentLog {
 public:
  AgentLog();
  bool to_journal() const { return journal_; }
  // priority: syslog's (3 error, 4 warning, 6 info).
  void Line(int priority, const std::string& message,
            const std::vector<std::pair<std::string, std::string>>& fields = {});
  // An Agent's on_job_event: its message, with the job's fields.
  void JobEvent(const nlohmann::ordered_json& event);

 private:
  bool journal_ = false;
};

// Whether JOURNAL_STREAM ("DEV:INODE", as systemd sets it) names the file open on fd.
bool JournalStreamIs(const char* journal_stream, int fd);

}  // namespace gpumigrate::cli
