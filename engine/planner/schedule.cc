#include "engine/planner/schedule.h"

#include <algorithm>
#include <numeric>

namespace gpumigrate::planner {
namespace {

struct Window {
  int64_t from, to;
};

// Whether group g keeps min_serving replicas if job j runs with stun window w,
// given the windows already fixed for g's other members.
bool GroupAllows(const std::vector<Window>& fixed, Window w, const GroupLimit& g) {
  if (w.to <= w.from) return true;
  // Most windows overlapping at once inside w (including w itself): sweep.
  std::vector<std::pair<int64_t, int>> ev{{w.from, +1}, {w.to, -1}};
  for (const Window& f : fixed) {
    if (f.to > w.from && f.from < w.to && f.to > f.from) {
      ev.push_back({std::max(f.from, w.from), +1});
      ev.push_back({std::min(f.to, w.to), -1});
    }
  }
  std::sort(ev.begin(), ev.end());  // ends (-1) before starts at the same instant
  int cur = 0, most = 0;
  for (auto [t, d] : ev) {
    cur += d;
    most = std::max(most, cur);
  }
  return static_cast<int64_t>(g.serving) - most >= static_cast<int64_t>(g.min_serving);
}

Window StunWindow(const Job& j, int64_t start) { return {start + j.duration_ms - j.stun_ms, start + j.duration_ms}; }

Timing Pipelined(const std::vector<Job>& jobs, const std::vector<size_t>& order, bool backfill,
                 const std::vector<uint32_t>& maxm, const std::vector<GroupLimit>& groups) {
  Timing t;
  t.start_ms.assign(jobs.size(), 0);
  std::vector<uint32_t> busy(maxm.size(), 0), alone(maxm.size(), 0);
  std::vector<std::vector<Window>> windows(groups.size());
  std::vector<size_t> pending;
  for (size_t i : order) {
    if (jobs[i].migration) {
      pending.push_back(i);
    } else {
      t.total_ms = std::max(t.total_ms, jobs[i].duration_ms);  // drains start at once
    }
  }
  std::vector<size_t> running;
  int64_t now = 0;
  auto can_start = [&](const Job& j) {
    for (uint32_t h : {j.source, j.target}) {
      if (alone[h] || busy[h] >= maxm[h] || (j.alone && busy[h] > 0)) return false;
    }
    return j.group < 0 || GroupAllows(windows[j.group], StunWindow(j, now), groups[j.group]);
  };
  while (!pending.empty()) {
    for (auto it = pending.begin(); it != pending.end();) {
      const Job& j = jobs[*it];
      bool start = can_start(j) || running.empty();  // running.empty(): nothing can block it any more
      if (start) {
        t.start_ms[*it] = now;
        for (uint32_t h : {j.source, j.target}) {
          ++busy[h];
          if (j.alone) ++alone[h];
        }
        if (j.group >= 0) windows[j.group].push_back(StunWindow(j, now));
        running.push_back(*it);
        it = pending.erase(it);
      } else if (!backfill) {
        break;
      } else {
        ++it;
      }
    }
    if (pending.empty()) break;
    // Advance to the next completion.
    int64_t next = INT64_MAX;
    for (size_t r : running) next = std::min(next, t.start_ms[r] + jobs[r].duration_ms);
    now = next;
    for (auto it = running.begin(); it != running.end();) {
      const Job& j = jobs[*it];
      if (t.start_ms[*it] + j.duration_ms <= now) {
        for (uint32_t h : {j.source, j.target}) {
          --busy[h];
          if (j.alone) --alone[h];
        }
        it = running.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) t.total_ms = std::max(t.total_ms, t.start_ms[i] + jobs[i].duration_ms);
  return t;
}

Timing Batched(const std::vector<Job>& jobs, const std::vector<size_t>& order, const std::vector<uint32_t>& maxm,
               const std::vector<GroupLimit>& groups) {
  Timing t;
  t.start_ms.assign(jobs.size(), 0);
  int64_t batch_start = 0, batch_end = 0;
  std::vector<size_t> batch;
  std::vector<uint32_t> busy(maxm.size(), 0);
  std::vector<std::vector<Window>> windows(groups.size());
  auto close = [&] {
    batch_start = batch_end;
    batch.clear();
    std::fill(busy.begin(), busy.end(), 0);
    for (auto& w : windows) w.clear();
  };
  for (size_t i : order) {
    const Job& j = jobs[i];
    uint32_t source_limit = maxm[j.source];
    bool fits = batch.size() < source_limit;
    if (fits && !batch.empty()) {
      if (j.alone || (jobs[batch.front()].alone)) fits = false;
      if (j.migration && busy[j.target] >= maxm[j.target]) fits = false;
      if (j.migration && j.group >= 0 && !GroupAllows(windows[j.group], StunWindow(j, batch_start), groups[j.group])) {
        fits = false;
      }
    }
    if (!fits) close();
    t.start_ms[i] = batch_start;
    batch.push_back(i);
    if (j.migration) {
      ++busy[j.target];
      if (j.group >= 0) windows[j.group].push_back(StunWindow(j, batch_start));
    }
    batch_end = std::max(batch_end, batch_start + j.duration_ms);
  }
  t.total_ms = batch_end;
  return t;
}

}  // namespace

ScheduleResult Schedule(const std::vector<Job>& jobs, const std::vector<uint32_t>& maxm,
                        const std::vector<GroupLimit>& groups) {
  // Longest first (ties: plan order): the classic order for a short makespan.
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].duration_ms > jobs[b].duration_ms; });
  ScheduleResult r;
  r.batched = Batched(jobs, order, maxm, groups);
  Timing greedy = Pipelined(jobs, order, true, maxm, groups);
  Timing strict = Pipelined(jobs, order, false, maxm, groups);
  r.pipelined = strict.total_ms < greedy.total_ms ? strict : greedy;
  if (r.pipelined.total_ms > r.batched.total_ms) {
    r.pipelined = r.batched;
    r.used_batched = true;
  }
  return r;
}

}  // namespace gpumigrate::planner
