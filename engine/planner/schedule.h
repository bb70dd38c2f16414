// The evacuation's timing: when each action starts, given how long it takes.
//
// Pipelined (what the plan uses): event-driven, each action starts as soon as
// it may: at most max_migrations migrations touch a host at once (as source or
// target), a migration that needs the link alone runs with no other migration on
// its source or target, and the stun windows of one replica group's members never
// overlap so much that fewer than min_serving serve. Drains use no migration
// link: they start at once. Two orders are tried (longest first with
// back-filling; the batched order without overtaking) and the shorter kept.
//
// Batched (for comparison): the same actions in order, in fixed batches of the
// source's max_migrations (a batch also respects the targets' limits, an
// alone-on-the-link migration is a batch of its own); each batch starts when the
// previous one's slowest action ends. The strict-order pipelined schedule starts
// every action no later than its batch does, so pipelined <= batched; should a
// group's stun windows ever break that, the plan runs the batched timing.
// Pure.
#pragma once

#include <cstdint>
#include <vector>

namespace gpumigrate::planner {

struct Job {
  bool migration = true;  // false: drain-and-replace (no link, no migration slot)
  uint32_t source = 0, target = 0;
  bool alone = false;
  int64_t duration_ms = 0;
  int64_t stun_ms = 0;  // at the end of a migration: the VM does not serve
  int32_t group = -1;   // index into the groups vector, or -1
};

struct GroupLimit {
  uint32_t serving = 0;  // replicas serving before the evacuation
  uint32_t min_serving = 0;
};

struct Timing {
  std::vector<int64_t> start_ms;  // per job
  int64_t total_ms = 0;
};

struct ScheduleResult {
  Timing pipelined;
  Timing batched;
  bool used_batched = false;  // the pipelined one was not shorter: the plan runs batched
};

ScheduleResult Schedule(const std::vector<Job>& jobs, const std::vector<uint32_t>& max_migrations,
                        const std::vector<GroupLimit>& groups);

}  // namespace gpumigrate::planner
