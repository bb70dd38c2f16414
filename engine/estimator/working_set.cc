#include <algorithm>

#include "gpumigrate/estimator/estimator.h"

namespace gpumigrate {

double WorkingSetCurve::Eval(double t, Bound b, double cap) const {
  const std::vector<double>& y = b == Bound::kLow ? low_bytes : b == Bound::kMid ? mid_bytes : high_bytes;
  const std::vector<double>& x = window_s;
  if (x.empty() || t <= 0) return 0;
  double v;
  if (t <= x.front()) {
    v = y.front() * t / x.front();
  } else if (t >= x.back()) {
    // Extend along the last segment. The bounds use the gentler (low) or steeper
    // (high) of their own slope and the median's, so low <= mid <= high holds
    // beyond the samples as it does at them.
    auto slope_of = [&](const std::vector<double>& ys) {
      if (x.size() < 2) return 0.0;
      return std::max(0.0, (ys.back() - ys[ys.size() - 2]) / (x.back() - x[x.size() - 2]));
    };
    // The median and the low bound grow no faster than the longest window's
    // average rate (mid(T)/T): distinct pages are subadditive, W(nT) <= n W(T),
    // so a last segment steeper than that is a burst the sample happened to
    // catch (a workload writing 300 ms of every second, sampled for one),
    // not a rate that goes on. Where W bends down (a hot set, an append) the
    // last segment is the gentler and nothing changes. The high bound keeps
    // the steeper slope: the burst may go on.
    const double average = x.back() > 0 ? mid_bytes.back() / x.back() : 0.0;
    double slope = slope_of(y);
    if (b == Bound::kMid) slope = std::min(slope, average);
    if (b == Bound::kLow) slope = std::min({slope, slope_of(mid_bytes), average});
    if (b == Bound::kHigh) slope = std::max(slope, slope_of(mid_bytes));
    v = y.back() + slope * (t - x.back());
  } else {
    size_t i = static_cast<size_t>(std::upper_bound(x.begin(), x.end(), t) - x.begin());
    double f = (t - x[i - 1]) / (x[i] - x[i - 1]);
    v = y[i - 1] + f * (y[i] - y[i - 1]);
  }
  return std::min(v, cap);
}

}  // namespace gpumigrate
