#include "cli/progress.h"

#include <unistd.h>

#include <fmt/format.h>

#include "cli/print.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

ProgressPrinter::ProgressPrinter(FILE* out) : out_(out), tty_(isatty(fileno(out)) == 1) {}

void ProgressPrinter::Update(const Progress& p) {
  std::lock_guard lk(mu_);
  double rate = p.elapsed_s > 0 ? static_cast<double>(p.bytes_sent) / p.elapsed_s : 0;
  std::string what = p.phase == Phase::kSwitchover ? std::string("final (stunned)") : fmt::format("round {}", p.round);
  double pct = p.round_bytes_total ? 100.0 * static_cast<double>(p.round_bytes_done) /
                                         static_cast<double>(p.round_bytes_total)
                                   : 100.0;
  std::string line = fmt::format("{:<16} {:5.1f}% of {:>10}   sent {:>10}   avg {:>11}   {:6.1f}s", what, pct,
                                 FormatBytes(static_cast<double>(p.round_bytes_total)),
                                 FormatBytes(static_cast<double>(p.bytes_sent)), FormatRate(rate), p.elapsed_s);
  if (tty_) {
    Print(out_, "\r\033[K{}", line);
    line_open_ = true;
    std::fflush(out_);
    return;
  }
  auto now = std::chrono::steady_clock::now();
  if (static_cast<int64_t>(p.round) != last_round_ || now - last_plain_ >= std::chrono::seconds(1)) {
    last_round_ = p.round;
    last_plain_ = now;
    Print(out_, "{}\n", line);
    std::fflush(out_);
  }
}

void ProgressPrinter::Note(const std::string& line) {
  std::lock_guard lk(mu_);
  if (line_open_) Print(out_, "\r\033[K");
  line_open_ = false;
  Print(out_, "{}\n", line);
  std::fflush(out_);
}

void ProgressPrinter::Finish() {
  std::lock_guard lk(mu_);
  if (line_open_) Print(out_, "\n");
  line_open_ = false;
  std::fflush(out_);
}

}  // namespace gpumigrate::cli
