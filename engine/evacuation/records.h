// The JSON of the store's records, shared by every store: one encoding of a
// reservation and of a journal entry, and the decoders that name what is wrong
// and where (`where`: the file and line, or the key).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "gpumigrate/evacuation/evacuation_store.h"

namespace gpumigrate::evacuation {

using J = nlohmann::ordered_json;

J ToJson(const Reservation& r);
J ToJson(const JournalEntry& e);
Result<Reservation> ReservationFromJson(const J& j, const std::string& where);
Result<JournalEntry> EntryFromJson(const J& j, const std::string& where);

// The first unit of `wanted` that `held` (another reservation) holds, or "".
std::string FirstShared(const Reservation& held, const Reservation& wanted);
// Whether `held` is `wanted` made before (a retried Reserve).
bool SameReservation(const Reservation& held, const Reservation& wanted);
Status Conflict(const std::string& unit, const Reservation& held);
Status CheckReservation(const Reservation& r);
// An entry a store may append: it names its evacuation and VM, and a phase.
Status CheckEntry(const JournalEntry& e);

int64_t NowUnixMs();

// The JSON text of a record: bytes that are not UTF-8 (an error message from
// elsewhere) are replaced, never thrown.
std::string Dump(const J& j);

// The most units one reservation may take: etcd runs at most 128 operations in
// a transaction (its --max-txn-ops default) and a reservation needs two per unit
// plus two. Reserve frame buffer as ranges, not one unit per gigabyte.
constexpr size_t kMaxUnitsPerReservation = 60;

}  // namespace gpumigrate::evacuation
