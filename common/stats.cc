#include "gpumigrate/common/stats.h"

#include <algorithm>
#include <cmath>

namespace gpumigrate {

double Median(std::vector<double> values) {
  if (values.empty()) return NAN;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double UpperMedian(std::vector<double> values) {
  if (values.empty()) return NAN;
  // nth_element would do; sorting keeps the two medians visibly alike.
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace gpumigrate
