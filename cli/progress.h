// Progress display on stderr: one redrawn line on a terminal, plain lines
// (one per round, at most one a second within a round) when not.
#pragma once

#include <chrono>
#include <cstdio>
#include <mutex>

#include "gpumigrate/session/session.h"

namespace gpumigrate::cli {

class ProgressPrinter {
 public:
  explicit ProgressPrinter(FILE* out);
  void Update(const Progress& p);
  void Note(const std::string& line);  // a line of its own (clears the redrawn line first)
  void Finish();

 private:
  FILE* out_;
  bool tty_;
  bool line_open_ = false;
  int64_t last_round_ = -1;
  std::chrono::steady_clock::time_point last_plain_{};
  std::mutex mu_;
};

}  // namespace gpumigrate::cli
