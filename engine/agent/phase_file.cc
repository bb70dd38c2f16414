#include "engine/agent/phase_file.h"

#include <cmath>

#include <fmt/format.h>

#include "gpumigrate/common/rate_file.h"
#include "gpumigrate/session/report.h"

namespace gpumigrate::agent {

void PhaseFile::OnPhase(Phase p, uint32_t round) {
  {
    std::lock_guard lock(mu_);
    phase_ = p;
    round_ = round;
  }
  Write();
}

void PhaseFile::OnProgress(const Progress& p) {
  {
    std::lock_guard lock(mu_);
    progress_ = p;
    window_.emplace_back(p.elapsed_s, p.bytes_sent);
    // Keep one sample at least a second old, so the rate spans about a second.
    while (window_.size() > 2 && p.elapsed_s - window_[1].first >= 1.0) window_.pop_front();
  }
  Write();
}

std::string PhaseFile::Text() const {
  std::lock_guard lock(mu_);
  std::string s = fmt::format(R"({{"phase": "{}", "round": {})", phase_ ? PhaseName(*phase_) : "starting", round_);
  if (progress_) {
    double rate = 0;
    if (window_.size() >= 2 && window_.back().first > window_.front().first) {
      rate = static_cast<double>(window_.back().second - window_.front().second) /
             (window_.back().first - window_.front().first);
    }
    if (applied_) {
      s += fmt::format(R"(, "bytes_applied": {}, "bytes_per_s": {})", progress_->bytes_sent, std::llround(rate));
    } else {
      s += fmt::format(R"(, "bytes_sent": {}, "bytes_per_s": {}, "round_bytes_total": {}, "round_bytes_done": {})",
                       progress_->bytes_sent, std::llround(rate), progress_->round_bytes_total,
                       progress_->round_bytes_done);
      if (progress_->predicted_stun_ms >= 0) {
        s += fmt::format(R"(, "predicted_stun_ms": {:.3f})", progress_->predicted_stun_ms);
      }
    }
  }
  return s + "}";
}

void PhaseFile::Write() { (void)ReplaceFile(path_, Text()); }

}  // namespace gpumigrate::agent
