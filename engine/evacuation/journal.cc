// Journal phases and the per-VM summary a restarted controller reads.
#include <algorithm>
#include <array>
#include <utility>

#include "gpumigrate/evacuation/evacuation_store.h"

namespace gpumigrate {

namespace {

constexpr std::array<std::pair<JournalPhase, std::string_view>, 6> kPhases = {{
    {JournalPhase::kPlanned, "planned"},
    {JournalPhase::kStarted, "started"},
    {JournalPhase::kCompleted, "completed"},
    {JournalPhase::kFailed, "failed"},
    {JournalPhase::kInDoubt, "in-doubt"},
    {JournalPhase::kReplanned, "replanned"},
}};

}  // namespace

std::string_view JournalPhaseName(JournalPhase p) {
  for (const auto& [phase, name] : kPhases) {
    if (phase == p) return name;
  }
  return "unknown";
}

std::optional<JournalPhase> ParseJournalPhase(std::string_view name) {
  for (const auto& [phase, n] : kPhases) {
    if (n == name) return phase;
  }
  return std::nullopt;
}

std::vector<VmJournalState> SummarizeJournal(const std::vector<JournalEntry>& entries) {
  std::vector<VmJournalState> out;
  for (const auto& e : entries) {
    auto it = std::find_if(out.begin(), out.end(), [&](const VmJournalState& v) { return v.vm == e.vm; });
    if (it == out.end()) {
      out.push_back({.vm = e.vm});
      it = out.end() - 1;
    }
    if (!e.action.empty()) it->action = e.action;
    if (!e.target.empty()) it->target = e.target;
    if (e.phase == JournalPhase::kStarted) ++it->attempts;
    it->last = e.phase;
  }
  return out;
}

}  // namespace gpumigrate
