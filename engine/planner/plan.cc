// MakePlan: decisions (docs/planner.md's table), placement and schedule put together.
//
//   1. For every VM of the host: can it possibly live-migrate (not UVM, stun at
//      the source's whole link within its max stun)? Is it a stateless replica
//      that could be drained instead? Either way it wants a target slot.
//   2. Place all the slots wanted at once (placement.h: exact for small cases).
//   3. Decide with the target known: the stun at the share of the link the
//      migration will get (alone on the link if only that fits), drain when the
//      stun is too long, a stun would take the group below min_serving, or
//      draining is quicker; power-off for UVM when allowed; blocked otherwise,
//      with the rule that failed.
//   4. Re-derive the link shares from the migrations that remain, then schedule.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "engine/planner/fleet.h"
#include "engine/planner/placement.h"
#include "engine/planner/schedule.h"
#include "engine/planner/stun.h"
#include "gpumigrate/planner/planner.h"

namespace gpumigrate::planner {

std::string_view ActionName(Action a) {
  switch (a) {
    case Action::kLiveMigrate: return "live-migrate";
    case Action::kDrainAndReplace: return "drain-and-replace";
    case Action::kPowerOff: return "power-off";
    case Action::kBlocked: return "blocked";
  }
  return "unknown";
}

namespace {

double Ms(std::chrono::nanoseconds d) { return std::chrono::duration<double, std::milli>(d).count(); }
int64_t CeilMs(double ms) { return static_cast<int64_t>(std::ceil(ms - 1e-9)); }

// One VM of the evacuated host while it is planned.
struct Work {
  const Vm* vm = nullptr;
  double max_stun_ms = 0;
  std::chrono::nanoseconds max_stun{0};
  int32_t group = -1;
  bool replica = false;  // stateless-inference in a group: may be drained and replaced
  bool wants_slot = false;
  std::string fixed_block;  // from an earlier placement round: blocked for this, with no slot wanted
  int32_t need = -1;
  std::optional<Slot> slot;
  bool placement_failed = false;
  bool link_short = false;  // some targets were ruled out for it by their link
  bool link_only = false;   // all of them were: not a capacity shortfall
  Action action = Action::kBlocked;
  StunAt at, at_alone;
  double bw = 0;
  bool alone = false;
  double pair_bw = 0, pair_stun_ms = 0;  // the share beside one other migration, and the stun there
  uint32_t shared_with = 0;
  double final_bw = 0;  // the final round's share (schedule.h)
  uint32_t final_shared_with = 0;
  std::string why;  // the decision's own words (completed after the schedule)
  int32_t job = -1;
};

class Planner {
 public:
  Planner(const Inventory& inv, const PlanOptions& o, uint32_t host)
      : inv_(inv), opts_(o), host_(host), fleet_(inv, inv.hosts[host].name) {}

  Plan Run() {
    Collect();
    // A VM that wanted a slot may still end blocked or powered off (its target's
    // link is slower, its group forbids the stun): when that cost another VM its
    // slot, place again without it.
    for (int round = 0; round < 4; ++round) {
      PlaceSlots();
      Decide();
      bool short_of_slots = false, unused_slot = false;
      for (const Work& w : work_) {
        short_of_slots |= w.placement_failed;
        unused_slot |= w.slot && w.action != Action::kLiveMigrate && w.action != Action::kDrainAndReplace;
      }
      if (!short_of_slots || !unused_slot) break;
      for (Work& w : work_) {
        if (w.slot && w.action != Action::kLiveMigrate && w.action != Action::kDrainAndReplace) {
          w.wants_slot = false;
          w.fixed_block = w.why;
        }
        Work fresh{w.vm, w.max_stun_ms, w.max_stun, w.group, w.replica, w.wants_slot, w.fixed_block};
        fresh.at_alone = w.at_alone;
        w = std::move(fresh);
      }
      fleet_ = Fleet(inv_, source().name);
      needs_.clear();
      std::fill(powered_off_.begin(), powered_off_.end(), 0);
    }
    ShareLinks();
    return Finish();
  }

 private:
  const Host& source() const { return inv_.hosts[host_]; }
  const Group& group(const Work& w) const { return inv_.groups[w.group]; }

  void Collect() {
    serving_.assign(inv_.groups.size(), 0);
    for (const Vm& vm : inv_.vms) {
      if (!vm.group.empty()) ++serving_[GroupIndex(vm.group)];
    }
    powered_off_.assign(inv_.groups.size(), 0);
    for (const Vm& vm : inv_.vms) {
      if (vm.host != source().name) continue;
      Work w;
      w.vm = &vm;
      w.max_stun = vm.max_stun.value_or(inv_.policy.max_stun);
      w.max_stun_ms = Ms(w.max_stun);
      if (!vm.group.empty()) w.group = GroupIndex(vm.group);
      w.replica = w.group >= 0 && vm.vm_class == VmClass::kStatelessInference;
      // The whole source link is the most any migration of this VM can get.
      bool could_migrate =
          !vm.uvm && PredictStunAt(vm, source().link_bytes_per_s, w.max_stun).stun_ms <= w.max_stun_ms;
      w.wants_slot = could_migrate || w.replica;
      work_.push_back(std::move(w));
    }
  }

  int32_t GroupIndex(const std::string& name) const {
    for (size_t i = 0; i < inv_.groups.size(); ++i) {
      if (inv_.groups[i].name == name) return static_cast<int32_t>(i);
    }
    return -1;
  }

  void PlaceSlots() {
    for (Work& w : work_) {
      if (!w.wants_slot) continue;
      w.need = static_cast<int32_t>(needs_.size());
      needs_.push_back(NeedOf(inv_, *w.vm));
      // A VM that can only live-migrate may take a slot only where its stun, at
      // that target's link alone, fits: elsewhere the slot is of no use to it
      // and may be the one another VM needed. (A replica may still drain.)
      if (!w.replica) needs_.back().target_ok = LinkOk(w);
    }
    PlacementResult r = Place(fleet_, needs_, opts_.search_budget);
    search_exact_ = r.exact;
    evaluations_ = r.evaluations;
    for (Work& w : work_) {
      if (w.need < 0) continue;
      w.slot = r.slots.empty() ? std::nullopt : r.slots[w.need];
      w.placement_failed = !w.slot;
    }
  }

  // Per host: whether w's stun at min(source link, that host's link), the most
  // a migration to it can get, is within w's max stun.
  std::vector<uint8_t> LinkOk(const Work& w) const {
    std::vector<uint8_t> ok(inv_.hosts.size(), 0);
    for (uint32_t h : fleet_.targets()) ok[h] = StunAlone(w, h).stun_ms <= w.max_stun_ms ? 1 : 0;
    return ok;
  }

  StunAt StunAlone(const Work& w, uint32_t h) const {
    return PredictStunAt(*w.vm, std::min(source().link_bytes_per_s, inv_.hosts[h].link_bytes_per_s), w.max_stun,
                         inv_.hosts[h].Holds(w.vm->model));
  }

  // The targets with w's model that its stun rules out: "slow (120 s at 25 Gbit)".
  // Leaves in w.at_alone the stun on the fastest of them.
  std::vector<std::string> TooSlow(Work& w) const {
    std::vector<std::string> out;
    const SlotNeed& n = needs_[w.need];
    for (uint32_t h : fleet_.targets()) {
      if (n.TargetOk(h)) continue;
      const Host& t = inv_.hosts[h];
      bool has_model = std::any_of(t.gpus.begin(), t.gpus.end(), [&](const Gpu& g) { return g.model == n.model->name; });
      if (!has_model) continue;
      StunAt at = StunAlone(w, h);
      if (w.at_alone.basis.empty() || at.stun_ms < w.at_alone.stun_ms) w.at_alone = at;
      out.push_back(fmt::format("{} ({} at {})", t.name, Seconds(at.stun_ms),
                                Gbit(std::min(source().link_bytes_per_s, t.link_bytes_per_s))));
    }
    return out;
  }

  // Migrations (as far as known) touching host h, for the link share.
  uint32_t Share(uint32_t h, uint32_t migrations) const {
    return std::max<uint32_t>(1, std::min(inv_.hosts[h].max_migrations, migrations));
  }

  double SharedBandwidth(const Work& w, const std::vector<uint32_t>& count, uint32_t* sharers) const {
    uint32_t t = w.slot->host;
    // Every migration comes from the source, so a target never has more at once
    // than the source's max_migrations either.
    uint32_t ks = Share(host_, count[host_]);
    uint32_t kt = Share(t, std::min(count[t], source().max_migrations));
    double s_bw = source().link_bytes_per_s / ks;
    double t_bw = inv_.hosts[t].link_bytes_per_s / kt;
    if (sharers) *sharers = (s_bw <= t_bw ? ks : kt) - 1;
    return std::min(s_bw, t_bw);
  }

  double AloneBandwidth(const Work& w) const {
    return std::min(source().link_bytes_per_s, inv_.hosts[w.slot->host].link_bytes_per_s);
  }

  void Decide() {
    // Pessimistic shares: every VM with a slot that is not UVM might migrate.
    std::vector<uint32_t> count(inv_.hosts.size(), 0);
    for (const Work& w : work_) {
      if (w.slot && !w.vm->uvm) {
        ++count[host_];
        ++count[w.slot->host];
      }
    }
    for (Work& w : work_) {
      const Vm& vm = *w.vm;
      if (!w.fixed_block.empty()) {
        Block(w, w.fixed_block);
        continue;
      }
      if (w.slot) {
        w.at_alone = PredictStunAt(vm, AloneBandwidth(w), w.max_stun);
        StunAt shared = PredictStunAt(vm, SharedBandwidth(w, count, nullptr), w.max_stun);
        bool migratable = !vm.uvm && w.at_alone.stun_ms <= w.max_stun_ms;
        const StunAt& mig = shared.stun_ms <= w.max_stun_ms ? shared : w.at_alone;
        bool stun_keeps_group = w.group < 0 || serving_[w.group] >= group(w).min_serving + 1;
        if (w.replica && serving_[w.group] >= group(w).min_serving) {
          const Group& g = group(w);
          double drain_ms = Ms(g.replica_start) + Ms(g.drain);
          if (!migratable) {
            Drain(w, vm.uvm ? UvmText(vm) + ", so it cannot be live-migrated"
                            : fmt::format("predicted stun {} even with the {} link alone ({})",
                                          StunOver(CeilMs(w.at_alone.stun_ms), w.max_stun_ms),
                                          Gbit(AloneBandwidth(w)), BasisText(vm, w.at_alone)));
          } else if (!stun_keeps_group) {
            Drain(w, fmt::format("its {} live-migration stun would leave group {} with {} serving, below {}",
                                 Seconds(mig.stun_ms), g.name, serving_[w.group] - 1, g.min_serving));
          } else if (drain_ms <= mig.total_ms) {
            Drain(w, fmt::format("draining ({} replica start + {} drain) is quicker than migrating ({}) and has "
                                 "no stun",
                                 Seconds(Ms(g.replica_start)), Seconds(Ms(g.drain)), Seconds(mig.total_ms)));
          } else {
            w.action = Action::kLiveMigrate;
          }
          continue;
        }
        if (w.replica) {  // the group is already below min_serving
          const Group& g = group(w);
          Block(w, fmt::format("group {} would stay below {} serving: it has {}, already fewer than its "
                               "min_serving, and neither a drain nor a migration keeps it at {} at every moment",
                               g.name, g.min_serving, serving_[w.group], g.min_serving));
          continue;
        }
        if (migratable && stun_keeps_group) {
          w.action = Action::kLiveMigrate;
          continue;
        }
        if (migratable) {
          const Group& g = group(w);
          Block(w, fmt::format("group {} would fall below {} serving: it has {}, and the {} stun of a live "
                               "migration takes one away{}",
                               g.name, g.min_serving, serving_[w.group], Seconds(mig.stun_ms),
                               w.replica ? "" : "; only a stateless-inference replica can be drained instead"));
          continue;
        }
        if (!vm.uvm) {  // the stun fits the source's link, not the target's
          const Host& t = inv_.hosts[w.slot->host];
          Block(w, fmt::format("predicted stun {} even with the link alone ({} from {} to {}, the best target "
                               "with room; {}), and it is not a stateless-inference replica that could be drained "
                               "instead (class {}{})",
                               StunOver(CeilMs(w.at_alone.stun_ms), w.max_stun_ms), Gbit(AloneBandwidth(w)),
                               source().name, t.name, BasisText(vm, w.at_alone), ClassName(vm.vm_class),
                               w.group >= 0 ? "" : ", no group"));
          continue;
        }
      }
      NoSlot(w);
    }
  }

  std::string UvmText(const Vm& vm) const {
    return vm.uvm_implied ? "it uses Unified Virtual Memory (every multi-GPU vGPU VM does)"
                          : "it uses Unified Virtual Memory";
  }

  void Drain(Work& w, std::string why) {
    w.action = Action::kDrainAndReplace;
    w.why = std::move(why);
  }

  void Block(Work& w, std::string why) {
    w.action = Action::kBlocked;
    w.why = std::move(why);
  }

  // No target slot is used: power-off (UVM), or blocked with the rule that failed.
  void NoSlot(Work& w) {
    const Vm& vm = *w.vm;
    std::string no_slot = w.placement_failed ? ShortfallText(fleet_, needs_[w.need]) : "";
    if (w.placement_failed) {
      std::vector<std::string> slow = TooSlow(w);
      if (!slow.empty()) {
        w.link_short = true;
        const SlotNeed& n = needs_[w.need];
        w.link_only = std::none_of(fleet_.targets().begin(), fleet_.targets().end(),
                                   [&](uint32_t h) { return n.TargetOk(h); });
        no_slot = fmt::format("{}; predicted stun > {} even with the link alone on {} ({}), and it is not a "
                              "stateless-inference replica that could be drained instead (class {}{})",
                              no_slot, Seconds(w.max_stun_ms), fmt::join(slow, ", "), BasisText(vm, w.at_alone),
                              ClassName(vm.vm_class), w.group >= 0 ? "" : ", no group");
      }
    }
    if (vm.uvm) {
      std::string why = UvmText(vm) + ", which cannot be live-migrated";
      if (w.replica && w.placement_failed) why += fmt::format("; no slot for a replacement replica: {}", no_slot);
      if (!(opts_.allow_power_off || inv_.policy.allow_power_off)) {
        return Block(w, why + "; power-off is not allowed (set policy.allow_power_off or pass --allow-power-off)");
      }
      if (w.group >= 0 && serving_[w.group] < group(w).min_serving + powered_off_[w.group] + 1) {
        return Block(w, why + fmt::format("; powering it off: group {} would fall below {} serving ({} left)",
                                          group(w).name, group(w).min_serving,
                                          serving_[w.group] - powered_off_[w.group] - 1));
      }
      if (w.group >= 0) ++powered_off_[w.group];
      w.action = Action::kPowerOff;
      w.why = why;
      return;
    }
    if (w.placement_failed) return Block(w, no_slot);
    StunAt at = PredictStunAt(vm, source().link_bytes_per_s, w.max_stun);
    w.at_alone = at;
    Block(w, fmt::format("predicted stun {} even with the {} link alone ({}), and it is not a "
                         "stateless-inference replica that could be drained instead (class {}{})",
                         StunOver(CeilMs(at.stun_ms), w.max_stun_ms), Gbit(source().link_bytes_per_s),
                         BasisText(vm, at), ClassName(vm.vm_class), w.group >= 0 ? "" : ", no group"));
  }

  static std::string_view ClassName(VmClass c) {
    switch (c) {
      case VmClass::kInference: return "inference";
      case VmClass::kStatelessInference: return "stateless-inference";
      case VmClass::kTraining: return "training";
      case VmClass::kGraphics: return "graphics";
    }
    return "?";
  }

  // Releases the slots no action uses, and marks the migrations that cannot
  // share a link with even one other: they run with both links to themselves.
  void ShareLinks() {
    for (Work& w : work_) {
      if (w.slot && w.action != Action::kLiveMigrate && w.action != Action::kDrainAndReplace) {
        fleet_.Undo(needs_[w.need], *w.slot);
        w.slot.reset();
      }
      if (w.action != Action::kLiveMigrate) continue;
      const Host& t = inv_.hosts[w.slot->host];
      double pair = std::min(source().link_bytes_per_s / std::min(2u, source().max_migrations),
                             t.link_bytes_per_s / std::min({2u, t.max_migrations, source().max_migrations}));
      w.at = PredictStunAt(*w.vm, pair, w.max_stun, t.Holds(w.vm->model));
      w.alone = w.at.stun_ms > w.max_stun_ms && pair < AloneBandwidth(w);
      w.pair_bw = pair;
      w.pair_stun_ms = w.at.stun_ms;
    }
  }

  // One schedulable job per migration or drain-and-replace (w.job indexes it).
  std::vector<Job> MakeJobs() {
    std::vector<Job> jobs;
    for (Work& w : work_) {
      Job job;
      job.source = host_;
      job.group = w.group;
      if (w.action == Action::kLiveMigrate) {
        job.target = w.slot->host;
        job.alone = w.alone;
        job.start_gap_ms = CeilMs(std::chrono::duration<double, std::milli>(inv_.policy.start_interval).count());
        job.max_stun_ms = static_cast<int64_t>(std::floor(w.max_stun_ms));
        const Vm* vm = w.vm;
        std::chrono::nanoseconds max_stun = w.max_stun;
        const bool holds = inv_.hosts[job.target].Holds(vm->model);
        const int64_t overhead = CeilMs(std::chrono::duration<double, std::milli>(inv_.policy.migration_overhead).count());
        job.at = [vm, max_stun, overhead, holds](double bw) {
          StunAt a = PredictStunAt(*vm, bw, max_stun, holds);
          // A third of the overhead before the transfer (processes starting), the
          // rest after it (the source's process ending, the target's receive finishing).
          return Timed{CeilMs(a.total_ms) + overhead, CeilMs(a.stun_ms), a.final_bytes, a.fixed_ms, overhead / 3,
                       overhead - overhead / 3};
        };
      } else if (w.action == Action::kDrainAndReplace) {
        const Group& g = group(w);
        job.migration = false;
        job.target = w.slot->host;
        job.drain_ms = CeilMs(Ms(g.replica_start) + Ms(g.drain));
      } else {
        continue;
      }
      w.job = static_cast<int32_t>(jobs.size());
      jobs.push_back(std::move(job));
    }
    return jobs;
  }

  // Schedules the jobs under the hosts' and groups' limits; each migration then
  // takes the bandwidth and stun of its place in the schedule.
  ScheduleResult ScheduleJobs(const std::vector<Job>& jobs) {
    std::vector<HostLimit> limits_of_hosts;
    for (const Host& h : inv_.hosts) limits_of_hosts.push_back({h.max_migrations, h.link_bytes_per_s});
    std::vector<GroupLimit> limits;
    for (size_t g = 0; g < inv_.groups.size(); ++g) limits.push_back({serving_[g], inv_.groups[g].min_serving});
    ScheduleResult sched = Schedule(jobs, limits_of_hosts, limits);
    for (Work& w : work_) {
      if (w.job < 0 || w.action != Action::kLiveMigrate) continue;
      const JobTiming& jt = sched.pipelined.jobs[w.job];
      w.bw = jt.bandwidth_bytes_per_s;
      w.shared_with = jt.shared_with;
      w.final_bw = jt.final_bandwidth_bytes_per_s;
      w.final_shared_with = jt.final_shared_with;
      w.at = PredictStunAt(*w.vm, w.bw, w.max_stun, inv_.hosts[w.slot->host].Holds(w.vm->model));
      w.at.stun_ms = static_cast<double>(jt.t.stun_ms);  // the text says what the JSON does
    }
    return sched;
  }

  // The plan's line for one VM, with its times, target and reason.
  PlannedAction ActionOf(const Work& w, const ScheduleResult& sched, int64_t plan_total_ms) const {
    PlannedAction a;
    a.vm = w.vm->name;
    a.action = w.action;
    if (w.job >= 0) {
      const JobTiming& jt = sched.pipelined.jobs[w.job];
      a.start_ms = jt.start_ms;
      a.end_ms = jt.start_ms + jt.t.duration_ms;
    }
    if (w.slot) {
      const Host& t = inv_.hosts[w.slot->host];
      Target to{t.name, {}, w.slot->start};
      for (uint32_t pos : w.slot->gpu_pos) to.gpus.push_back(t.gpus[pos].index);
      a.to = std::move(to);
    }
    switch (w.action) {
      case Action::kLiveMigrate:
        a.predicted_stun_ms = sched.pipelined.jobs[w.job].t.stun_ms;
        a.bandwidth_bytes_per_s = w.bw;
        a.link_shared_with = w.shared_with;
        a.final_bandwidth_bytes_per_s = w.final_bw;
        a.final_shared_with = w.final_shared_with;
        a.link_alone = w.alone;
        a.stun_basis = w.at.basis;
        a.budget_ms = std::max<int64_t>(
            CeilMs(inv_.policy.budget_factor * static_cast<double>(a.end_ms - a.start_ms)),
            std::chrono::duration_cast<std::chrono::milliseconds>(inv_.policy.budget_min).count());
        a.reason = MigrateText(w);
        break;
      case Action::kDrainAndReplace: {
        const Group& g = group(w);
        a.reason = fmt::format("{}; stateless replica of group {}: a replacement starts on {} (ready after {}), "
                               "then this one drains ({}); {} keeps at least {} serving throughout",
                               w.why, g.name, a.to->host, Seconds(Ms(g.replica_start)), Seconds(Ms(g.drain)),
                               g.name, g.min_serving);
        break;
      }
      case Action::kPowerOff:
        a.start_ms = a.end_ms = plan_total_ms;
        a.reason = fmt::format("{}; powered off at {} once the other actions are done, so it serves as long as "
                               "possible (allowed by {})",
                               w.why, Seconds(static_cast<double>(plan_total_ms)),
                               opts_.allow_power_off ? "--allow-power-off" : "policy.allow_power_off");
        break;
      case Action::kBlocked:
        a.predicted_stun_ms = w.at_alone.basis.empty() ? 0 : CeilMs(w.at_alone.stun_ms);
        a.reason = w.why;
        break;
    }
    return a;
  }

  // Feasible when nothing is blocked; else why, with any capacity shortfall first.
  void SetFeasibility(Plan& plan) const {
    std::vector<std::string> blocked, short_of;
    for (const Work& w : work_) {
      if (w.action != Action::kBlocked) continue;
      blocked.push_back(fmt::format("{}: {}", w.vm->name, w.why));
      if (w.placement_failed && !w.vm->uvm && !w.link_only) {
        short_of.push_back(fmt::format("{} ({})", w.vm->name, w.vm->profile));
      }
    }
    plan.feasible = blocked.empty();
    if (plan.feasible) return;
    std::string capacity =
        short_of.empty() ? ""
                         : fmt::format("capacity shortfall: the hosts that remain cannot absorb {} of {}'s VMs ({}); ",
                                       short_of.size(), plan.host, fmt::format("{}", fmt::join(short_of, ", ")));
    plan.reason = fmt::format("{}{} of {} VMs blocked: {}", capacity, blocked.size(), plan.actions.size(),
                              fmt::join(blocked, "; "));
  }

  Plan Finish() {
    ScheduleResult sched = ScheduleJobs(MakeJobs());
    Plan plan;
    plan.host = source().name;
    plan.total_ms = sched.pipelined.total_ms;
    plan.batched_total_ms = sched.batched.total_ms;
    plan.search_exact = search_exact_;
    plan.search_evaluations = evaluations_;
    plan.used_batched = sched.used_batched;
    for (const Work& w : work_) plan.actions.push_back(ActionOf(w, sched, plan.total_ms));
    SetFeasibility(plan);
    return plan;
  }

  std::string MigrateText(const Work& w) const {
    std::string link = w.alone ? fmt::format("{} with the link to itself", Gbit(w.bw))
                       : w.shared_with == 0
                           ? fmt::format("{} (link not shared)", Gbit(w.bw))
                           : fmt::format("{} (link shared with {} other{})", Gbit(w.bw), w.shared_with,
                                         w.shared_with == 1 ? "" : "s");
    std::string text = fmt::format("predicted stun {} at {} is within {}", Seconds(w.at.stun_ms), link,
                                   Seconds(w.max_stun_ms));
    if (w.at.final_bytes > 0) {  // re-predicted at its final round's share (schedule.h)
      text += w.final_shared_with == 0
                  ? fmt::format(" (its final round at {}, no other migration on its links then)", Gbit(w.final_bw))
                  : fmt::format(" (its final round at {}, beside {} other migration{} then)", Gbit(w.final_bw),
                                w.final_shared_with, w.final_shared_with == 1 ? "" : "s");
    }
    if (w.alone) {
      text += fmt::format("; it runs alone: sharing the link ({} beside one other migration) would make its stun {}",
                          Gbit(w.pair_bw), Seconds(w.pair_stun_ms));
    }
    text += fmt::format("; {}", BasisText(*w.vm, w.at));
    if (w.group >= 0) {
      text += fmt::format("; group {} keeps at least {} serving during its stun", group(w).name,
                          group(w).min_serving);
    }
    return text;
  }

  const Inventory& inv_;
  const PlanOptions& opts_;
  uint32_t host_;
  Fleet fleet_;
  std::vector<Work> work_;
  std::vector<SlotNeed> needs_;
  std::vector<uint32_t> serving_, powered_off_;
  bool search_exact_ = true;
  uint64_t evaluations_ = 0;
};

}  // namespace

Result<Plan> MakePlan(const Inventory& inv, const PlanOptions& options) {
  const Host* h = inv.FindHost(options.evacuate);
  if (!h) {
    std::vector<std::string> names;
    for (const Host& x : inv.hosts) names.push_back(x.name);
    return InvalidArgument(fmt::format("--evacuate: no host '{}' in the inventory (hosts: {})", options.evacuate,
                                       fmt::join(names, ", ")));
  }
  // Every figure of the plan is at the payload rate the links really carry.
  Inventory payload = inv;
  for (Host& x : payload.hosts) x.link_bytes_per_s *= inv.policy.link_efficiency;
  return Planner(payload, options, static_cast<uint32_t>(h - inv.hosts.data())).Run();
}

}  // namespace gpumigrate::planner
