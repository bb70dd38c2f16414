// --plot FILE.png on `estimate`: the prediction as a picture. Four panels: the
// dirty working set W(t) measured per region (median, and the band from the
// lowest to the highest window) with the likely run's round lengths marked on
// it; the bytes of each predicted round (the likely run as bars, the optimistic
// and pessimistic runs as marks); the bytes sent over time by each of the three
// runs, the likely stun shaded; and the switchover rule: the stun predicted at
// each of the engine's decisions against the downtime target, beside the
// printed stun range. The script is for RunGnuplot (cli/gnuplot.h).
#pragma once

#include <string>

#include "gpumigrate/estimator/estimator.h"

namespace gpumigrate::cli {

// `title`: the first line of the picture (the command and device).
std::string EstimatePlotScript(const EstimateReport& r, const std::string& title);

// Draws it after the estimate printed: says where on stderr, or why not (the
// estimate stands either way). Returns whether it was drawn.
bool DrawEstimatePlot(const std::string& png, const EstimateReport& r, const std::string& title);

}  // namespace gpumigrate::cli
