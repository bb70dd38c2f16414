// Placement: find target slots for the VMs of the evacuated host that need one
// (to migrate into, or for a replacement replica), so that the final state holds
// as many of them as possible, all of them whenever any assignment can.
//
// Exact search: depth-first over the VMs (hardest first: passthrough, multi-GPU
// vGPU, large MIG profiles, large vGPUs), each VM trying its candidate slots best
// first, then "left unplaced"; a branch is cut when it cannot beat the best
// assignment found. Candidates that leave the fleet in an equivalent state (a MIG
// start on GPUs of the same model in the same state, vGPU GPUs of the same size
// and count, hosts with the same number of free passthrough GPUs) are tried once,
// so the search is exact while it stays within its budget of candidate
// evaluations; past the budget it keeps the best assignment found (always at
// least the greedy first descent) and says so.
//
// A need with target_ok set (a VM that can only live-migrate) is offered only
// the targets whose link keeps its stun within its max stun; hosts that differ
// in which needs may use them are never treated as equivalent.
//
// "Best first": replicas of one group spread across hosts; then least
// fragmentation (the MIG capacity lost for each profile, largest first: keep 7g
// and 4g/3g starts placeable; for vGPU, fill GPUs of the same size before opening
// an empty one; for passthrough, the host with the fewest spare GPUs); then the
// faster link; then the host with fewer arrivals; then the lowest host, GPU and
// slice, for a deterministic plan.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/planner/fleet.h"

namespace gpumigrate::planner {

struct PlacementResult {
  std::vector<std::optional<Slot>> slots;  // per need, in the order given
  bool exact = true;
  uint64_t evaluations = 0;
};

// Places `needs` into `fleet` (left holding the chosen assignment).
PlacementResult Place(Fleet& fleet, const std::vector<SlotNeed>& needs, uint64_t budget);

// Why `need` has no slot in `fleet` as it stands: the capacity there is.
std::string ShortfallText(const Fleet& fleet, const SlotNeed& need);

}  // namespace gpumigrate::planner
