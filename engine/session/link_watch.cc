#include "engine/session/link_watch.h"

#include <algorithm>

namespace gpumigrate {

void LinkWatch::RoundStarted(const FrameSender::LinkSample& s) {
  samples_.clear();
  samples_.push_back(s);
  rate_.reset();
  busy_ = false;
  backlogged_ = false;
}

void LinkWatch::Sample(const FrameSender::LinkSample& s) {
  if (samples_.empty() || s.written < samples_.back().written) {  // a new sender: start over
    RoundStarted(s);
    return;
  }
  // Samples closer than 50 ms add nothing but memory: at most ~40 per window.
  if (s.at - samples_.back().at < std::chrono::milliseconds(50)) return;
  samples_.push_back(s);
  while (samples_.size() > 2 && samples_[1].at <= s.at - kWindow) samples_.pop_front();
  const FrameSender::LinkSample& first = samples_.front();
  const auto span = s.at - first.at;
  if (span < kPeakSpan) return;
  const double seconds = std::chrono::duration<double>(span).count();
  const double rate = static_cast<double>(s.written - first.written) / seconds;
  peak_ = std::max(peak_, rate);
  if (span < kWindow) return;
  rate_ = rate;
  busy_ = std::chrono::duration<double>(s.busy - first.busy).count() >= kBusyFraction * seconds;
  backlogged_ = std::all_of(samples_.begin(), samples_.end(),
                            [](const FrameSender::LinkSample& x) { return x.unsent.value_or(0) > 0; });
}

}  // namespace gpumigrate
