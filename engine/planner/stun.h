// A VM's stun and migration time at the bandwidth the schedule gives it.
//
//   profile       the estimate carries the measured profile: re-run the engine's
//                 own model (RunModel, the engine's switchover rule) at that
//                 bandwidth, capped by the source's pipeline, with each region's
//                 codec ratio re-derived for it (min(ratio, speed / bandwidth))
//   scaled        only the estimate's figures: scale them by estimate.link / bandwidth
//                 (both ways: the estimate carries no fixed cost apart from its
//                 transfer, so all of it is treated as transfer and scaled)
//   frame-buffer  no estimate: stop-and-copy of the whole frame buffer
// Pure.
#pragma once

#include <chrono>
#include <string>

#include "gpumigrate/planner/planner.h"

namespace gpumigrate::planner {

struct StunAt {
  double stun_ms = 0;
  double total_ms = 0;
  std::string basis;  // "profile", "scaled", "frame-buffer"
  // "profile" only (else 0): the final round's bytes and the stun's fixed part,
  // so the stun can be re-predicted at the share the final round really gets.
  double final_bytes = 0;
  double fixed_ms = 0;
};

// `target_holds`: the target's content store holds the VM's weights (Host::
// Holds): with a measured profile, its static regions go as digests in round 0
// (at the offer rate the estimate measured, when it did: estimate
// --content-store-hint), as `estimate --content-store-hint static` models them.
StunAt PredictStunAt(const Vm& vm, double bandwidth_bytes_per_s, std::chrono::nanoseconds max_stun,
                     bool target_holds = false);

// "from the measured profile", "scaled from the estimate at 100 Gbit", "no
// estimate: stop-and-copy of its 40 GB frame buffer".
std::string BasisText(const Vm& vm, const StunAt& s);

// "50 Gbit", "12.5 Gbit", "800 Mbit".
std::string Gbit(double bytes_per_s);
// "9.1 s", "100 s", "150.4 s", "350 ms".
std::string Seconds(double ms);
// "140 s > 100 s": with as many decimals as it takes for the two to differ.
std::string StunOver(double ms, double max_ms);

}  // namespace gpumigrate::planner
