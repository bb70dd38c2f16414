// The workload's bursty timing (--burst ON/OFF): it writes at --rate for ON,
// then not at all for OFF, over and over, like a serving process whose batches
// come and go. Pacing counts only the ON time, so a burst does not make up for
// the pause before it.
#pragma once

#include <algorithm>
#include <cmath>

namespace gpumigrate::workload {

// Seconds of ON time in the first `t` seconds (on <= 0: always on).
inline double OnSeconds(double t, double on, double off) {
  if (on <= 0 || off <= 0) return t;
  const double cycle = on + off;
  const double full = std::floor(t / cycle);
  return full * on + std::min(on, t - full * cycle);
}

// Whether the workload writes at `t` seconds.
inline bool Writing(double t, double on, double off) {
  if (on <= 0 || off <= 0) return true;
  return std::fmod(t, on + off) < on;
}

}  // namespace gpumigrate::workload
