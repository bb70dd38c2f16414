// The JSON of the store's records, and the reservation rules every store applies.
#include "engine/evacuation/records.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace gpumigrate::evacuation {

namespace {

// Values of the wrong type come back as the error, naming the key and `where`.
template <typename T>
Status Get(const J& j, const char* key, T& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) return Corrupt(fmt::format("{}: no \"{}\"", where, key));
  try {
    out = it->get<T>();
  } catch (const J::exception&) {
    return Corrupt(fmt::format("{}: \"{}\" has the wrong type", where, key));
  }
  return Status::Ok();
}

}  // namespace

J ToJson(const Reservation& r) {
  return {{"id", r.id}, {"evacuation", r.evacuation}, {"vm", r.vm}, {"host", r.host}, {"units", r.units},
          {"created_unix_ms", r.created_unix_ms}};
}

J ToJson(const JournalEntry& e) {
  return {{"seq", e.seq},       {"unix_ms", e.unix_ms}, {"evacuation", e.evacuation},
          {"controller", e.controller}, {"vm", e.vm},   {"action", e.action},
          {"phase", JournalPhaseName(e.phase)}, {"target", e.target}, {"detail", e.detail}};
}

Result<JournalEntry> EntryFromJson(const J& j, const std::string& where) {
  JournalEntry e;
  std::string phase;
  for (Status s : {Get(j, "seq", e.seq, where), Get(j, "unix_ms", e.unix_ms, where),
                   Get(j, "evacuation", e.evacuation, where), Get(j, "controller", e.controller, where),
                   Get(j, "vm", e.vm, where), Get(j, "action", e.action, where), Get(j, "phase", phase, where),
                   Get(j, "target", e.target, where), Get(j, "detail", e.detail, where)}) {
    if (!s.ok()) return s;
  }
  auto p = ParseJournalPhase(phase);
  if (!p) return Corrupt(fmt::format("{}: unknown phase \"{}\"", where, phase));
  e.phase = *p;
  return e;
}

Result<Reservation> ReservationFromJson(const J& j, const std::string& where) {
  Reservation r;
  for (Status s : {Get(j, "id", r.id, where), Get(j, "evacuation", r.evacuation, where), Get(j, "vm", r.vm, where),
                   Get(j, "host", r.host, where), Get(j, "units", r.units, where),
                   Get(j, "created_unix_ms", r.created_unix_ms, where)}) {
    if (!s.ok()) return s;
  }
  return r;
}

std::string FirstShared(const Reservation& held, const Reservation& wanted) {
  for (const auto& u : wanted.units) {
    if (std::find(held.units.begin(), held.units.end(), u) != held.units.end()) return u;
  }
  return "";
}

bool SameReservation(const Reservation& held, const Reservation& wanted) {
  if (held.evacuation != wanted.evacuation || held.vm != wanted.vm || held.host != wanted.host) return false;
  std::vector<std::string> a = held.units, b = wanted.units;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

Status Conflict(const std::string& unit, const Reservation& held) {
  return FailedPrecondition(
      fmt::format("{} is already reserved by evacuation {} for {} ({})", unit, held.evacuation, held.vm, held.id));
}

Status CheckReservation(const Reservation& r) {
  if (r.units.empty()) return InvalidArgument("a reservation needs at least one unit");
  if (r.evacuation.empty() || r.vm.empty()) return InvalidArgument("a reservation names its evacuation and VM");
  if (r.units.size() > kMaxUnitsPerReservation) {
    return InvalidArgument(fmt::format("a reservation of {} units: at most {} (reserve frame buffer as ranges)",
                                       r.units.size(), kMaxUnitsPerReservation));
  }
  for (size_t i = 0; i < r.units.size(); ++i) {
    if (r.units[i].empty()) return InvalidArgument("a reservation's unit is empty");
    if (std::find(r.units.begin(), r.units.begin() + static_cast<long>(i), r.units[i]) != r.units.begin() + static_cast<long>(i)) {
      return InvalidArgument(fmt::format("unit {} is listed twice", r.units[i]));
    }
  }
  return Status::Ok();
}

Status CheckEntry(const JournalEntry& e) {
  if (e.evacuation.empty() || e.vm.empty()) return InvalidArgument("a journal entry names its evacuation and VM");
  if (!ParseJournalPhase(JournalPhaseName(e.phase))) {
    return InvalidArgument(fmt::format("a journal entry for {} has no valid phase ({})", e.vm,
                                       static_cast<int>(e.phase)));
  }
  return Status::Ok();
}

std::string Dump(const J& j) { return j.dump(-1, ' ', false, J::error_handler_t::replace); }

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace gpumigrate::evacuation
