// The state an evacuation keeps outside itself (issue 12): the reservations of
// capacity it has chosen on target hosts, so that two evacuations running at
// once never count the same free slot, and the journal of every action and its
// outcome, so that a controller killed mid-evacuation and restarted continues
// where it left off (never migrating a VM twice, never losing one).
//
// The store is a seam: the embedded default (OpenFileStore: a directory on one
// machine, every transaction under an flock) and, for fleets, a store shared by
// controllers on several machines behind the same interface.
//
// Capacity is reserved as named units the caller derives from the inventory,
// one per thing two VMs cannot both have: "gpu-b/gpu0/slice4" for a MIG memory
// slice, "gpu-b/gpu2" for a passthrough GPU, "gpu-b/gpu1/fb2" for the third of
// a time-sliced GPU's equal vGPU slots. A reservation takes all its units or none.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct Reservation {
  std::string id;          // unique in the store; given by Reserve
  std::string evacuation;  // the evacuation that holds it
  std::string vm;          // the VM it is for
  std::string host;        // the target host
  std::vector<std::string> units;
  int64_t created_unix_ms = 0;
};

// What happened to one VM of an evacuation, appended as it happens.
enum class JournalPhase {
  kPlanned,    // chosen: action and target (detail)
  kStarted,    // the action began (a migration's source may now be in flight)
  kCompleted,  // it finished: the VM runs at its target (or was drained, powered off)
  kFailed,     // it failed and the VM stayed where it was, running
  kInDoubt,    // it failed after the point of no return: held, needs an operator
  kReplanned,  // the planner chose again for this VM after a failure (detail: why)
};
std::string_view JournalPhaseName(JournalPhase p);  // "planned", "started", ...
std::optional<JournalPhase> ParseJournalPhase(std::string_view name);

struct JournalEntry {
  uint64_t seq = 0;        // given by Append: 1, 2, ... in the store's order
  int64_t unix_ms = 0;     // given by Append when 0
  std::string evacuation;
  std::string controller;  // who wrote it (host:pid)
  std::string vm;
  std::string action;      // "live-migrate", "drain-and-replace", "power-off", ...
  JournalPhase phase = JournalPhase::kPlanned;
  std::string target;      // the target host, when there is one
  std::string detail;      // free text: the reason, the error, the measured stun
};

class EvacuationStore {
 public:
  virtual ~EvacuationStore() = default;
  virtual std::string Describe() const = 0;
  // What opening the store found and repaired (a journal line torn by a crash).
  virtual std::vector<std::string> Notes() const = 0;

  // Takes every unit of `r` for r.evacuation, or none: FailedPrecondition naming
  // the first unit already held and by which evacuation and VM (its own other
  // reservations included). The same reservation made again (same evacuation,
  // VM, host and units in any order: a Reserve retried after a crash) returns
  // the one made. At most 60 units (records.h says why). Returns it with its id.
  virtual Result<Reservation> Reserve(Reservation r) = 0;
  // Gives back one reservation (InvalidArgument when there is none with that id).
  virtual Status Release(const std::string& id) = 0;
  // Gives back every reservation of `evacuation`; returns how many.
  virtual Result<size_t> ReleaseAll(const std::string& evacuation) = 0;
  virtual Result<std::vector<Reservation>> Reservations() = 0;

  // Appends `e` (seq and, when 0, the time are the store's) once it is durable.
  // Not idempotent: an Append that failed may still have been written (a failed
  // fsync, an etcd answer lost); read the journal before appending again.
  virtual Result<JournalEntry> Append(JournalEntry e) = 0;
  // The whole journal in order, or only one evacuation's.
  virtual Result<std::vector<JournalEntry>> Journal(const std::string& evacuation = "") = 0;
};

// The embedded store in directory `dir` (created when missing): journal.jsonl
// (one JSON object per line, each with a checksum; appended and fsynced) and
// reservations.json (rewritten through a temporary file and a rename), every
// read and write under an flock on dir/lock, so processes on this machine share
// it safely. A journal whose last line was torn by a crash loses only that line
// (never acknowledged: Append returns after fsync) and says so on the next
// open; a damaged line anywhere else, or a damaged reservations file, is an
// error naming the file and line.
Result<std::unique_ptr<EvacuationStore>> OpenFileStore(const std::string& dir);

// The fleet store: etcd at `endpoint` (http://HOST:PORT, its v3 JSON gateway),
// every key under `prefix` (default /gpumigrate/), so that controllers on
// several machines coordinate: a reservation is one etcd transaction that needs
// every unit key still absent, a journal line one that needs the last sequence
// number unchanged; a lost race is read again. Unavailable when etcd cannot be
// reached (checked at open). Plain HTTP: run it on a trusted network or
// loopback (TLS to etcd is not built).
Result<std::unique_ptr<EvacuationStore>> OpenEtcdStore(const std::string& endpoint,
                                                       const std::string& prefix = "/gpumigrate/");

// Where each VM of one evacuation stands, from its journal: what a restarted
// controller reads before doing anything.
struct VmJournalState {
  std::string vm;
  std::string action;
  std::string target;
  JournalPhase last = JournalPhase::kPlanned;
  uint32_t attempts = 0;  // kStarted entries
  // Started and never finished: the VM may be mid-migration or done; it must be
  // asked about (its source and target agents), never started again blindly.
  bool unresolved() const { return last == JournalPhase::kStarted; }
  bool finished() const { return last == JournalPhase::kCompleted; }
  // In doubt: held on both sides until an operator resolves it.
  bool needs_operator() const { return last == JournalPhase::kInDoubt; }
  // The only states in which a controller may start the VM's action: nothing
  // has been tried yet, or what was tried failed with the VM left running.
  bool may_start() const {
    return last == JournalPhase::kPlanned || last == JournalPhase::kFailed || last == JournalPhase::kReplanned;
  }
};
// In the order each VM first appears.
std::vector<VmJournalState> SummarizeJournal(const std::vector<JournalEntry>& entries);

}  // namespace gpumigrate
