// The source-side migration options shared by `demo` and `migrate`.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "gpumigrate/session.h"
#include "gpumigrate/status.h"

namespace gpumigrate::cli {

struct SourceFlags {
  uint32_t streams = 2;
  std::string downtime_target = "300ms";
  std::string max_stun = "100s";
  uint32_t max_rounds = 30;
  std::string bandwidth;  // empty: unlimited
  std::string codec = "none";
  std::string verify = "digest";
  std::string if_not_converging = "abort";
};

void AddSourceFlags(CLI::App* c, SourceFlags& f);
Result<SourceOptions> MakeSourceOptions(const SourceFlags& f);

}  // namespace gpumigrate::cli
