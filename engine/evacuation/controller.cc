// The evacuation controller (include/gpumigrate/evacuation/evacuation.h): a plan run through
// the hosts' agents, journaled and reserved in the store, re-planned on failure,
// continued from the journal after a restart.
#include "gpumigrate/evacuation/evacuation.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "engine/evacuation/fleet.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {
namespace evacuation {

// Named, not anonymous: Evacuation::Impl (external linkage) holds them.
using SteadyClock = std::chrono::steady_clock;

// Where an action is: a live migration's source migrating, then its
// destination's receive confirming; a drain-and-replace's replacement
// starting, then the old replica draining; a power-off.
enum class ActionPhase { kMigrate, kConfirm, kReplica, kDrain, kPowerOff };

inline std::string_view ActionPhaseName(ActionPhase p) {
  switch (p) {
    case ActionPhase::kMigrate:
      return "migrate";
    case ActionPhase::kConfirm:
      return "confirm";
    case ActionPhase::kReplica:
      return "replica";
    case ActionPhase::kDrain:
      return "drain";
    case ActionPhase::kPowerOff:
      break;
  }
  return "power-off";
}

// One action being carried out.
struct Running {
  planner::PlannedAction a;
  std::string source, target;
  ActionPhase phase = ActionPhase::kMigrate;
  int64_t src_job = 0, dst_job = 0;
  std::string reservation;
  std::string last_line;
  SteadyClock::time_point last_print{}, last_ok = SteadyClock::now(), confirm_since{};
  SteadyClock::time_point started = SteadyClock::now();
  double paced = 0;  // the share its source agent paces it at (bytes/s); 0: not yet, -1: it cannot be paced
  std::string session_phase;  // the migrate session's phase, as the source agent reports it ("": not yet)
  bool phase_reported = false;  // the agent reports session phases at all
  std::string evented_phase;    // the phase and round last written as an event
  int64_t evented_round = -1;
};

}  // namespace evacuation

using evacuation::Fleet;
using evacuation::InFlight;
using evacuation::ReplicaName;
using evacuation::ActionPhase;
using evacuation::ActionPhaseName;
using evacuation::Running;
using Json = agent::Json;
using SteadyClock = std::chrono::steady_clock;

class Evacuation::Impl {
 public:
  Impl(EvacuationOptions o, Fleet fleet, agent::Client& agents)
      : f_(std::move(o)), fleet_(std::move(fleet)), agents_(agents) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    controller_ = fmt::format("{}:{}", host, getpid());
  }

  void OnLine(std::function<void(const std::string&)> f) { on_line_ = std::move(f); }

  Result<planner::Plan> PlanNow() {
    GM_RETURN_IF_ERROR(fleet_.Refresh({}, f_.host));
    return fleet_.PlanFor(f_.host, f_.allow_power_off);
  }

  EvacuationSummary Run(std::optional<planner::Plan> given, EvacuationStore& store, EvacuationEvents* events,
                        const std::atomic<bool>& cancel) {
    store_ = &store;
    events_ = events;
    cancel_ = &cancel;
    EvacuationSummary s;
    s.exit_code = RunPlan(std::move(given));
    s.error = error_;
    s.vms = done_;
    return s;
  }

 private:
  int RunPlan(std::optional<planner::Plan> given) {
    for (const auto& n : store_->Notes()) Say("store: {}", n);
    // What an earlier controller of this evacuation left.
    auto journal = store_->Journal(f_.id);
    if (!journal.ok()) return Fail(journal.status());
    if (Status st = fleet_.Refresh({}, f_.host); !st.ok()) return Fail(st);
    std::map<std::string, planner::Target> started_at;  // each VM's last kStarted target
    for (const auto& e : *journal) {
      const size_t at = e.detail.find("; target {");
      if (e.phase != JournalPhase::kStarted || at == std::string::npos) continue;
      Json t = Json::parse(e.detail.substr(at + 9), nullptr, false);
      if (t.is_object() && t.contains("host") && t["host"].is_string() && t.contains("gpus") && t["gpus"].is_array()) {
        planner::Target target;
        target.host = t["host"];
        for (const auto& g : t["gpus"]) {
          if (g.is_number_unsigned()) target.gpus.push_back(g.get<uint32_t>());
        }
        if (t.contains("placement") && t["placement"].is_number_unsigned()) target.placement = t["placement"].get<uint32_t>();
        started_at[e.vm] = target;
      }
    }
    for (const auto& s : SummarizeJournal(*journal)) {
      if (s.finished() && fleet_.On(s.vm, f_.host)) {
        // Moved away by this evacuation once and back on the host since (the
        // same --id reused, as maintenance-mode does): planned anew.
        Say("{}: completed earlier, and back on {} since: planned anew", s.vm, f_.host);
      } else if (s.finished()) {
        Finish({s.vm, s.action, s.target, VmResult::kCompleted, "completed earlier (journal)"}, false);
      } else if (s.needs_operator()) {
        Finish({s.vm, s.action, s.target, VmResult::kInDoubt, "in doubt earlier (journal): an operator resolves it"}, false);
      } else if (s.unresolved()) {
        if (Status st = Resolve(s, started_at.count(s.vm) ? started_at[s.vm] : planner::Target{}); !st.ok()) {
          return Fail(st);
        }
      }
      attempts_[s.vm] = s.attempts;
    }
    if (!running_.empty() || !done_.empty()) Say("continuing evacuation {} from its journal", f_.id);
    if (Status st = RefreshForPlan(); !st.ok()) return Fail(st);
    planner::Plan plan;
    if (given && done_.empty() && running_.empty()) {
      plan = *given;
    } else {
      auto p = fleet_.PlanFor(f_.host, f_.allow_power_off);
      if (!p.ok()) return Fail(p.status());
      plan = *p;
    }
    Say("plan: {} ({} actions, predicted {:.1f} s)", plan.feasible ? "feasible" : "NOT feasible", plan.actions.size(),
        plan.total_ms / 1000.0);
    if (!plan.feasible && done_.empty() && running_.empty()) {
      for (const auto& a : plan.actions) {
        if (a.action == planner::Action::kBlocked) Say("  {}: blocked: {}", a.vm, a.reason);
      }
      Say("refused: {}; nothing was moved", plan.reason.empty() ? "the plan is not feasible" : plan.reason);
      Event("refused", {{"reason", plan.reason.empty() ? "the plan is not feasible" : plan.reason}});
      return Summary(1);
    }
    Take(plan, "");
    Loop();
    AccountForTheRest();
    return Summary(0);
  }

  template <typename... Args>
  void Say(fmt::format_string<Args...> format, Args&&... args) {
    if (on_line_) on_line_(fmt::format(format, std::forward<Args>(args)...));
  }

  int Fail(const Status& s) {
    error_ = std::string(s.message());
    return 2;
  }

  // One line of --events (evacuation_events.h has the schema).
  void Event(std::string_view type, const Json& fields) {
    if (events_) events_->Emit(type, fields);
  }
  void HookEvent(const std::string& vm, const char* hook, const std::string& on, const char* state) {
    Event("hook", {{"vm", vm}, {"hook", hook}, {"on", on}, {"state", state}});
  }

  Status Journal(const std::string& vm, const std::string& action, JournalPhase phase, const std::string& target,
                 const std::string& detail) {
    JournalEntry e;
    e.evacuation = f_.id;
    e.controller = controller_;
    e.vm = vm;
    e.action = action;
    e.phase = phase;
    e.target = target;
    e.detail = detail;
    auto r = store_->Append(e);
    return r.ok() ? Status::Ok() : r.status();
  }

  bool Settled(const std::string& vm) const {
    for (const auto& o : done_) {
      if (o.vm == vm) return true;
    }
    for (const auto& r : running_) {
      if (r.a.vm == vm) return true;
    }
    return false;
  }

  std::vector<InFlight> Moving() const {
    std::vector<InFlight> v;
    for (const auto& r : running_) {
      if (r.a.to) v.push_back({r.a.vm, r.source, *r.a.to, r.a.action == planner::Action::kDrainAndReplace});
    }
    return v;
  }

  // The fleet as a plan must see it: this evacuation's VMs in flight at their
  // targets, and the slots other evacuations hold in the store taken.
  Status RefreshForPlan() {
    std::vector<Reservation> elsewhere;
    auto all = store_->Reservations();
    if (!all.ok()) return all.status();
    for (auto& r : *all) {
      if (r.evacuation != f_.id) elsewhere.push_back(std::move(r));
    }
    return fleet_.Refresh(Moving(), f_.host, elsewhere);
  }

  // The plan's actions for VMs not yet settled become the queue.
  void Take(const planner::Plan& plan, const std::string& why) {
    pending_.clear();
    std::vector<planner::PlannedAction> order = plan.actions;
    std::stable_sort(order.begin(), order.end(), [](const auto& x, const auto& y) { return x.start_ms < y.start_ms; });
    for (const auto& a : order) {
      if (Settled(a.vm)) continue;
      const std::string target = a.to ? a.to->host : "";
      if (!why.empty()) (void)Journal(a.vm, std::string(planner::ActionName(a.action)), JournalPhase::kReplanned, target, why);
      (void)Journal(a.vm, std::string(planner::ActionName(a.action)), JournalPhase::kPlanned, target, a.reason);
      if (a.action == planner::Action::kBlocked) {
        Finish({a.vm, "blocked", "", VmResult::kBlocked, a.reason, a.predicted_stun_ms}, false);
      } else if (fleet_.Held(a.vm)) {
        Finish({a.vm, std::string(planner::ActionName(a.action)), target, VmResult::kInDoubt,
                "held on its host: " + fleet_.HeldWhy(a.vm)},
               false);
      } else {
        pending_.push_back(a);
      }
    }
    Json actions = Json::array();
    for (const auto& a : pending_) {
      Say("  {:<14} {:<18} -> {:<8} predicted stun {}", a.vm, planner::ActionName(a.action), a.to ? a.to->host : "-",
          a.action == planner::Action::kLiveMigrate ? fmt::format("{:.2f} s", a.predicted_stun_ms / 1000.0) : "-");
      actions.push_back({{"vm", a.vm},
                         {"action", planner::ActionName(a.action)},
                         {"target", a.to ? a.to->host : ""},
                         {"predicted_stun_ms", a.action == planner::Action::kLiveMigrate ? a.predicted_stun_ms : -1}});
    }
    Event("plan", {{"feasible", plan.feasible}, {"predicted_ms", plan.total_ms}, {"why", why}, {"actions", actions}});
  }

  // A migration that needs its link alone is running on one of these hosts.
  bool AloneRunning(const std::string& a, const std::string& b) const {
    for (const auto& r : running_) {
      if (r.a.link_alone && (r.source == a || r.target == a || r.source == b || r.target == b)) return true;
    }
    return false;
  }

  // The live migrations holding a slot of `host`. A migration whose source has
  // completed (confirm: the target's receive still finishing) holds its
  // target's slot only: the source starts its next one at once.
  int Busy(const std::string& host) const {
    int n = 0;
    for (const auto& r : running_) {
      n += r.a.action == planner::Action::kLiveMigrate &&
           ((r.source == host && r.phase != ActionPhase::kConfirm) || r.target == host);
    }
    return n;
  }

  void Loop() {
    while (!pending_.empty() || !running_.empty()) {
      if (!cancel_->load()) StartWhatFits();
      std::vector<Running> still;
      bool replan = !replan_after_start_.empty();
      std::string why = replan_after_start_;
      replan_after_start_.clear();
      for (auto& r : running_) {
        std::string w;
        const bool ended = Step(r, &w);
        if (!w.empty()) {  // an action that failed, or one that taught the fleet something (still running)
          replan = true;
          why = w;
        }
        if (!ended) still.push_back(std::move(r));
      }
      running_ = std::move(still);
      Pace();
      if (cancel_->load() && !pending_.empty()) {
        Say("interrupted: {} actions not started (run again with --id {} to continue)", pending_.size(), f_.id);
        for (const auto& a : pending_) Finish({a.vm, std::string(planner::ActionName(a.action)), "", VmResult::kLeft, "not started: interrupted"}, false);
        pending_.clear();
      }
      if (replan && !cancel_->load()) Replan(why);
      std::this_thread::sleep_for(f_.poll);
    }
  }

  // Whether a live migration moves bytes now: from its session's first round
  // until its source completes, as its source agent reports the session's
  // phase; from an agent that does not, from the end of its setup as the plan
  // counts it (a third of policy.migration_overhead after its start). A
  // migration still starting takes no share from the others.
  bool Moving(const Running& r) const {
    if (r.a.action != planner::Action::kLiveMigrate || r.phase != ActionPhase::kMigrate || r.src_job == 0) return false;
    if (r.phase_reported) {
      return r.session_phase == "round-start" || r.session_phase == "round-end" || r.session_phase == "switchover";
    }
    return SteadyClock::now() - r.started >= fleet_.Policy().migration_overhead / 3;
  }

  // The share of the links a migration from `source` to `target` gets now, as
  // the plan's replay divides them: each host's link evenly among the live
  // migrations moving bytes on it (`extra`: one more about to), the smaller of
  // its two parts, of the payload the links carry (policy.link_efficiency, as
  // the plan), capped by --bandwidth; 0: no link known.
  double ShareNow(const std::string& source, const std::string& target, int extra) const {
    auto part = [&](const std::string& h) {
      const double link = fleet_.LinkRate(h);
      if (!(link > 0)) return 0.0;
      int n = extra;
      for (const auto& r : running_) n += Moving(r) && (r.source == h || r.target == h);
      return link / std::max(n, 1);
    };
    const double s = part(source), t = part(target);
    double share = s > 0 && t > 0 ? std::min(s, t) : std::max(s, t);
    share *= fleet_.Policy().link_efficiency;
    if (!f_.bandwidth.empty()) {
      if (auto cap = ParseRateBytesPerS(f_.bandwidth); cap.ok()) share = share > 0 ? std::min(share, *cap) : *cap;
    }
    return share;
  }

  static std::string RateText(double bytes_per_s) { return fmt::format("{:.6f}MB/s", bytes_per_s / 1e6); }

  // Paces every live migration moving bytes at its share (ShareNow): the
  // links are divided as the plan divided them, so a final round beside a bulk
  // transfer gets the share its stun was predicted at, not what TCP makes of a
  // shared queue. A source agent that cannot pace a job (an older controller
  // started it unpaced) leaves it to TCP.
  void Pace() {
    if (f_.no_pace) return;
    for (auto& r : running_) {
      if (r.paced < 0 || !Moving(r)) continue;
      const double share = ShareNow(r.source, r.target, 0);
      if (!(share > 0) || (r.paced > 0 && std::abs(share - r.paced) <= 0.02 * share)) continue;
      auto reply = Ask(r.source, agent::Op::kPace, {{"job", r.src_job}, {"bandwidth", RateText(share)}});
      if (!reply.ok()) continue;  // asked again next time
      if (reply->value("ok", false)) {
        r.paced = share;
        Event("paced", {{"vm", r.a.vm}, {"bytes_per_s", std::llround(share)}});
      } else if (agent::RefusalCodeOf(*reply) == agent::RefusalCode::kNotPaced) {
        r.paced = -1;
      }
    }
  }

  void StartWhatFits() {
    // --batched: the plan's batched schedule, for comparison: a batch starts
    // only once the whole batch before it has ended.
    if (f_.batched && !running_.empty()) return;
    for (auto it = pending_.begin(); it != pending_.end();) {
      const planner::PlannedAction& a = *it;
      const std::string tgt = a.to ? a.to->host : "";
      if (a.action == planner::Action::kPowerOff) {  // last, once everything else has moved
        bool others = !running_.empty();
        for (const auto& b : pending_) others |= b.action != planner::Action::kPowerOff;
        if (others) {
          ++it;
          continue;
        }
      }
      const bool live = a.action == planner::Action::kLiveMigrate;
      const bool alone_ok = (!a.link_alone || (Busy(f_.host) == 0 && Busy(tgt) == 0)) && !AloneRunning(f_.host, tgt);
      if (auto nb = not_before_.find(a.vm); nb != not_before_.end() && SteadyClock::now() < nb->second) {
        ++it;
        continue;
      }
      if (live && (Busy(f_.host) >= fleet_.MaxMigrations(f_.host) || Busy(tgt) >= fleet_.MaxMigrations(tgt) ||
                   !alone_ok)) {
        ++it;
        continue;
      }
      planner::PlannedAction next = a;
      it = pending_.erase(it);
      Start(next);
    }
  }

  // A refusal that says "not now" (the target's own limit, a receive of this VM
  // still listening from an earlier try): the action waits and is tried again,
  // not counted as a failure.
  static bool NotNow(const Json& reply) {
    const agent::RefusalCode code = agent::RefusalCodeOf(reply);
    return code == agent::RefusalCode::kBusy || code == agent::RefusalCode::kVmInJob;
  }

  void Start(const planner::PlannedAction& a) {
    if (a.action == planner::Action::kPowerOff) return StartPowerOff(a);
    Running r;
    r.a = a;
    r.source = f_.host;
    r.target = a.to->host;
    const std::string action(planner::ActionName(a.action));
    Reservation want;
    want.evacuation = f_.id;
    want.vm = a.vm;
    want.host = r.target;
    want.units = fleet_.Units(a.vm, *a.to, OwnUnits());
    auto res = store_->Reserve(want);
    if (!res.ok()) {
      // Another evacuation took the slot since the plan was made (or the store
      // failed): nothing moved; the VMs left are planned again with the slots
      // others hold counted as taken. Counted as a try: never retried forever.
      const std::string err = "capacity: " + std::string(res.status().message());
      ++attempts_[a.vm];
      (void)Journal(a.vm, action, JournalPhase::kFailed, r.target, std::string(res.status().message()));
      Finish({a.vm, action, r.target, VmResult::kFailed, err, a.predicted_stun_ms}, true);
      replan_after_start_ = err;
      return;
    }
    r.reservation = res->id;
    bool wait = false;
    const std::string err = a.action == planner::Action::kLiveMigrate ? StartLive(r, &wait) : StartReplica(r);
    if (!err.empty()) {  // nothing moved: the VM runs where it was
      (void)store_->Release(r.reservation);
      if (wait) {
        not_before_[a.vm] = SteadyClock::now() + std::chrono::seconds(2);
        pending_.push_back(a);
        return;
      }
      (void)Journal(a.vm, action, JournalPhase::kFailed, r.target, err);
      Finish({a.vm, action, r.target, VmResult::kFailed, err, a.predicted_stun_ms}, true);
      replan_after_start_ = err;
      return;
    }
    Say("{}: {} to {} started", a.vm, action, r.target);
    Event("action-started", {{"vm", a.vm}, {"action", action}, {"target", r.target},
                             {"predicted_stun_ms", a.action == planner::Action::kLiveMigrate ? a.predicted_stun_ms : -1}});
    running_.push_back(std::move(r));
  }

  // The point after which the VM may move, journaled (with the whole target,
  // for a restarted controller) just before the request that can move it.
  Status JournalStarted(const Running& r) {
    Json target = {{"host", r.target}, {"gpus", r.a.to->gpus}};
    if (r.a.to->placement) target["placement"] = *r.a.to->placement;
    ++attempts_[r.a.vm];
    return Journal(r.a.vm, std::string(planner::ActionName(r.a.action)), JournalPhase::kStarted, r.target,
                   fmt::format("attempt {}; target {}", attempts_[r.a.vm], target.dump()));
  }

  // A live migration: the target's receive at the planned slot, then the
  // source's migrate to it. "" when it runs; else why not (*wait: the target
  // said "not now", so it is tried again, not counted as failed).
  std::string StartLive(Running& r, bool* wait) {
    const planner::PlannedAction& a = r.a;
    Json req = {{"vm", fleet_.Record(a.vm)}, {"gpus", a.to->gpus}, {"accept_timeout", "30s"}};
    if (a.to->placement) req["placement"] = *a.to->placement;
    auto rec = Ask(r.target, agent::Op::kReceive, req);
    if (!rec.ok()) {
      fleet_.MarkUnreachable(r.target);
      return fmt::format("target agent {} unreachable: {}", r.target, rec.status().message());
    }
    if (!rec->value("ok", false)) {
      *wait = NotNow(*rec);
      return fmt::format("{} refused to receive: {}", r.target, rec->value("error", ""));
    }
    if (Status st = JournalStarted(r); !st.ok()) return "journal: " + std::string(st.message());
    r.dst_job = rec->value("job", int64_t{0});
    double pace = 0;
    auto mig = Ask(r.source, agent::Op::kMigrate, MigrateRequest(r, *rec, &pace));
    if (mig.ok() && mig->value("ok", false)) {
      r.src_job = mig->value("job", int64_t{0});
      r.phase = ActionPhase::kMigrate;
      r.paced = f_.no_pace ? -1 : pace;
      return "";
    }
    if (mig.ok()) return fmt::format("{} refused to migrate: {}", r.source, mig->value("error", ""));
    // No answer: the source may have started it. Ask before concluding.
    const Json job = RunningJob(r.source, a.vm, "migrate");
    if (job.is_null()) return std::string(mig.status().message());
    r.src_job = job["id"].get<int64_t>();
    r.phase = ActionPhase::kMigrate;
    return "";
  }

  // The source's migrate request: to the receive's address, with the VM's max
  // stun, its pace (*pace, the share of its links now) or the --bandwidth cap,
  // its time budget and the resume window.
  Json MigrateRequest(const Running& r, const Json& receive, double* pace) {
    std::string addr = receive.value("address", "");
    if (addr.find(':') != std::string::npos) addr = "[" + addr + "]";
    Json m = {{"vm", r.a.vm},
              {"to", fmt::format("{}:{}", addr, receive.value("port", 0))},
              {"options", {{"max_stun", fmt::format("{}ms", fleet_.MaxStunMs(r.a.vm))}}}};
    if (!f_.no_pace) {
      *pace = ShareNow(r.source, r.target, 1);
      m["options"]["pace"] = *pace > 0 ? RateText(*pace) : "0";
    } else if (!f_.bandwidth.empty()) {
      m["options"]["bandwidth"] = f_.bandwidth;
    }
    if (r.a.budget_ms > 0) m["options"]["max_total"] = fmt::format("{}ms", r.a.budget_ms);
    if (!f_.resume_window.empty()) m["options"]["resume_window"] = f_.resume_window;
    return m;
  }

  // A drain-and-replace: the replacement replica started through the target's
  // hook (the old one drains once it serves). "" when it runs; else why not.
  std::string StartReplica(Running& r) {
    Json rep = fleet_.Record(r.a.vm);
    rep["name"] = ReplicaName(r.a.vm);
    rep["inventory"]["gpus"] = r.a.to->gpus;
    if (r.a.to->placement) rep["inventory"]["placement"] = *r.a.to->placement;
    if (Status st = JournalStarted(r); !st.ok()) return "journal: " + std::string(st.message());
    auto st2 = Ask(r.target, agent::Op::kStartReplica, {{"vm", rep}});
    if (!st2.ok()) {
      fleet_.MarkUnreachable(r.target);
      return std::string(st2.status().message());
    }
    if (!st2->value("ok", false)) return fmt::format("{} refused to start a replica: {}", r.target, st2->value("error", ""));
    r.dst_job = st2->value("job", int64_t{0});
    r.phase = ActionPhase::kReplica;
    HookEvent(r.a.vm, "start-replica", r.target, "started");
    return "";
  }

  // The units this evacuation holds now (its own reservations).
  std::set<std::string> OwnUnits() {
    std::set<std::string> units;
    auto all = store_->Reservations();
    if (all.ok()) {
      for (const auto& r : *all) {
        if (r.evacuation == f_.id) units.insert(r.units.begin(), r.units.end());
      }
    }
    return units;
  }

  // Waits (bounded) until job `job` on `host` no longer runs, or the agent
  // stops answering (a re-plan then leaves that host out).
  void AwaitJobEnd(const std::string& host, int64_t job, std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      auto st = Ask(host, agent::Op::kStatus, Json::object());
      if (!st.ok() || !st->value("ok", false) || !st->contains("jobs")) return;
      bool running = false;
      for (const auto& j : (*st)["jobs"]) {
        running |= j.value("id", int64_t{0}) == job && agent::ParseJobState(j.value("state", "")) == agent::JobState::kRunning;
      }
      if (!running) return;
      std::this_thread::sleep_for(f_.poll);
    }
    Say("{}'s job {} still runs after {} s; going on", host, job, limit.count());
  }

  // The running job of `kind` (any kind when empty) for `vm` on `host`, or null.
  Json RunningJob(const std::string& host, const std::string& vm, const std::string& kind) {
    auto st = Ask(host, agent::Op::kStatus, Json::object());
    if (!st.ok() || !st->value("ok", false)) return nullptr;
    Json found;
    for (const auto& j : (*st)["jobs"]) {
      if (agent::ParseJobState(j.value("state", "")) == agent::JobState::kRunning && j.value("vm", "") == vm &&
          (kind.empty() || j.value("kind", "") == kind)) {
        found = j;
      }
    }
    return found;
  }

  // The policy allows it and the plan chose it: the source agent's power_off
  // hook, or, without one, left to an operator (reported, not failed).
  void StartPowerOff(const planner::PlannedAction& a) {
    Running r;
    r.a = a;
    r.source = f_.host;
    if (Status st = Journal(a.vm, "power-off", JournalPhase::kStarted, "", "the source's power_off hook"); !st.ok()) {
      Finish({a.vm, "power-off", "", VmResult::kFailed, "journal: " + std::string(st.message())}, true);
      return;
    }
    auto p = Ask(r.source, agent::Op::kPowerOff, {{"vm", a.vm}});
    if (!p.ok() || !p->value("ok", false)) {
      const std::string d = p.ok() ? p->value("error", "") : std::string(p.status().message());
      (void)Journal(a.vm, "power-off", JournalPhase::kFailed, "", d);
      Finish({a.vm, "power-off", "", VmResult::kLeft, d}, true);
      return;
    }
    r.src_job = (*p)["job"].get<int64_t>();
    r.phase = ActionPhase::kPowerOff;
    Say("{}: power-off started", a.vm);
    Event("action-started", {{"vm", a.vm}, {"action", "power-off"}, {"target", ""}, {"predicted_stun_ms", -1}});
    HookEvent(a.vm, "power-off", r.source, "started");
    running_.push_back(std::move(r));
  }

  Result<Json> Ask(const std::string& host, agent::Op op, Json body) {
    return agents_.Call(fleet_.Agent(host), agent::Request(op, std::move(body)), f_.agent_timeout);
  }

  // A migration that carried less than half the rate its plan gave it (capped
  // by --bandwidth) says the source's link is slower than the inventory says:
  // the fleet learns the link at the rate that share implies, and the VMs left
  // are planned again at it (their stuns, their order, drain-and-replace for
  // one that no longer fits max stun). The rounds' average rate is the path's
  // whole measure (the link, or a source too slow to fill it: either way what
  // the next migration gets).
  void LearnLink(const Running& r, const Json& job, std::string* replan_why) {
    if (!job.contains("report") || !job["report"].is_object()) return;
    const Json& rep = job["report"];
    const double measured = rep.value("rounds_bandwidth_bytes_per_s", rep.value("bandwidth_bytes_per_s", 0.0));
    double planned = r.a.bandwidth_bytes_per_s;
    if (r.paced > 0) planned = std::min(planned, r.paced);
    if (!f_.bandwidth.empty()) {
      if (auto cap = ParseRateBytesPerS(f_.bandwidth); cap.ok()) planned = std::min(planned, *cap);
    }
    const double link = fleet_.LinkRate(r.source);
    if (!(measured > 0) || !(planned > 0) || !(link > 0) || measured >= 0.5 * planned) return;
    const double learned = link * measured / planned;
    fleet_.LearnLinkRate(r.source, learned);
    *replan_why = fmt::format("{}'s link carried {} for {} (planned {} of its {}): re-planning the VMs left at {}",
                              r.source, FormatRate(measured), r.a.vm, FormatRate(planned), FormatRate(link),
                              FormatRate(learned));
  }

  // The job's state on `host` (its status entry in *out), or nullopt when the
  // agent did not answer or reported a state this controller does not know.
  std::optional<agent::JobState> StateOf(const std::string& host, int64_t job, Json* out) {
    if (job <= 0) return std::nullopt;  // unknown: never "job 0", which the agent reads as every job
    auto r = Ask(host, agent::Op::kStatus, {{"job", job}});
    if (!r.ok() || !r->value("ok", false) || (*r)["jobs"].empty()) return std::nullopt;
    *out = (*r)["jobs"][0];
    return agent::ParseJobState(out->value("state", ""));
  }

  // Records how an action ended: journaled, its reservation given back unless
  // it is in doubt (the slot may hold the VM), reported. Always true (ended).
  bool End(Running& r, JournalPhase phase, VmResult result, const std::string& detail, double stun_ms = -1) {
    const std::string action(planner::ActionName(r.a.action));
    (void)Journal(r.a.vm, action, phase, r.a.action == planner::Action::kPowerOff ? "" : r.target, detail);
    if (phase != JournalPhase::kInDoubt && !r.reservation.empty()) (void)store_->Release(r.reservation);
    EvacuationOutcome o{r.a.vm, action, r.a.action == planner::Action::kPowerOff ? "" : r.target, result, detail};
    if (r.a.action == planner::Action::kLiveMigrate) o.predicted_stun_ms = r.a.predicted_stun_ms;
    o.measured_stun_ms = stun_ms;
    Finish(o, true);
    return true;
  }

  // Advances one action; true when it ended (its outcome recorded). *replan_why
  // is set when the VMs left should be planned again.
  bool Step(Running& r, std::string* replan_why) {
    const auto now = SteadyClock::now();
    const bool on_source = r.phase == ActionPhase::kMigrate || r.phase == ActionPhase::kDrain || r.phase == ActionPhase::kPowerOff;
    const std::string& host = on_source ? r.source : r.target;
    Json j;
    const std::optional<agent::JobState> state = StateOf(host, on_source ? r.src_job : r.dst_job, &j);
    if (!state) {
      if (now - r.last_ok <= std::chrono::seconds(60)) return false;
      return End(r, JournalPhase::kInDoubt, VmResult::kInDoubt,
                 fmt::format("the agent of {} has not answered for 60 s during {}", host, ActionPhaseName(r.phase)));
    }
    r.last_ok = now;
    if (*state == agent::JobState::kRunning) return StillRunning(r, j, host, now);
    const std::string detail = j.value("detail", "");
    switch (r.phase) {
      case ActionPhase::kPowerOff:
        return PowerOffEnded(r, *state, detail);
      case ActionPhase::kMigrate:
        return MigrateEnded(r, *state, j, replan_why);
      case ActionPhase::kConfirm:
        return ReceiveEnded(r, *state, detail);
      case ActionPhase::kReplica:
        return ReplicaEnded(r, *state, detail);
      case ActionPhase::kDrain:
        break;
    }
    return DrainEnded(r, *state, detail);
  }

  // A job still running: its session's phase as an event, its progress line at
  // most once a second, and a receive that outlasts its source by 60 s in doubt.
  bool StillRunning(Running& r, const Json& j, const std::string& host, SteadyClock::time_point now) {
    if (r.phase == ActionPhase::kMigrate && j.contains("session_phase") && j["session_phase"].is_string()) {
      r.session_phase = j["session_phase"].get<std::string>();
      r.phase_reported = true;
      const int64_t round = j.contains("round") && j["round"].is_number_unsigned() ? j["round"].get<int64_t>() : -1;
      if (r.session_phase != r.evented_phase || round != r.evented_round) {
        Event("phase", {{"vm", r.a.vm}, {"phase", r.session_phase}, {"round", round}});
        r.evented_phase = r.session_phase;
        r.evented_round = round;
      }
    }
    const std::string line = j.value("progress", "");
    if (line != r.last_line && now - r.last_print > std::chrono::seconds(1)) {
      Say("{}: {} {}: {}", r.a.vm, ActionPhaseName(r.phase), host, line);
      r.last_line = line;
      r.last_print = now;
    }
    if (r.phase == ActionPhase::kConfirm && now - r.confirm_since > std::chrono::seconds(60)) {
      return End(r, JournalPhase::kInDoubt, VmResult::kInDoubt,
                 "the source completed but the destination's receive did not finish within 60 s");
    }
    return false;
  }

  bool PowerOffEnded(Running& r, agent::JobState state, const std::string& detail) {
    const bool ok = state == agent::JobState::kCompleted;
    HookEvent(r.a.vm, "power-off", r.source, ok ? "completed" : "failed");
    return End(r, ok ? JournalPhase::kCompleted : JournalPhase::kFailed, ok ? VmResult::kCompleted : VmResult::kLeft,
               ok ? fmt::format("powered off by {}'s hook", r.source) : "the power_off hook failed: " + detail);
  }

  // The source's migrate ended: completed (its receive is confirmed next),
  // rolled back (the VM runs on the source; re-planned), or in doubt.
  bool MigrateEnded(Running& r, agent::JobState state, const Json& j, std::string* replan_why) {
    const std::string detail = j.value("detail", "");
    if (state == agent::JobState::kCompleted) {
      stun_[r.a.vm] = j.contains("report") ? j["report"].value("stun_ms", -1.0) : -1.0;
      r.phase = ActionPhase::kConfirm;
      r.confirm_since = SteadyClock::now();
      LearnLink(r, j, replan_why);
      return Step(r, replan_why);
    }
    if (state != agent::JobState::kFailed) {  // in doubt, lost
      return End(r, JournalPhase::kInDoubt, VmResult::kInDoubt,
                 fmt::format("source {}: {}", agent::JobStateName(state), detail));
    }
    // Its receive at the target still holds the VM's placement there: a re-plan
    // made before it ends would collide with it (a replacement on the same
    // slices). The source's Abort may wait behind a collapsed link for minutes,
    // so the receive is cancelled, and its end awaited (bounded).
    if (r.dst_job != 0) {
      (void)Ask(r.target, agent::Op::kCancel, {{"job", r.dst_job}, {"reason", "the source's migration failed"}});
      AwaitJobEnd(r.target, r.dst_job, std::chrono::seconds(10));
    }
    End(r, JournalPhase::kFailed, VmResult::kFailed, detail);
    // The engine's own verdict (its report's drain_recommended), not the words of its error: a stun over
    // max stun, a link too slow for the workload, or a time budget it cannot meet.
    if (j.contains("report") && j["report"].is_object() && j["report"].value("drain_recommended", false)) {
      fleet_.LearnStunTooLong(r.a.vm);
    }
    if (!fleet_.Reachable(r.target)) fleet_.MarkUnreachable(r.target);
    *replan_why = fmt::format("{} failed: {}", r.a.vm, detail);
    return true;
  }

  // The destination's receive ended after its source completed.
  bool ReceiveEnded(Running& r, agent::JobState state, const std::string& detail) {
    if (state == agent::JobState::kCompleted) {
      const double stun = stun_[r.a.vm];
      return End(r, JournalPhase::kCompleted, VmResult::kCompleted,
                 fmt::format("stun {:.1f} ms (predicted {} ms)", stun, r.a.predicted_stun_ms), stun);
    }
    return End(r, JournalPhase::kInDoubt, VmResult::kInDoubt,
               fmt::format("the source completed but {}'s receive ended {}: {}", r.target,
                           agent::JobStateName(state), detail));
  }

  // The replacement replica's start hook ended: only once it serves does the
  // old replica drain (min_serving kept).
  bool ReplicaEnded(Running& r, agent::JobState state, const std::string& detail) {
    const bool ok = state == agent::JobState::kCompleted;
    HookEvent(r.a.vm, "start-replica", r.target, ok ? "completed" : "failed");
    if (!ok) {
      return End(r, JournalPhase::kFailed, VmResult::kFailed,
                 fmt::format("the replacement replica did not start on {}: {} (the old replica serves on)", r.target,
                             detail));
    }
    auto dr = Ask(r.source, agent::Op::kDrain, {{"vm", r.a.vm}});
    if (!dr.ok() || !dr->value("ok", false)) {
      return End(r, JournalPhase::kInDoubt, VmResult::kInDoubt,
                 fmt::format("replacement {} serves on {}, but the drain of {} was refused: {}", ReplicaName(r.a.vm),
                             r.target, r.a.vm, dr.ok() ? dr->value("error", "") : std::string(dr.status().message())));
    }
    r.src_job = (*dr)["job"].get<int64_t>();
    r.phase = ActionPhase::kDrain;
    HookEvent(r.a.vm, "drain", r.source, "started");
    Say("{}: replacement {} serves on {}; draining {}", r.a.vm, ReplicaName(r.a.vm), r.target, r.a.vm);
    return false;
  }

  bool DrainEnded(Running& r, agent::JobState state, const std::string& detail) {
    const bool ok = state == agent::JobState::kCompleted;
    HookEvent(r.a.vm, "drain", r.source, ok ? "completed" : "failed");
    if (ok) {
      return End(r, JournalPhase::kCompleted, VmResult::kCompleted,
                 fmt::format("replaced by {} on {}, then drained", ReplicaName(r.a.vm), r.target));
    }
    return End(r, JournalPhase::kInDoubt, VmResult::kInDoubt,
               fmt::format("replacement {} serves on {}, but the drain failed: {}", ReplicaName(r.a.vm), r.target,
                           detail));
  }

  // After a failure: the VMs left, planned again from what the agents report
  // now (a target that stopped answering excluded, a VM whose migration would
  // have exceeded its max stun no longer live-migrated). At most two new tries
  // per VM: nothing is retried blindly or forever.
  void Replan(const std::string& why) {
    // The new plan first: when it cannot be made, the failed VMs stay reported
    // as failed (running where they were), never dropped.
    if (Status st = RefreshForPlan(); !st.ok()) {
      Say("re-plan: {}", st.message());
      return;
    }
    auto p = fleet_.PlanFor(f_.host, f_.allow_power_off);
    if (!p.ok()) {
      Say("re-plan: {}", p.status().message());
      return;
    }
    for (auto it = done_.begin(); it != done_.end();) {
      if (it->result == VmResult::kFailed && attempts_[it->vm] < 3 && !it->final) {
        it = done_.erase(it);  // may be tried again under the new plan
      } else {
        ++it;
      }
    }
    Say("re-planned the VMs left after: {}", why);
    for (auto& o : done_) o.final = true;
    Take(*p, why);
  }

  // Before saying "done": every VM the host still lists has an outcome here
  // (a VM missing from a given plan, or dropped on the way, is reported left).
  void AccountForTheRest() {
    if (!fleet_.Refresh({}, f_.host).ok()) {
      Say("could not ask {} what it still holds", f_.host);
      Finish({"(" + f_.host + ")", "-", "", VmResult::kLeft, "the host's agent did not answer at the end"}, false);
      return;
    }
    for (const auto& vm : fleet_.VmsOn(f_.host)) {
      bool known = false;
      for (const auto& o : done_) known |= o.vm == vm && o.result != VmResult::kCompleted;
      if (!known) Finish({vm, "-", "", VmResult::kLeft, "still on " + f_.host + " and in no action"}, false);
    }
  }

  // A VM the journal says was started: asked about, never started blindly.
  // `to` is the target its kStarted entry recorded.
  Status Resolve(const VmJournalState& s, const planner::Target& to) {
    GM_RETURN_IF_ERROR(fleet_.Refresh({}, f_.host));
    const bool drain = s.action == "drain-and-replace";
    const bool on_source = fleet_.On(s.vm, f_.host);
    const bool at_target = !s.target.empty() && fleet_.On(drain ? ReplicaName(s.vm) : s.vm, s.target);
    auto release = [&] {
      for (const auto& res : Reserved(s.vm)) (void)store_->Release(res);
    };
    auto settle = [&](JournalPhase phase, VmResult result, const std::string& d) -> Status {
      GM_RETURN_IF_ERROR(Journal(s.vm, s.action, phase, s.target, d));
      if (phase != JournalPhase::kInDoubt) release();
      Finish({s.vm, s.action, s.target, result, d}, false);
      return Status::Ok();
    };
    if (fleet_.Held(s.vm)) return settle(JournalPhase::kInDoubt, VmResult::kInDoubt, "held after a controller restart: " + fleet_.HeldWhy(s.vm));
    if (s.action == "power-off" && !on_source) {
      return settle(JournalPhase::kCompleted, VmResult::kCompleted, "powered off (gone from its host) before a controller restart");
    }
    if (at_target && !on_source) return settle(JournalPhase::kCompleted, VmResult::kCompleted, "found at its target after a controller restart");
    auto adopt = [&](ActionPhase phase, int64_t src, int64_t dst) {
      Running r;
      r.a.vm = s.vm;
      r.a.action = s.action == "power-off" ? planner::Action::kPowerOff
                   : drain                 ? planner::Action::kDrainAndReplace
                                           : planner::Action::kLiveMigrate;
      if (!to.host.empty()) r.a.to = to;
      r.source = f_.host;
      r.target = s.target;
      r.phase = phase;
      r.src_job = src;
      r.dst_job = dst;
      if (phase == ActionPhase::kConfirm) r.confirm_since = SteadyClock::now();
      for (const auto& res : Reserved(s.vm)) r.reservation = res;
      Say("{}: {} started before a controller restart is still under way ({}): following it", s.vm, s.action,
          ActionPhaseName(phase));
      running_.push_back(std::move(r));
      return Status::Ok();
    };
    // Still in flight on the source?
    const Json src = RunningJob(f_.host, s.vm, "");
    if (!src.is_null()) {
      const std::string kind = src.value("kind", "");
      const int64_t id = src["id"].get<int64_t>();
      if (kind == "migrate") return adopt(ActionPhase::kMigrate, id, s.target.empty() ? 0 : LatestJob(s.target, s.vm, "receive"));
      if (kind == "drain") return adopt(ActionPhase::kDrain, id, 0);
      if (kind == "power-off") return adopt(ActionPhase::kPowerOff, id, 0);
    }
    if (drain && !s.target.empty()) {
      const Json rep = RunningJob(s.target, ReplicaName(s.vm), "start-replica");
      if (!rep.is_null()) return adopt(ActionPhase::kReplica, 0, rep["id"].get<int64_t>());
      if (at_target && on_source) {  // replaced, not yet drained: the drain follows
        return adopt(ActionPhase::kReplica, 0, LatestJob(s.target, ReplicaName(s.vm), "start-replica"));
      }
    }
    if (!on_source) {
      // Gone from the source, not listed at the target: its receive may still be
      // finishing there; otherwise nobody lists it, which only an operator sorts out.
      const Json recv = s.target.empty() ? Json() : RunningJob(s.target, s.vm, "receive");
      if (!recv.is_null()) return adopt(ActionPhase::kConfirm, 0, recv["id"].get<int64_t>());
      return settle(JournalPhase::kInDoubt, VmResult::kInDoubt,
                    fmt::format("after a controller restart no host lists {} (not {}, not {})", s.vm, f_.host,
                                s.target.empty() ? "its target" : s.target));
    }
    const std::string d = "the attempt before a controller restart did not complete; the VM runs on its source";
    GM_RETURN_IF_ERROR(Journal(s.vm, s.action, JournalPhase::kFailed, s.target, d));
    release();
    return Status::Ok();
  }

  // The newest job of `kind` for `vm` on `host`; 0 when there is none or no answer.
  int64_t LatestJob(const std::string& host, const std::string& vm, const std::string& kind) {
    auto st = Ask(host, agent::Op::kStatus, Json::object());
    int64_t id = 0;
    if (st.ok() && st->value("ok", false)) {
      for (const auto& j : (*st)["jobs"]) {
        if (j.value("vm", "") == vm && j.value("kind", "") == kind) id = std::max<int64_t>(id, j.value("id", int64_t{0}));
      }
    }
    return id;
  }

  std::vector<std::string> Reserved(const std::string& vm) {
    std::vector<std::string> ids;
    auto all = store_->Reservations();
    if (all.ok()) {
      for (const auto& r : *all) {
        if (r.evacuation == f_.id && r.vm == vm) ids.push_back(r.id);
      }
    }
    return ids;
  }

  void Finish(EvacuationOutcome o, bool /*live*/) {
    Say("{}: {}{}{}", o.vm, VmResultName(o.result), o.detail.empty() ? "" : ": ", o.detail);
    Event("outcome", {{"vm", o.vm},
                      {"action", o.action},
                      {"target", o.target},
                      {"outcome", VmResultName(o.result)},
                      {"detail", o.detail},
                      {"predicted_stun_ms", o.predicted_stun_ms},
                      {"measured_stun_ms", o.measured_stun_ms}});
    std::erase_if(done_, [&](const EvacuationOutcome& x) { return x.vm == o.vm; });
    done_.push_back(std::move(o));
  }

  int Summary(int base) {
    int rc = base;
    for (const auto& o : done_) {
      if (o.result == VmResult::kInDoubt) rc = 3;
      if (rc == 0 && o.result != VmResult::kCompleted) rc = 1;
    }
    Json counts = Json::object();
    for (const auto& o : done_) {
      const std::string name(VmResultName(o.result));
      counts[name] = counts.value(name, 0) + 1;
    }
    Event("done", {{"exit", rc}, {"outcomes", counts}});
    return rc;
  }

  const EvacuationOptions f_;
  Fleet fleet_;
  agent::Client& agents_;
  EvacuationStore* store_ = nullptr;
  const std::atomic<bool>* cancel_ = nullptr;
  EvacuationEvents* events_ = nullptr;  // null: none
  std::function<void(const std::string&)> on_line_;
  std::string error_;
  std::string controller_;
  std::deque<planner::PlannedAction> pending_;
  std::vector<Running> running_;
  std::vector<EvacuationOutcome> done_;
  std::map<std::string, uint32_t> attempts_;
  std::map<std::string, double> stun_;
  std::map<std::string, SteadyClock::time_point> not_before_;
  std::string replan_after_start_;
  
};



std::string_view VmResultName(VmResult r) {
  switch (r) {
    case VmResult::kCompleted:
      return "completed";
    case VmResult::kFailed:
      return "failed";
    case VmResult::kInDoubt:
      return "in-doubt";
    case VmResult::kBlocked:
      return "blocked";
    case VmResult::kLeft:
      break;
  }
  return "left";
}

Result<std::unique_ptr<Evacuation>> Evacuation::Open(const std::string& inventory_text, EvacuationOptions options,
                                                     agent::Client& agents) {
  auto fleet = evacuation::Fleet::Open(inventory_text, agents, options.agent_timeout);
  if (!fleet.ok()) return fleet.status();
  if (!fleet->HasHost(options.host)) {
    return InvalidArgument(fmt::format("host {} is not in the inventory", options.host));
  }
  if (options.id.empty()) options.id = "evacuate-" + options.host;
  return std::unique_ptr<Evacuation>(
      new Evacuation(std::make_unique<Impl>(std::move(options), std::move(*fleet), agents)));
}

Evacuation::Evacuation(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Evacuation::~Evacuation() = default;

void Evacuation::OnLine(std::function<void(const std::string&)> on_line) { impl_->OnLine(std::move(on_line)); }

Result<planner::Plan> Evacuation::PlanNow() { return impl_->PlanNow(); }

EvacuationSummary Evacuation::Run(std::optional<planner::Plan> given, EvacuationStore& store, EvacuationEvents* events,
                                  const std::atomic<bool>& cancel) {
  return impl_->Run(std::move(given), store, events, cancel);
}

}  // namespace gpumigrate
