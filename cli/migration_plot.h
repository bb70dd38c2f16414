// --plot on `demo` and `migrate`: the rounds of a migration as a picture. Four
// panels: bytes sent per round, throughput over time (each round's average and,
// when the progress trace has samples, the rate between them), the dirty set
// shrinking round by round, and the stun with its breakdown beside the
// predicted stun. The script is for RunGnuplot (cli/gnuplot.h).
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "gpumigrate/session/report.h"
#include "gpumigrate/session/session.h"

namespace gpumigrate::cli {

struct ProgressSample {
  double t_s = 0;
  uint64_t bytes_sent = 0;
  uint32_t round = 0;
  Phase phase = Phase::kHandshake;
};

// Collects the source's progress callbacks (at most every 100 ms) for the plot.
class ProgressTrace {
 public:
  void Add(const Progress& p) {
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back({p.elapsed_s, p.bytes_sent, p.round, p.phase});
  }
  std::vector<ProgressSample> samples() const {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<ProgressSample> samples_;
};

// `title`: the first line of the picture (the command and device).
std::string MigrationPlotScript(const MigrationReport& r, const std::vector<ProgressSample>& trace,
                                const std::string& title);

// `--plot FILE.png` on a command that migrates.
void AddMigrationPlotFlag(CLI::App* c, std::string& png);

// Draws the picture after the report printed: says where on stderr, or why not
// (the migration's outcome stands either way). Returns whether it was drawn.
bool DrawMigrationPlot(const std::string& png, const MigrationReport& r, const ProgressTrace& trace,
                       const std::string& title);

}  // namespace gpumigrate::cli
