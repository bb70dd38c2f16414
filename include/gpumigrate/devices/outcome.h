// How a migration ended. Shared by the session's reports and the device hooks
// that decide what happens to the source afterwards.
#pragma once

#include <string_view>

namespace gpumigrate {

enum class Outcome {
  kCompleted,  // the destination runs the workload
  kAborted,    // rolled back: the source runs on, the destination discarded
  kInDoubt,    // commit sent but not confirmed: both sides stopped, source state intact
};
std::string_view OutcomeName(Outcome o);  // "completed", "aborted", "in_doubt"

}  // namespace gpumigrate
