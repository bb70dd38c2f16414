// Human-readable migration report for a terminal.
#pragma once

#include <cstdio>
#include <string>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/session/report.h"
#include "gpumigrate/devices/sim.h"

namespace gpumigrate::cli {

void PrintReport(FILE* out, const std::string& title, const MigrationReport& r);
// A line per resumption of a broken connection (none: nothing).
void PrintResumptions(FILE* out, const MigrationReport& r);

// Exit code of the CLI contract: 0 completed, 1 aborted (source running), 3 in doubt.
int ExitCodeFor(const MigrationReport& r);

// The probe's report: the rounds as measured beside the estimator's prediction.
void PrintProbe(FILE* out, const std::string& title, const MigrationReport& r, const EstimateReport& e);


}  // namespace gpumigrate::cli
