// The evacuation's timing: when each action starts, at what share of the links
// each migration runs, and so how long it takes and how long its stun is.
//
// Pipelined (what the plan uses): event-driven; each action starts as soon as
// capacity allows (a later one may overtake one that must wait): at most
// max_migrations migrations touch a host at once (as source or target); a
// migration that starts reserves its share of both links for its whole run and
// is predicted at that share (never more than what is free, so a link is never
// oversubscribed): what is free of the link divided among the migrations that
// may still start on it (its free max_migrations slots, no more than remain),
// or a larger share when its stun only fits so; a
// migration that cannot share the link with even one other runs with no other
// migration on its source or target. The stun windows of one replica group's
// members never overlap so much that fewer than min_serving serve. Drains use no
// migration link: they start at once.
//
// Batched (for comparison): the same actions in order, in fixed batches of the
// source's max_migrations (a batch also respects the targets' limits; a
// migration whose stun does not fit its share of the batch starts a batch of its
// own); the members of a batch share the links evenly; each batch starts when
// the previous one's slowest action ends. Should the pipelined schedule ever be
// the longer, the plan runs the batched one.
//
// Both are then replayed as the controller runs them (schedule.cc, Replay):
// the same order, each action starting as soon as its hosts have a slot, the
// links shared evenly at every instant among the migrations moving bytes on
// them (a migration whose partner ended speeds up), each migration's setup and
// teardown moving nothing. The replay gives the start and end times, each
// stun at the share its final round really gets (final_bandwidth_bytes_per_s)
// and the totals; the reserved shares above decide only order and feasibility.
// Pure.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace gpumigrate::planner {

struct Timed {
  int64_t duration_ms = 0;
  int64_t stun_ms = 0;
  // The stun's final round (0 bytes: its stun scales with the share): the stun
  // at share B is fixed_ms + final_bytes / B. setup_ms and teardown_ms: the
  // start and the end of duration_ms that move nothing (processes starting,
  // the receive ending), so they share no link.
  double final_bytes = 0;
  double fixed_ms = 0;
  int64_t setup_ms = 0;
  int64_t teardown_ms = 0;
};

struct Job {
  bool migration = true;  // false: drain-and-replace (no link, no migration slot)
  uint32_t source = 0, target = 0;
  bool alone = false;       // needs both links to itself
  int64_t max_stun_ms = 0;  // a migration's stun at its share must stay within this
  // A migration's duration and stun at a bandwidth (bytes/s); a drain's fixed duration.
  std::function<Timed(double)> at;
  int64_t drain_ms = 0;
  int32_t group = -1;  // index into the groups vector, or -1
  // The controller starts migrations one after another, this long each (a
  // receive request, then a migrate request): ones that may start at the same
  // instant start this far apart (the replay).
  int64_t start_gap_ms = 0;
};

struct HostLimit {
  uint32_t max_migrations = 1;
  double link_bytes_per_s = 0;
};

struct GroupLimit {
  uint32_t serving = 0;  // replicas serving before the evacuation
  uint32_t min_serving = 0;
};

struct JobTiming {
  int64_t start_ms = 0;
  Timed t;
  double bandwidth_bytes_per_s = 0;
  uint32_t shared_with = 0;  // the other migrations the link share assumed
  // The final round's share: the links divided among the migrations moving
  // bytes on them when the stun begins (the whole link when none is).
  double final_bandwidth_bytes_per_s = 0;
  uint32_t final_shared_with = 0;
  bool whole_link = false;  // took the whole link because a part of it would break max stun
};

struct Timing {
  std::vector<JobTiming> jobs;
  int64_t total_ms = 0;
};

struct ScheduleResult {
  Timing pipelined;
  Timing batched;
  bool used_batched = false;  // the pipelined one was not shorter: the plan runs batched
};

ScheduleResult Schedule(const std::vector<Job>& jobs, const std::vector<HostLimit>& hosts,
                        const std::vector<GroupLimit>& groups);

}  // namespace gpumigrate::planner
