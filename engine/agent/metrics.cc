// RenderAgentMetrics (agent.h): the agent's state as Prometheus series. Labels
// are bounded: host, vm (VM ids), direction (out, in), phase and outcome (fixed
// sets), gpu (indices). A migration's series carry no job id: the next one of
// the same VM continues them (a counter that starts again from 0 is a reset).
#include <map>
#include <set>

#include "gpumigrate/agent/agent.h"
#include "gpumigrate/planner/planner.h"
#include "gpumigrate/common/prom_text.h"

namespace gpumigrate::agent {
namespace {

const char* Direction(const Json& job) { return job.value("kind", "") == "migrate" ? "out" : "in"; }
bool IsMigration(const Json& job) {
  const std::string k = job.value("kind", "");
  return k == "migrate" || k == "receive";
}
double Num(const Json& j, const char* key, double otherwise = 0) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : otherwise;
}

// The session phases a migration's process reports (session.h's PhaseName),
// and "starting" before its first: every one is written, 1 for the current.
constexpr const char* kPhases[] = {"starting",         "handshake",        "round-start",     "round-end",
                                   "switchover",       "prepare-sent",     "prepared-received", "commit-sent",
                                   "prepare-received", "prepared-sent",    "commit-received", "completed",
                                   "reconnecting",     "resumed"};

// The host's own series: maintenance, VM counts, the migration limit and the migrations in flight.
void HostSeries(PromText& p, const Json& inventory, const Json& hj, const Json& jobs, const std::string& host) {
  const PromLabels h = {{"host", host}};
  p.Family("gpumigrate_host_maintenance", "gauge", "1 while the host is in maintenance (it receives nothing)");
  p.Sample("gpumigrate_host_maintenance", h, hj.value("maintenance", false) ? 1 : 0);
  p.Family("gpumigrate_host_vms", "gauge", "VMs the host runs");
  p.Sample("gpumigrate_host_vms", h, inventory.contains("vms") ? inventory["vms"].size() : 0);
  size_t held = 0;
  if (inventory.contains("vms")) {
    for (const auto& v : inventory["vms"]) held += v.contains("held") ? 1 : 0;
  }
  p.Family("gpumigrate_host_vms_held", "gauge", "VMs held after a migration in doubt, until an operator resolves them");
  p.Sample("gpumigrate_host_vms_held", h, held);
  p.Family("gpumigrate_host_max_migrations", "gauge", "Migrations in and out the host runs at once at most");
  p.Sample("gpumigrate_host_max_migrations", h, inventory.value("max_migrations", 0));
  std::map<std::string, int> in_flight = {{"out", 0}, {"in", 0}};
  for (const auto& j : jobs) {
    if (IsMigration(j) && j.value("state", "") == "running") ++in_flight[Direction(j)];
  }
  p.Family("gpumigrate_host_migrations_in_flight", "gauge", "Migrations running now, by direction");
  for (const auto& [dir, n] : in_flight) p.Sample("gpumigrate_host_migrations_in_flight", {{"host", host}, {"direction", dir}}, n);
}

// GPUs: the planner's own occupancy of this host's inventory.
void GpuSeries(PromText& p, const Json& inventory, const Json& hj, const std::string& host) {
  Json inv = {{"version", 1}, {"hosts", Json::array({hj})}, {"vms", Json::array()}};
  if (inventory.contains("groups")) inv["groups"] = inventory["groups"];
  if (inventory.contains("vms")) {
    for (auto v : inventory["vms"]) {
      v.erase("device");
      v.erase("receive_device");
      v.erase("held");
      inv["vms"].push_back(v);
    }
  }
  inv["hosts"][0].erase("agent");
  auto parsed = planner::ParseInventory(inv.dump());
  std::vector<planner::GpuOccupancy> gpus;
  if (parsed.ok()) gpus = planner::HostOccupancy(*parsed, host);
  p.Family("gpumigrate_gpu_vms", "gauge", "VMs with a slot on the GPU");
  for (const auto& g : gpus) {
    const char* mode = g.mode == planner::GpuMode::kMig ? "mig" : g.mode == planner::GpuMode::kVgpu ? "vgpu" : "passthrough";
    p.Sample("gpumigrate_gpu_vms", {{"host", host}, {"gpu", std::to_string(g.index)}, {"mode", mode}}, g.vms);
  }
  p.Family("gpumigrate_gpu_mig_slices_free", "gauge", "MIG slices of the GPU no instance holds (MIG mode GPUs)");
  for (const auto& g : gpus) {
    if (g.mode != planner::GpuMode::kMig) continue;
    p.Sample("gpumigrate_gpu_mig_slices_free", {{"host", host}, {"gpu", std::to_string(g.index)}},
             g.mig_slices - g.mig_slices_used);
  }
  p.Family("gpumigrate_gpu_vgpu_free_bytes", "gauge", "Frame buffer of the GPU no vGPU holds (vGPU mode GPUs)");
  for (const auto& g : gpus) {
    if (g.mode != planner::GpuMode::kVgpu) continue;
    p.Sample("gpumigrate_gpu_vgpu_free_bytes", {{"host", host}, {"gpu", std::to_string(g.index)}},
             static_cast<double>(g.memory_bytes - g.vgpu_bytes_used));
  }
  p.Family("gpumigrate_gpu_passthrough_free", "gauge", "1 when the passthrough GPU is free");
  for (const auto& g : gpus) {
    if (g.mode != planner::GpuMode::kPassthrough) continue;
    p.Sample("gpumigrate_gpu_passthrough_free", {{"host", host}, {"gpu", std::to_string(g.index)}},
             g.passthrough_used ? 0 : 1);
  }
}

// Running migrations: one series per VM and direction.
void RunningSeries(PromText& p, const Json& jobs, const std::string& host, int64_t now_unix_ms) {
  std::vector<const Json*> running;
  for (const auto& j : jobs) {
    if (IsMigration(j) && j.value("state", "") == "running") running.push_back(&j);
  }
  auto per_running = [&](const char* name, const char* type, const char* help, auto value) {
    p.Family(name, type, help);
    for (const Json* j : running) {
      if (auto v = value(*j)) p.Sample(name, {{"host", host}, {"vm", j->value("vm", "")}, {"direction", Direction(*j)}}, *v);
    }
  };
  p.Family("gpumigrate_migration_phase", "gauge", "1 for the phase a running migration is in (session phases)");
  for (const Json* j : running) {
    const std::string now = j->value("session_phase", "");
    for (const char* ph : kPhases) {
      p.Sample("gpumigrate_migration_phase",
               {{"host", host}, {"vm", j->value("vm", "")}, {"direction", Direction(*j)}, {"phase", ph}},
               now == ph ? 1 : 0);
    }
  }
  using Opt = std::optional<double>;
  per_running("gpumigrate_migration_round", "gauge", "The pre-copy round a running migration is in",
              [](const Json& j) { return j.contains("round") ? Opt(Num(j, "round")) : std::nullopt; });
  per_running("gpumigrate_migration_sent_bytes_total", "counter", "Bytes a running migration has sent (the source's)",
              [](const Json& j) { return j.contains("bytes_sent") ? Opt(Num(j, "bytes_sent")) : std::nullopt; });
  per_running("gpumigrate_migration_applied_bytes_total", "counter",
              "Bytes a running incoming migration has applied to the device here (the destination's)",
              [](const Json& j) { return j.contains("bytes_applied") ? Opt(Num(j, "bytes_applied")) : std::nullopt; });
  per_running("gpumigrate_migration_rate_bytes_per_second", "gauge",
              "A running migration's rate over its last second: sent (out), applied (in)",
              [](const Json& j) { return j.contains("bytes_per_s") ? Opt(Num(j, "bytes_per_s")) : std::nullopt; });
  per_running("gpumigrate_migration_dirty_bytes", "gauge",
              "Bytes the current round must consider: the dirty set (round 0: the whole device)",
              [](const Json& j) { return j.contains("round_bytes_total") ? Opt(Num(j, "round_bytes_total")) : std::nullopt; });
  per_running("gpumigrate_migration_predicted_stun_seconds", "gauge",
              "The stun the source predicted at its last round's end, were it to switch over then",
              [](const Json& j) {
                return j.contains("predicted_stun_ms") ? Opt(Num(j, "predicted_stun_ms") / 1000) : std::nullopt;
              });
  per_running("gpumigrate_migration_elapsed_seconds", "gauge", "Seconds since the running migration's job started",
              [now_unix_ms](const Json& j) {
                const double started = Num(j, "started_unix_ms");
                const double now = static_cast<double>(now_unix_ms);
                return started > 0 && now >= started ? Opt((now - started) / 1000) : std::nullopt;
              });
}

// The last ended migration of each VM and direction: its stun, measured and predicted.
void LastEndedSeries(PromText& p, const Json& jobs, const std::string& host) {
  std::map<std::pair<std::string, std::string>, const Json*> last;
  for (const auto& j : jobs) {
    if (IsMigration(j) && j.value("state", "") != "running" && j.contains("report") && j["report"].is_object()) {
      last[{j.value("vm", ""), Direction(j)}] = &j;  // jobs in order: the latest wins
    }
  }
  p.Family("gpumigrate_migration_last_stun_seconds", "gauge", "The stun of the VM's last completed migration, measured");
  for (const auto& [key, j] : last) {
    const Json& r = (*j)["report"];
    if (j->value("state", "") == "completed" && r.contains("stun_ms") && r["stun_ms"].is_number()) {
      p.Sample("gpumigrate_migration_last_stun_seconds", {{"host", host}, {"vm", key.first}, {"direction", key.second}},
               Num(r, "stun_ms") / 1000);
    }
  }
  p.Family("gpumigrate_migration_last_predicted_stun_seconds", "gauge",
           "The stun the source predicted at switchover for the VM's last migration");
  for (const auto& [key, j] : last) {
    const Json& r = (*j)["report"];
    if (r.contains("predicted_stun_ms") && r["predicted_stun_ms"].is_number()) {
      p.Sample("gpumigrate_migration_last_predicted_stun_seconds",
               {{"host", host}, {"vm", key.first}, {"direction", key.second}}, Num(r, "predicted_stun_ms") / 1000);
    }
  }
}

// Counters over every job the agent's state holds.
void JobCounters(PromText& p, const Json& jobs, const std::string& host) {
  const PromLabels h = {{"host", host}};
  std::map<std::pair<std::string, std::string>, int> outcomes;
  for (const char* dir : {"out", "in"}) {
    for (const char* o : {"completed", "failed", "in-doubt", "lost"}) outcomes[{dir, o}] = 0;
  }
  std::map<std::pair<std::string, std::string>, int> hooks;
  double resumptions = 0, scrub_s = 0, sent = 0;
  for (const auto& j : jobs) {
    const std::string state = j.value("state", "");
    if (state == "running") continue;
    if (IsMigration(j)) {
      ++outcomes[{Direction(j), state}];
      if (j.contains("report") && j["report"].is_object()) {
        const Json& r = j["report"];
        if (r.contains("resumptions") && r["resumptions"].is_array()) resumptions += r["resumptions"].size();
        scrub_s += Num(r, "scrub_ms") / 1000;
        if (j.value("kind", "") == "migrate") sent += Num(r, "bytes_sent");
      }
    } else {
      ++hooks[{j.value("kind", ""), state}];
    }
  }
  p.Family("gpumigrate_migrations_total", "counter",
           "Migrations ended, by direction and outcome (failed: rolled back, the source runs on)");
  for (const auto& [key, n] : outcomes) {
    p.Sample("gpumigrate_migrations_total", {{"host", host}, {"direction", key.first}, {"outcome", key.second}}, n);
  }
  p.Family("gpumigrate_migration_resumptions_total", "counter",
           "Broken connections the ended migrations resumed over a new one");
  p.Sample("gpumigrate_migration_resumptions_total", h, resumptions);
  p.Family("gpumigrate_migration_scrub_seconds_total", "counter", "Seconds spent scrubbing released source memory");
  p.Sample("gpumigrate_migration_scrub_seconds_total", h, scrub_s);
  p.Family("gpumigrate_migrated_bytes_total", "counter", "Bytes the ended outgoing migrations sent");
  p.Sample("gpumigrate_migrated_bytes_total", h, sent);
  p.Family("gpumigrate_hooks_total", "counter", "Hooks run (start-replica, drain, power-off), by outcome");
  for (const auto& [key, n] : hooks) {
    p.Sample("gpumigrate_hooks_total", {{"host", host}, {"hook", key.first}, {"outcome", key.second}}, n);
  }
}

}  // namespace

std::string RenderAgentMetrics(const Json& inventory, const Json& jobs, int64_t now_unix_ms) {
  PromText p;
  const Json& hj = inventory.contains("host") ? inventory["host"] : Json::object();
  const std::string host = hj.value("name", "");
  HostSeries(p, inventory, hj, jobs, host);
  GpuSeries(p, inventory, hj, host);
  RunningSeries(p, jobs, host, now_unix_ms);
  LastEndedSeries(p, jobs, host);
  JobCounters(p, jobs, host);
  return p.text();
}

}  // namespace gpumigrate::agent
