// Drawing with gnuplot, shared by every command with --plot: a check made
// before any work starts (so a migration is never run only to fail at its
// picture), and running a script that writes the PNG.
#pragma once

#include <string>

#include "gpumigrate/common/status.h"

namespace gpumigrate::cli {

bool HaveGnuplot();

// Ok when `png` can be drawn: gnuplot is installed, and the name is one a
// gnuplot string can hold (no quote, no newline). Otherwise the reason, which
// names the flag and says how to install gnuplot.
Status CheckPlotTarget(const std::string& png);

// Runs `script` (which sets its terminal, not its output) with gnuplot; an
// error carries gnuplot's own complaint. An existing `png` is replaced only
// when gnuplot succeeded in writing a non-empty file.
Status RunGnuplot(const std::string& script, const std::string& png);

// Runs `script` to draw `png` after a command's report printed, and says on
// stderr where it was drawn or why not (the command's outcome stands either
// way). Empty `png`: nothing. Returns whether it was drawn.
bool DrawPlot(const std::string& png, const std::string& script);

// `text` as the inside of a gnuplot double-quoted string.
std::string GnuplotText(const std::string& text);

}  // namespace gpumigrate::cli
