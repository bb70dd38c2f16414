// The source-side migration options shared by `demo` and `migrate`.
#pragma once

#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "gpumigrate/session/session.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/policy/switchover.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

// What the operator allows, as `migrate`, `demo`, `checkpoint` and `estimate`
// take it: one set of flags, its defaults those of the engine (switchover.h).
struct LimitFlags {
  std::string downtime_target = FormatDuration(kDefaultDowntimeTarget);
  std::string max_stun = FormatDuration(kDefaultMaxStun);
  uint32_t max_rounds = kDefaultMaxRounds;
};
void AddLimitFlags(CLI::App* c, LimitFlags& f);
// The parsed limits (downtime target, max stun, max rounds), or what is wrong with a flag.
Result<SwitchoverLimits> ParseLimitFlags(const LimitFlags& f);

struct SourceFlags {
  uint32_t streams = DefaultStreams();
  LimitFlags limits;
  std::string max_total;  // empty: no budget
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
