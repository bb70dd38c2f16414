// The source-side migration options shared by `demo` and `migrate`.
#pragma once

#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "gpumigrate/session.h"
#include "gpumigrate/status.h"

namespace gpumigrate::cli {

// One data stream per core (at least 2, at most 8): each has its own sending thread.
inline uint32_t DefaultStreams() {
  unsigned n = std::thread::hardware_concurrency();
  return n < 2 ? 2 : (n > 8 ? 8 : n);
}

struct SourceFlags {
  uint32_t streams = DefaultStreams();
  std::string downtime_target = "300ms";
  std::string max_stun = "100s";
  std::string max_total;  // empty: no budget
  uint32_t max_rounds = 30;
  std::string bandwidth;  // empty: unlimited
  std::string codec = "none";
  std::string verify = "digest";
  std::string if_not_converging = "abort";
  bool no_scrub = false;
  bool no_content_offer = false;
  uint32_t threads = 0;  // 0: the cores, at most 8
};

// `with_streams`: a checkpoint writes one stream to its file and takes no --streams.
void AddSourceFlags(CLI::App* c, SourceFlags& f, bool with_streams = true);
Result<SourceOptions> MakeSourceOptions(const SourceFlags& f);

}  // namespace gpumigrate::cli
