#include "engine/planner/schedule.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace gpumigrate::planner {
namespace {

struct Window {
  int64_t from, to;
};

// Whether group g keeps min_serving replicas if a member is stunned during w,
// given the windows already fixed for its other members.
bool GroupAllows(const std::vector<Window>& fixed, Window w, const GroupLimit& g) {
  if (w.to <= w.from) return true;
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

Window StunWindow(const JobTiming& t) {
  return {t.start_ms + t.t.duration_ms - t.t.stun_ms, t.start_ms + t.t.duration_ms};
}

// Memoised Job::at: the model re-run is not free and the same shares recur.
class Timer {
 public:
  explicit Timer(const std::vector<Job>& jobs) : jobs_(jobs), cache_(jobs.size()) {}
  Timed At(size_t j, double bw) {
    auto it = cache_[j].find(bw);
    if (it != cache_[j].end()) return it->second;
    Timed t = jobs_[j].at(bw);
    cache_[j].emplace(bw, t);
    return t;
  }

 private:
  const std::vector<Job>& jobs_;
  std::vector<std::map<double, Timed>> cache_;
};

class Pipeline {
 public:
  Pipeline(const std::vector<Job>& jobs, const std::vector<HostLimit>& hosts, const std::vector<GroupLimit>& groups,
           Timer& timer)
      : jobs_(jobs), hosts_(hosts), groups_(groups), timer_(timer) {}

  Timing Run(const std::vector<size_t>& order) {
    const size_t nh = hosts_.size();
    busy_.assign(nh, 0);
    alone_.assign(nh, 0);
    left_.assign(nh, 0);
    reserved_.assign(nh, 0.0);
    windows_.assign(groups_.size(), {});
    Timing t;
    t.jobs.assign(jobs_.size(), {});
    std::vector<size_t> pending;
    for (size_t i : order) {
      const Job& j = jobs_[i];
      if (!j.migration) {
        t.jobs[i].t = {j.drain_ms, 0};  // drains start at once
        continue;
      }
      pending.push_back(i);
      if (!j.alone) {
        ++left_[j.source];
        ++left_[j.target];
      }
    }
    std::vector<size_t> running;
    int64_t now = 0;
    while (!pending.empty()) {
      for (auto it = pending.begin(); it != pending.end();) {
        if (TryStart(*it, now, running.empty(), t.jobs[*it])) {
          Take(*it, t.jobs[*it], +1);
          running.push_back(*it);
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      if (pending.empty()) break;
      int64_t next = INT64_MAX;
      for (size_t r : running) next = std::min(next, t.jobs[r].start_ms + t.jobs[r].t.duration_ms);
      now = next;
      for (auto it = running.begin(); it != running.end();) {
        if (t.jobs[*it].start_ms + t.jobs[*it].t.duration_ms <= now) {
          Take(*it, t.jobs[*it], -1);
          it = running.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const JobTiming& j : t.jobs) t.total_ms = std::max(t.total_ms, j.start_ms + j.t.duration_ms);
    return t;
  }

 private:
  // Whether job i may start now, and at what share; fills `out`.
  bool TryStart(size_t i, int64_t now, bool idle, JobTiming& out) {
    const Job& j = jobs_[i];
    const HostLimit& s = hosts_[j.source];
    const HostLimit& d = hosts_[j.target];
    for (uint32_t h : {j.source, j.target}) {
      if (!idle && (alone_[h] || busy_[h] >= hosts_[h].max_migrations || (j.alone && busy_[h] > 0))) return false;
    }
    auto free = [&](uint32_t h) {
      return idle ? hosts_[h].link_bytes_per_s : hosts_[h].link_bytes_per_s - reserved_[h];
    };
    // The shares it could take, smallest first: what is free of each link divided
    // among the migrations that may still start on it now (its free migration
    // slots, no more than remain to run), then among fewer, down to all that is
    // free. Dividing what is free, not the whole link, gives migrations that
    // start at one instant equal shares, so the last of them is not left a sliver
    // below the floor and made to wait while a slot is free.
    auto slots = [&](uint32_t h, uint32_t limit) {
      uint32_t open = limit > busy_[h] ? limit - busy_[h] : 1;
      return std::max<uint32_t>(1, std::min(open, left_[h]));
    };
    uint32_t ks = slots(j.source, s.max_migrations);
    uint32_t kd = slots(j.target, std::min(d.max_migrations, s.max_migrations));
    uint32_t k = j.alone ? 1 : std::max(ks, kd);
    // Never below the share every migration gets when the links are fully used.
    double floor = std::min(s.link_bytes_per_s / s.max_migrations,
                            d.link_bytes_per_s / std::min(d.max_migrations, s.max_migrations));
    uint32_t others = std::max(busy_[j.source], busy_[j.target]);
    for (uint32_t m = k; m >= 1; --m) {
      uint32_t ms = std::min(ks, m), md = std::min(kd, m);
      double bw = std::min(free(j.source) / ms, free(j.target) / md);
      if (bw < floor * (1 - 1e-12) && m > 1) continue;  // what is free, split fewer ways
      if (bw < floor * (1 - 1e-12) || (j.alone && bw < std::min(s.link_bytes_per_s, d.link_bytes_per_s))) {
        return false;
      }
      Timed t = timer_.At(i, bw);
      if (t.stun_ms > j.max_stun_ms && m > 1) continue;  // needs a larger share
      if (t.stun_ms > j.max_stun_ms && !idle) return false;  // wait for more of the link
      JobTiming jt{now, t, bw, std::max({ms - 1, md - 1, others})};
      if (j.group >= 0 && !idle && !GroupAllows(windows_[j.group], StunWindow(jt), groups_[j.group])) return false;
      out = jt;
      return true;
    }
    return false;
  }

  void Take(size_t i, const JobTiming& jt, int sign) {
    const Job& j = jobs_[i];
    for (uint32_t h : {j.source, j.target}) {
      busy_[h] += sign;
      if (j.alone) alone_[h] += sign;
      reserved_[h] += sign * jt.bandwidth_bytes_per_s;
      if (sign > 0 && !j.alone) --left_[h];
    }
    if (sign > 0 && j.group >= 0) windows_[j.group].push_back(StunWindow(jt));
  }

  const std::vector<Job>& jobs_;
  const std::vector<HostLimit>& hosts_;
  const std::vector<GroupLimit>& groups_;
  Timer& timer_;
  std::vector<uint32_t> busy_, alone_, left_;
  std::vector<double> reserved_;
  std::vector<std::vector<Window>> windows_;
};

Timing Batched(const std::vector<Job>& jobs, const std::vector<size_t>& order, const std::vector<HostLimit>& hosts,
               const std::vector<GroupLimit>& groups, Timer& timer) {
  Timing t;
  t.jobs.assign(jobs.size(), {});
  int64_t batch_start = 0, batch_end = 0;
  std::vector<size_t> batch;
  // Times every member of `members` at an even share of the batch; false when a
  // stun breaks its limit or a group falls below min_serving.
  auto time_batch = [&](const std::vector<size_t>& members, int64_t start) {
    std::map<uint32_t, uint32_t> per_host;
    for (size_t i : members) {
      if (!jobs[i].migration) continue;
      ++per_host[jobs[i].source];
      ++per_host[jobs[i].target];
    }
    std::vector<std::vector<Window>> windows(groups.size());
    for (size_t i : members) {
      const Job& j = jobs[i];
      if (!j.migration) {
        t.jobs[i] = {start, {j.drain_ms, 0}, 0, 0};
        continue;
      }
      uint32_t ks = per_host[j.source], kd = per_host[j.target];
      double bw = std::min(hosts[j.source].link_bytes_per_s / ks, hosts[j.target].link_bytes_per_s / kd);
      t.jobs[i] = {start, timer.At(i, bw), bw, std::max(ks, kd) - 1};
      if (members.size() > 1 && t.jobs[i].t.stun_ms > j.max_stun_ms) return false;
      if (j.group >= 0) {
        Window w = StunWindow(t.jobs[i]);
        if (members.size() > 1 && !GroupAllows(windows[j.group], w, groups[j.group])) return false;
        windows[j.group].push_back(w);
      }
    }
    return true;
  };
  auto close = [&] {
    for (size_t i : batch) batch_end = std::max(batch_end, t.jobs[i].start_ms + t.jobs[i].t.duration_ms);
    batch_start = batch_end;
    batch.clear();
  };
  for (size_t i : order) {
    const Job& j = jobs[i];
    bool fits = !batch.empty() && batch.size() < hosts[j.source].max_migrations && !j.alone &&
                !jobs[batch.front()].alone;
    if (fits && j.migration) {
      uint32_t to_target = 0;
      for (size_t b : batch) to_target += jobs[b].migration && jobs[b].target == j.target;
      fits = to_target < hosts[j.target].max_migrations;
    }
    if (fits) {
      batch.push_back(i);
      if (!time_batch(batch, batch_start)) {
        batch.pop_back();
        (void)time_batch(batch, batch_start);
        fits = false;
      }
    }
    if (!fits) {
      if (!batch.empty()) close();
      batch.push_back(i);
      (void)time_batch(batch, batch_start);
    }
  }
  if (!batch.empty()) close();
  t.total_ms = batch_end;
  return t;
}

// Each migration's stun at the share its final round really gets: its links
// divided among the migrations moving bytes on them when its stun begins (none:
// the whole link), not the share it started with. A migration left alone by
// the others' ends switches over at the whole link; one whose final round
// meets another's bulk gets a part. A stun that would exceed max stun at that
// share keeps its figure at the rounds' share: the engine's rule runs another
// round rather than switch over so.
void FinalShares(const std::vector<Job>& jobs, const std::vector<HostLimit>& hosts, Timing& t) {
  std::vector<int64_t> stun_from(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) stun_from[i] = t.jobs[i].start_ms + t.jobs[i].t.duration_ms - t.jobs[i].t.stun_ms;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    if (!j.migration) continue;
    JobTiming& ji = t.jobs[i];
    double bw = INFINITY;
    uint32_t most = 0;
    for (uint32_t h : {j.source, j.target}) {
      uint32_t n = 0;
      for (size_t k = 0; k < jobs.size(); ++k) {
        const Job& o = jobs[k];
        if (k == i || !o.migration || (o.source != h && o.target != h)) continue;
        const JobTiming& jk = t.jobs[k];
        n += jk.start_ms + jk.t.setup_ms <= stun_from[i] && stun_from[i] < jk.start_ms + jk.t.duration_ms;
      }
      bw = std::min(bw, hosts[h].link_bytes_per_s / (1 + n));
      most = std::max(most, n);
    }
    ji.final_bandwidth_bytes_per_s = bw;
    ji.final_shared_with = most;
    if (ji.t.final_bytes <= 0 || !(bw > 0)) continue;
    const auto stun = static_cast<int64_t>(std::ceil(ji.t.fixed_ms + ji.t.final_bytes / bw * 1e3 - 1e-9));
    if (stun <= j.max_stun_ms) ji.t.stun_ms = stun;
  }
}

}  // namespace

ScheduleResult Schedule(const std::vector<Job>& jobs, const std::vector<HostLimit>& hosts,
                        const std::vector<GroupLimit>& groups) {
  Timer timer(jobs);
  // Longest first (at the whole link; ties: plan order): the classic order for a short makespan.
  std::vector<int64_t> size(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    size[i] = j.migration ? timer.At(i, std::min(hosts[j.source].link_bytes_per_s, hosts[j.target].link_bytes_per_s))
                                .duration_ms
                          : j.drain_ms;
  }
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return size[a] > size[b]; });
  ScheduleResult r;
  r.batched = Batched(jobs, order, hosts, groups, timer);
  Pipeline pipe(jobs, hosts, groups, timer);
  // PLANNER.md: each action starts as soon as capacity allows (a migration slot
  // on both hosts, and its share of both links).
  r.pipelined = pipe.Run(order);
  FinalShares(jobs, hosts, r.batched);
  FinalShares(jobs, hosts, r.pipelined);
  if (r.pipelined.total_ms > r.batched.total_ms) {
    r.pipelined = r.batched;
    r.used_batched = true;
  }
  return r;
}

}  // namespace gpumigrate::planner
