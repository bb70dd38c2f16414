// The per-host agent of a host evacuation (issue 12): one long-running process
// per host that owns the host's VMs, reports them in the planner's inventory
// format, and, on request from an authenticated controller, receives a VM,
// migrates one of its VMs to another agent, runs a replica group's hooks, and
// enters or leaves maintenance.
//
// The pieces, each usable alone:
//   ParseAgentConfig   the host's configuration (its inventory host entry, its
//                      VMs with their device specs, the groups' hook commands);
//                      every error names the key path.
//   WriteMessage /     the control channel's framing: a 4-byte big-endian length,
//   ReadMessage        then one JSON object (at most kMaxMessageBytes), over any
//                      Stream (mutual TLS in `gpumigrate agent`).
//   Agent              the request handler: Handle(request) -> reply. It runs
//                      each migration as a child `gpumigrate migrate|receive`
//                      (the same binary), at most max_migrations at once, and
//                      keeps its VMs, its jobs and its maintenance flag in a
//                      state file, so a restarted agent reports what it finds:
//                      a source whose migration ended in doubt (or whose child
//                      vanished without a report) stays held, never resumed.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpumigrate/common/launcher.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"

namespace gpumigrate::agent {

using Json = nlohmann::ordered_json;

// One VM on a host: its planner inventory entry (name, gpus, profile, placement,
// class, group, uvm, estimate, max_stun; "host" is filled in by the agent) and
// how to reach its device memory.
struct VmRecord {
  std::string name;
  std::string device;          // the source's device spec (sim:..., proc:PID, ...)
  // The destination's spec when it differs ("" = device). "adopt:NAME": the
  // receiving host starts its adopter NAME (AgentConfig::adopters), a process
  // that waits to adopt the memory, and receives into it.
  std::string receive_device;
  Json inventory;              // the planner's VM entry, without "host"
};

// The commands an operator points at their load balancer or scheduler, per
// replica group. Each is an argv; "{vm}", "{group}" and "{host}" are replaced.
struct GroupHooks {
  std::vector<std::string> start_replica;  // start a replacement replica here
  std::vector<std::string> drain;          // drain (stop serving) a replica here
};

// A command that starts a destination process for a proc (or cuda) VM: one that
// waits in adopt mode (gm_shim_start_adopt) and, once it does, writes a line
// "ready pid=PID" to its stdout, as gpumigrate-workload --adopt does. "{vm}"
// and "{host}" in the command are replaced; "{pid}" in `device` becomes the
// process that said it is ready, and that spec is the VM's device here after.
struct Adopter {
  std::vector<std::string> command;
  std::string device = "proc:{pid}";
};

struct AgentConfig {
  std::string host;               // this host's name
  Json host_entry;                // the planner's host entry (link, max_migrations, gpus, ...)
  int max_migrations = 1;         // migrations in and out at once
  std::string data_address;       // where receive listens ("" = the agent's listen address)
  // "content_store": a directory of files this host holds (model weights): a
  // receive fills the pages a source offers by SHA-256 from it (receive
  // --content-store). "" = none.
  std::string content_store;
  std::vector<VmRecord> vms;      // the VMs configured here at first start
  Json groups = Json::array();    // the planner's group entries
  std::map<std::string, GroupHooks> hooks;
  // "power_off": how this host powers a VM off (an argv; "{vm}", "{host}"
  // replaced), for the plan's power-off action (the VM's work is lost: only
  // where the policy allows it). Empty: power-off is refused, left to an operator.
  std::vector<std::string> power_off;
  // "adopters": {"NAME": {"command": [...], "device": "proc:{pid}"}}, for VMs
  // whose receive_device is "adopt:NAME".
  std::map<std::string, Adopter> adopters;
};

// The configuration file (README "gpumigrate agent"): {"version": 1, "host":
// {planner host entry}, "data_address": "...", "content_store": "DIR", "groups": [{planner group entry,
// "hooks": {"start_replica": [...], "drain": [...]}}], "power_off": [...],
// "adopters": {...}, "vms": [{planner VM entry without "host", "device": "...",
// "receive_device": "..."}]}. It is checked
// against the planner's own inventory rules (docs/planner.md).
Result<AgentConfig> ParseAgentConfig(std::string_view json_text);

inline constexpr size_t kMaxMessageBytes = 4 << 20;
Status WriteMessage(Stream& s, const Json& message);
// kUnavailable when the peer closed before a message began; kCorrupt for a
// length over the limit or a body that is not one JSON object.
Result<Json> ReadMessage(Stream& s);

// The certificate files of the agents' mutual TLS: the CA both ends trust, and
// this end's certificate and key (relative paths are made absolute).
struct TlsFiles {
  std::string ca, cert, key;
};

// The requests an agent serves: a request is {"op": OpName(op), ...}.
enum class Op {
  kInventory, kStatus, kReceive, kMigrate, kPace, kCancel, kStartReplica, kDrain, kPowerOff, kResolve, kMaintenance,
};
std::string_view OpName(Op op);  // "inventory", "status", ..., "start-replica", "power-off", ...
std::optional<Op> ParseOp(std::string_view name);
// {"op": OpName(op)} and the body's keys.
Json Request(Op op, Json body = Json::object());

// A job's state as `status` reports it ("state").
enum class JobState {
  kRunning,
  kCompleted,
  kFailed,   // it ended and changed nothing: a migration rolled back, a receive kept nothing, a hook failed
  kInDoubt,  // it ended past the point of no return without knowing the outcome: the VM is held
  kLost,     // its process vanished without an exit status: the VM is held
};
std::string_view JobStateName(JobState s);  // "running", "completed", "failed", "in-doubt", "lost"
std::optional<JobState> ParseJobState(std::string_view name);

// Why an agent refused, where its caller acts on the reason: a refusal's
// "code" (absent: kOther, read the "error").
enum class RefusalCode {
  kOther,
  kBusy,      // "busy": max_migrations running now; the same request may succeed later
  kVmInJob,   // "vm-in-job": the VM is in a running job (a receive of it still listening)
  kNotPaced,  // "not-paced": a pace for a migration started without a rate file
};
std::string_view RefusalCodeName(RefusalCode code);  // "" for kOther
RefusalCode RefusalCodeOf(const Json& reply);

// A controller's way to its agents: one request, one reply, bounded in time.
// The reply whether the agent did it ("ok": true) or refused ("ok": false,
// "error", and "code" where the refusal is one a caller acts on: kCode*); an
// error Status only when no reply came (connection, TLS, timeout). A seam: the
// real one speaks mutual TLS (MakeTlsClient); tests hand requests to in-process
// Agents.
class Client {
 public:
  virtual ~Client() = default;
  virtual Result<Json> Call(const std::string& address, const Json& request, std::chrono::milliseconds timeout) = 0;
};
// One request to the agent at ADDR:PORT over mutual TLS (its certificate must name ADDR).
Result<Json> CallAgent(const std::string& address, const TlsFiles& tls, const Json& request,
                       std::chrono::milliseconds timeout);
std::unique_ptr<Client> MakeTlsClient(TlsFiles tls);

// The agent's /metrics page (Prometheus text format) from its `inventory`
// reply and every job as `status` reports it: the host (VMs, GPUs with their
// free MIG slices and vGPU room, maintenance, migrations in flight against
// max_migrations), each running migration in and out (phase, round, bytes
// sent, rate, dirty set, elapsed), each VM's last measured and predicted stun,
// and counters over the jobs this agent's state holds (outcomes by direction,
// resumptions, scrub time, hooks). Every series is in the README (Metrics).
std::string RenderAgentMetrics(const Json& inventory, const Json& jobs, int64_t now_unix_ms);

// How the agent starts and watches its children (gpumigrate/common/launcher.h).
using Launcher = gpumigrate::Launcher;
using gpumigrate::MakeProcessLauncher;

struct AgentOptions {
  std::string self_exe;         // the gpumigrate binary the children run
  std::string state_dir;        // state.json and jobs/
  std::string listen_address;   // where controllers reach this agent (reported in the inventory)
  std::vector<std::string> child_tls_args;  // --tls-ca ... passed to every child
  std::chrono::milliseconds port_wait{10000};  // how long a receiving child may take to listen
  // Told of every job's life, under the agent's lock (keep it short): started,
  // each session phase its process reports (seen at the agent's polls), and
  // its end. {"job", "kind", "vm", "phase" (started, a session phase, or the
  // end state: completed, failed, in-doubt, lost), "message"}. The agent
  // command logs it (to journald with structured fields when run by systemd).
  std::function<void(const Json& event)> on_job_event;
};

class Agent {
 public:
  // Loads DIR/state.json when there is one (the VMs, jobs and maintenance flag of
  // the last run win over the configuration's VMs); otherwise starts from `config`.
  static Result<std::unique_ptr<Agent>> Open(AgentConfig config, AgentOptions options,
                                             std::unique_ptr<Launcher> launcher);
  ~Agent();
  // One request {"op": ...} -> {"ok": true, ...} or {"ok": false, "error": "..."}.
  // Safe from several threads.
  Json Handle(const Json& request);
  // Polls the children (also done by every Handle); `gpumigrate agent` calls it
  // between connections.
  void Poll();
  // Prometheus text (RenderAgentMetrics) of the host and its jobs now.
  std::string Metrics();
  // What the restart found (one line each), for the agent's log.
  const std::vector<std::string>& Findings() const { return findings_; }

 private:
  struct Job;
  Agent(AgentConfig config, AgentOptions options, std::unique_ptr<Launcher> launcher);
  Status Load();
  Status Save();
  void PollLocked();
  void Finish(Job& job, std::optional<int> rc);
  void JobEvent(const Job& job, const std::string& phase, const std::string& message);
  Json JobJson(const Job& job) const;
  Json Inventory() const;
  Json HostModels() const;
  Result<Json> Dispatch(Op op, const Json& req);
  Result<Json> JobsStatus(const Json& req);
  Result<Json> SetMaintenance(const Json& req);
  Result<Json> Receive(const Json& req);
  Result<Json> Migrate(const Json& req);
  Result<Json> Pace(const Json& req);
  Result<Json> Cancel(const Json& req);
  Result<Json> RunHook(const Json& req, bool drain);
  Result<Json> PowerOff(const Json& req);
  Result<Json> Release(const Json& req);
  int RunningJobs() const;
  Status FitsLocked(const VmRecord& rec) const;
  Result<Job*> StartLocked(std::unique_ptr<Job> job, const std::vector<std::string>& argv);
  Result<Job*> RecordLocked(std::unique_ptr<Job> job);
  Status LaunchLocked(Job& job, const std::vector<std::string>& argv);
  Result<std::string> StartAdopter(std::unique_lock<std::mutex>& lock, Job& job, const std::string& name);
  std::string JobPath(int64_t id, const char* ext) const;

  AgentConfig config_;
  AgentOptions options_;
  std::unique_ptr<Launcher> launcher_;
  mutable std::mutex mu_;
  std::vector<VmRecord> vms_;
  std::map<std::string, std::string> held_;  // vm -> why it is held
  bool maintenance_ = false;
  std::vector<std::unique_ptr<Job>> jobs_;
  int64_t next_job_ = 1;
  std::vector<std::string> findings_;
};

}  // namespace gpumigrate::agent
