// Order statistics over a handful of measurements (the estimator's samples, a
// calibration's three runs, a benchmark's repetitions).
//
// Two medians, because callers need different ones and must say which:
//   Median       the textbook median: the middle value, or the mean of the two
//                middle values of an even count. Use it for a figure that
//                summarises a distribution (the estimator's working-set curve).
//   UpperMedian  always one of the values: the upper of the two middle values of
//                an even count (the middle one of an odd count). Use it where the
//                figure must be a value that was really measured.
// Both take the values by copy (they sort it) and return NaN for no values.
// Pure functions, no I/O.
#pragma once

#include <vector>

namespace gpumigrate {

double Median(std::vector<double> values);
double UpperMedian(std::vector<double> values);

}  // namespace gpumigrate
