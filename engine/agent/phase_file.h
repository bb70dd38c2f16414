// --phase-file: where a migration's process keeps its live state for the agent
// that started it (the agent reports it in `status` and on /metrics; an
// evacuation's controller paces by the phase). One JSON object, replaced whole
// (write, then rename): {"phase", "round"} and, from the source's progress,
// "bytes_sent", "bytes_per_s" (over the last second), "round_bytes_total" (the
// dirty set a round considers) and "round_bytes_done"; from the destination's,
// "bytes_applied" and "bytes_per_s". Best effort: a file that
// cannot be written leaves the agent its clock. The writer and the agent that
// reads it (agent.cc, status) are one layer: one home for the format.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "gpumigrate/session/session.h"

namespace gpumigrate::agent {

class PhaseFile {
 public:
  // applied: the destination's file, whose progress counts bytes applied
  // ("bytes_applied", its rate "bytes_per_s") rather than sent.
  explicit PhaseFile(std::string path, bool applied = false) : path_(std::move(path)), applied_(applied) {}
  void OnPhase(Phase p, uint32_t round);
  void OnProgress(const Progress& p);
  std::string Text() const;  // what the file holds now

 private:
  void Write();
  std::string path_;
  bool applied_;
  mutable std::mutex mu_;
  std::optional<Phase> phase_;
  uint32_t round_ = 0;
  std::optional<Progress> progress_;
  std::deque<std::pair<double, uint64_t>> window_;  // (elapsed_s, bytes_sent) over the last second
};

}  // namespace gpumigrate::agent
