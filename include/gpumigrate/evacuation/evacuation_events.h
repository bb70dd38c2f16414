// What an evacuation does, as events a scheduler can follow without parsing
// human text: `gpumigrate evacuate --events FILE|-` writes one JSON object per
// line for every state change, flushed as it happens (FILE is appended to, so
// a restarted controller continues it).
//
// Schema, version 1. Every event has:
//   "v": 1, "seq": N (1, 2, ... within one controller run), "time_unix_ms",
//   "evacuation" (its id), "host" (the host evacuated), "event" (its type)
// and by type:
//   plan            "feasible", "predicted_ms", "why" ("" the first plan, else
//                   what made it plan again), "actions": [{"vm", "action",
//                   "target", "predicted_stun_ms"}] (the VMs not yet settled)
//   refused         "reason": an infeasible plan; nothing was moved
//   action-started  "vm", "action" (live-migrate, drain-and-replace,
//                   power-off), "target", "predicted_stun_ms"
//   phase           "vm", "phase", "round": a live migration's session phase as
//                   its source agent reported it at the controller's poll
//                   (round-start, round-end: a round finished, switchover, ...);
//                   a phase shorter than the poll (--poll) may not be seen
//   paced           "vm", "bytes_per_s": the share of the link it runs at now
//   hook            "vm", "hook" (start-replica, drain, power-off), "on" (host),
//                   "state" (started, completed, failed)
//   outcome         "vm", "action", "target", "outcome" (completed, failed,
//                   in-doubt, blocked, left), "detail", "predicted_stun_ms"
//                   (-1: none), "measured_stun_ms" (-1: none)
//   done            "exit" (the command's exit status), "outcomes": {outcome: count}
// Types may be added (a reader skips those it does not know); a change to a
// field's meaning raises "v".
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpumigrate/common/status.h"

namespace gpumigrate {

inline constexpr int kEvacuationEventsVersion = 1;

class EvacuationEvents {
 public:
  // "-": standard output; otherwise the file, created or appended to.
  static Result<std::unique_ptr<EvacuationEvents>> Open(const std::string& where, std::string evacuation,
                                                        std::string host);
  ~EvacuationEvents();
  // One line: the common fields, then `fields` (an object) in their order.
  void Emit(std::string_view event, const nlohmann::ordered_json& fields);
  uint64_t emitted() const { return seq_; }

 private:
  EvacuationEvents(std::FILE* f, bool owned, std::string evacuation, std::string host)
      : f_(f), owned_(owned), evacuation_(std::move(evacuation)), host_(std::move(host)) {}
  std::FILE* f_;
  bool owned_;
  std::string evacuation_, host_;
  uint64_t seq_ = 0;
};

}  // namespace gpumigrate
