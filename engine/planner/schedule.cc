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
    bool raised = false;  // a smaller share would break max stun
    for (uint32_t m = k; m >= 1; --m) {
      uint32_t ms = std::min(ks, m), md = std::min(kd, m);
      double bw = std::min(free(j.source) / ms, free(j.target) / md);
      if (bw < floor * (1 - 1e-12) && m > 1) continue;  // what is free, split fewer ways
      if (bw < floor * (1 - 1e-12) || (j.alone && bw < std::min(s.link_bytes_per_s, d.link_bytes_per_s))) {
        return false;
      }
      Timed t = timer_.At(i, bw);
      if (t.stun_ms > j.max_stun_ms && m > 1) {  // needs a larger share
        raised = true;
        continue;
      }
      if (t.stun_ms > j.max_stun_ms && !idle) return false;  // wait for more of the link
      JobTiming jt{now, t, bw, std::max({ms - 1, md - 1, others})};
      jt.whole_link = raised && m == 1;
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

// The schedule as the controller runs it (engine/evacuation/controller.cc
// StartWhatFits): each action in the schedule's order starts as soon as its
// hosts have a migration slot (and a link to itself when it needs one), and
// the links are shared as TCP shares them: each link divided evenly among the
// migrations moving bytes on it at every instant (a migration gets the smaller
// of its two links' parts), so one whose partner has ended speeds up; the
// controller starts them one at a time (Job::start_gap_ms apart). A
// migration first sets up (setup_ms, no bytes), moves its rounds' bytes, then
// its final round's (the stun: those bytes, then the fixed part), then tears
// down (teardown_ms, no bytes: the target's receive finishing); its source's
// slot frees when the teardown begins, its target's when it ends. Its bytes come from the
// model at the rate it got on the previous pass (two passes), so a migration
// that ran faster also dirtied less. Batched: a batch starts once the one
// before has ended. Group members never start before the reserved schedule
// started them (their stun windows were placed for min_serving there).
class Replay {
 public:
  Replay(const std::vector<Job>& jobs, const std::vector<HostLimit>& hosts, Timer& timer)
      : jobs_(jobs), hosts_(hosts), timer_(timer) {}

  void Run(Timing& t, bool batched) {
    std::vector<double> rate(jobs_.size(), 0);
    for (size_t i = 0; i < jobs_.size(); ++i) rate[i] = t.jobs[i].bandwidth_bytes_per_s;
    Timing planned = t;
    for (int pass = 0; pass < 2; ++pass) {
      Timing next = planned;
      if (!Simulate(planned, rate, batched, next)) return;  // keeps the reserved schedule
      for (size_t i = 0; i < jobs_.size(); ++i) rate[i] = avg_[i] > 0 ? avg_[i] : rate[i];
      t = next;
    }
  }

 private:
  struct Live {
    size_t i = 0;
    int phase = 0;  // 0 setup, 1 rounds, 2 final bytes, 3 fixed, 4 teardown
    double until = 0;  // phases 0, 3, 4: when it ends
    double left = 0;   // phases 1, 2: bytes left
    double start = 0, stun_from = 0, moved = 0, moving_ms = 0;
    bool source_freed = false;
    bool decided = false;      // its switchover was judged at the share it had then
    double final_bytes = -1;   // >= 0: its final round's bytes after one more round
  };

  // A pass as it runs: each host's migrations (all, and those that want its
  // link alone), the migrations running and still to start, and the clock.
  struct State {
    std::vector<uint32_t> busy, alone;
    std::vector<Live> live;
    std::vector<size_t> pending;
    double now = 0, batch_end = 0, ctl_free = 0;
    int64_t batch_start = -1;
  };

  // The job's figures at `bw`: setup, rounds' bytes, final bytes, fixed, teardown.
  struct Shape {
    double setup_ms, bytes, final_bytes, fixed_ms, teardown_ms;
  };
  Shape ShapeAt(size_t i, double bw) {
    const Timed t = timer_.At(i, bw);
    Shape s{static_cast<double>(t.setup_ms), 0, t.final_bytes, t.fixed_ms, static_cast<double>(t.teardown_ms)};
    if (s.final_bytes <= 0) {  // scaled or frame-buffer: the stun is its bytes at the share
      s.final_bytes = static_cast<double>(t.stun_ms) / 1e3 * bw;
      s.fixed_ms = 0;
    }
    const double rounds_ms = static_cast<double>(t.duration_ms - t.stun_ms - t.setup_ms - t.teardown_ms);
    s.bytes = std::max(0.0, rounds_ms) / 1e3 * bw;
    return s;
  }

  double RateOf(size_t i, const std::vector<uint32_t>& moving) const {
    const Job& j = jobs_[i];
    return std::min(hosts_[j.source].link_bytes_per_s / std::max(1u, moving[j.source]),
                    hosts_[j.target].link_bytes_per_s / std::max(1u, moving[j.target]));
  }

  bool Simulate(const Timing& planned, const std::vector<double>& rate, bool batched, Timing& out) {
    const std::vector<size_t> order = StartOrder(planned);
    std::vector<Shape> shape(jobs_.size());
    for (size_t i : order) {
      if (!(rate[i] > 0)) return false;
      shape[i] = ShapeAt(i, rate[i]);
    }
    avg_.assign(jobs_.size(), 0);
    State st;
    st.busy.assign(hosts_.size(), 0);
    st.alone.assign(hosts_.size(), 0);
    st.pending = order;
    for (int guard = 0; guard < 100000 && (!st.pending.empty() || !st.live.empty()); ++guard) {
      StartFitting(st, planned, shape, batched);
      if (st.live.empty()) {  // waits for a group window or the next batch
        double next = INFINITY;
        for (size_t i : st.pending) next = std::min(next, static_cast<double>(planned.jobs[i].start_ms));
        if (!std::isfinite(next) || next <= st.now) return false;
        st.now = next;
        continue;
      }
      // Phases that end without time (nothing to move, no fixed part) advance at
      // once; a migration that ended frees its slots before time moves on.
      bool moved_on = true;
      while (moved_on) {
        moved_on = false;
        for (Live& l : st.live) moved_on |= Advance(l, shape[l.i], st.now, out);
      }
      if (ReleaseEnded(st, planned)) continue;
      const std::vector<uint32_t> moving = MovingPerHost(st.live);
      JudgeSwitchovers(st.live, st.now, moving, rate);
      const double dt = NextStepMs(st.live, st.now, moving);
      MoveBytes(st.live, st.now, moving, dt, out);
      st.now += dt;
    }
    if (!st.pending.empty() || !st.live.empty()) return false;
    out.total_ms = 0;
    for (size_t i = 0; i < jobs_.size(); ++i) out.total_ms = std::max(out.total_ms, out.jobs[i].start_ms + out.jobs[i].t.duration_ms);
    return true;
  }

  // The migrations to replay, in the order the planned schedule started them.
  std::vector<size_t> StartOrder(const Timing& planned) const {
    std::vector<size_t> order;
    for (size_t i = 0; i < jobs_.size(); ++i) {
      if (jobs_[i].migration && jobs_[i].at) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return planned.jobs[a].start_ms < planned.jobs[b].start_ms; });
    return order;
  }

  // Starts what fits now, in order (a later one may overtake one that must wait).
  void StartFitting(State& st, const Timing& planned, const std::vector<Shape>& shape, bool batched) {
    for (auto it = st.pending.begin(); it != st.pending.end();) {
      const size_t i = *it;
      const Job& j = jobs_[i];
      const bool own = j.alone || planned.jobs[i].whole_link;
      bool fits = true;
      for (uint32_t h : {j.source, j.target}) {
        fits &= st.busy[h] < hosts_[h].max_migrations && !st.alone[h] && !(own && st.busy[h] > 0);
      }
      if (batched) {  // the next batch waits for the whole batch before it
        const int64_t b = planned.jobs[i].start_ms;
        fits &= b == st.batch_start || (st.live.empty() && st.now >= st.batch_end);
      } else if (j.group >= 0) {
        fits &= st.now >= static_cast<double>(planned.jobs[i].start_ms);
      }
      if (!fits) {
        ++it;
        continue;
      }
      if (batched) st.batch_start = planned.jobs[i].start_ms;
      for (uint32_t h : {j.source, j.target}) {
        ++st.busy[h];
        st.alone[h] += own;
      }
      Live l;
      l.i = i;
      l.start = std::max(st.now, st.ctl_free);  // the controller starts one at a time
      st.ctl_free = l.start + static_cast<double>(j.start_gap_ms);
      l.until = l.start + shape[i].setup_ms;
      st.live.push_back(l);
      it = st.pending.erase(it);
    }
  }

  // Frees the slots of the migrations that ended (the source's at its teardown,
  // the target's at its end); true if any did.
  bool ReleaseEnded(State& st, const Timing& planned) {
    bool ended = false;
    for (auto it = st.live.begin(); it != st.live.end();) {
      const Job& j = jobs_[it->i];
      const uint32_t own = j.alone || planned.jobs[it->i].whole_link;
      if (it->phase >= 4 && !it->source_freed) {
        // Its source is done: the controller starts the source's next migration
        // while the target's receive finishes (engine/evacuation/controller.cc, Busy).
        --st.busy[j.source];
        st.alone[j.source] -= own;
        it->source_freed = true;
        ended = true;
      }
      if (it->phase == 5) {
        --st.busy[j.target];
        st.alone[j.target] -= own;
        st.batch_end = std::max(st.batch_end, st.now);
        it = st.live.erase(it);
        ended = true;
      } else {
        ++it;
      }
    }
    return ended;
  }

  // How many migrations move bytes over each host's link now.
  std::vector<uint32_t> MovingPerHost(const std::vector<Live>& live) const {
    std::vector<uint32_t> moving(hosts_.size(), 0);
    for (const Live& l : live) {
      if (l.phase == 1 || l.phase == 2) {
        ++moving[jobs_[l.i].source];
        if (jobs_[l.i].target != jobs_[l.i].source) ++moving[jobs_[l.i].target];
      }
    }
    return moving;
  }

  // The engine judges its switchover at the link's present rate (when below
  // its rounds' average): a migration whose final round would start at a
  // share well below the rate its rounds were modelled at, and which the
  // model at that share takes through more rounds, runs one more round (the
  // bytes it would have sent in the stun) and then a final round of the
  // model's at that share. Shares are what `evacuate` paces them at.
  void JudgeSwitchovers(std::vector<Live>& live, double now, const std::vector<uint32_t>& moving,
                        const std::vector<double>& rate) {
    for (Live& l : live) {
      if (l.phase != 2 || l.decided || l.stun_from != now) continue;
      l.decided = true;
      const double r = RateOf(l.i, moving);
      if (!(r < 0.9 * rate[l.i]) || l.left <= 0) continue;
      const Shape lo = ShapeAt(l.i, r);
      if (lo.final_bytes < 0.8 * l.left) {
        l.phase = 1;
        l.final_bytes = lo.final_bytes;
      }
    }
  }

  // The time to the next event: a migration's bytes moved or its timed phase over (0 where none comes).
  double NextStepMs(const std::vector<Live>& live, double now, const std::vector<uint32_t>& moving) const {
    double dt = INFINITY;
    for (const Live& l : live) {
      if (l.phase == 1 || l.phase == 2) {
        dt = std::min(dt, l.left / RateOf(l.i, moving) * 1e3);
      } else if (l.phase != 5) {
        dt = std::min(dt, l.until - now);
      }
    }
    if (!std::isfinite(dt)) dt = 0;
    dt = std::max(dt, 0.0);
    return dt;
  }

  // Moves each moving migration's bytes over `dt` at its share of the links.
  void MoveBytes(std::vector<Live>& live, double now, const std::vector<uint32_t>& moving, double dt, Timing& out) {
    for (Live& l : live) {
      if (l.phase == 1 || l.phase == 2) {
        const double r = RateOf(l.i, moving);
        if (l.phase == 2 && l.stun_from == now && out.jobs[l.i].final_bandwidth_bytes_per_s == 0) {
          out.jobs[l.i].final_bandwidth_bytes_per_s = r;
          out.jobs[l.i].final_shared_with =
              std::max(moving[jobs_[l.i].source], moving[jobs_[l.i].target]) - 1;
        }
        l.left = std::max(0.0, l.left - r * dt / 1e3);
        l.moved += r * dt / 1e3;
        l.moving_ms += dt;
      }
    }
  }

  // Moves `l` into its next phase when the current one is done at `now`; true if it did.
  bool Advance(Live& l, const Shape& s, double now, Timing& out) {
    const double eps = 1e-6;
    JobTiming& jt = out.jobs[l.i];
    switch (l.phase) {
      case 0:
        if (l.until > now + eps) return false;
        l.phase = 1;
        l.left = s.bytes;
        return true;
      case 1:
        if (l.left > eps) return false;
        l.phase = 2;
        l.left = l.final_bytes >= 0 ? l.final_bytes : s.final_bytes;
        l.stun_from = now;
        jt.final_bandwidth_bytes_per_s = 0;  // set at the first instant it moves
        if (l.left <= eps) jt.final_bandwidth_bytes_per_s = RateAlone(l.i);
        return true;
      case 2:
        if (l.left > eps) return false;
        l.phase = 3;
        l.until = now + s.fixed_ms;
        return true;
      case 3: {
        if (l.until > now + eps) return false;
        l.phase = 4;
        l.until = now + s.teardown_ms;
        const auto stun = static_cast<int64_t>(std::ceil(now - l.stun_from - 1e-9));
        // A stun over max stun at this share: the engine runs another round
        // instead; the reserved schedule's figure stands.
        if (stun <= jobs_[l.i].max_stun_ms) jt.t.stun_ms = stun;
        return true;
      }
      case 4: {
        if (l.until > now + eps) return false;
        l.phase = 5;
        jt.start_ms = static_cast<int64_t>(std::ceil(l.start - 1e-9));  // rounded as the end is: no false overlap
        jt.t.duration_ms = static_cast<int64_t>(std::ceil(now - 1e-9)) - jt.start_ms;
        jt.t.stun_ms = std::min(jt.t.stun_ms, jt.t.duration_ms);
        // bandwidth_bytes_per_s stays the reserved share (what the schedule
        // decided with); the rate it really got shows in its times.
        avg_[l.i] = l.moving_ms > 0 ? l.moved / (l.moving_ms / 1e3) : 0;
        return true;
      }
      default:
        return false;
    }
  }

  double RateAlone(size_t i) const {
    const Job& j = jobs_[i];
    return std::min(hosts_[j.source].link_bytes_per_s, hosts_[j.target].link_bytes_per_s);
  }

  const std::vector<Job>& jobs_;
  const std::vector<HostLimit>& hosts_;
  Timer& timer_;
  std::vector<double> avg_;  // each job's average rate while it moved bytes, last pass
};

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
  // docs/planner.md: each action starts as soon as capacity allows (a migration slot
  // on both hosts, and its share of both links).
  r.pipelined = pipe.Run(order);
  Replay replay(jobs, hosts, timer);
  replay.Run(r.batched, true);
  replay.Run(r.pipelined, false);
  if (r.pipelined.total_ms > r.batched.total_ms) {
    r.pipelined = r.batched;
    r.used_batched = true;
  }
  return r;
}

}  // namespace gpumigrate::planner
