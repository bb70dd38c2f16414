// A VM's "estimate" in the inventory: the three keys docs/planner.md requires, and,
// when the object is a whole `gpumigrate estimate --json`, the measured profile
// (regions, W(t) samples, non-zero fractions, codec figures, device state, fixed
// cost) that lets the planner re-run the engine's model at another bandwidth.
#pragma once

#include <string>

#include "engine/planner/json_reader.h"
#include "gpumigrate/planner/planner.h"

namespace gpumigrate::planner {

Result<VmEstimate> ParseVmEstimate(const Json& estimate, const std::string& path);

}  // namespace gpumigrate::planner
