// The plan for people: a table (VM, action, target, predicted stun, start, end,
// reason) and a text timeline; and the gnuplot script that draws the timeline.
#pragma once

#include <cstdio>
#include <string>

#include "gpumigrate/planner/planner.h"

namespace gpumigrate::cli {

void PrintPlan(FILE* out, const planner::Plan& plan);
// A gnuplot script (for RunGnuplot, which sets the output): one lane per VM, migrations and drains
// coloured, the stun marked at the end of each migration, power-offs as points.
std::string PlanGnuplotScript(const planner::Plan& plan);

}  // namespace gpumigrate::cli
