// Agent: the per-host request handler. Every change to what the host holds
// (its VMs, held sources, jobs, maintenance) is written to DIR/state.json (a
// temporary file, fsync, rename) before the reply goes out.
#include "gpumigrate/agent/agent.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/content/content_store.h"
#include "gpumigrate/planner/planner.h"
#include "gpumigrate/common/rate_file.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::agent {
namespace fs = std::filesystem;

struct Agent::Job {
  int64_t id = 0;
  std::string kind;   // "migrate", "receive", "start-replica", "drain"
  std::string vm;
  VmRecord record;    // the VM it moves or starts
  JobState state = JobState::kRunning;
  int64_t pid = 0;
  std::string token;
  std::optional<int> rc;
  std::string detail;
  std::string to;     // migrate: where to
  int port = 0;       // receive: where it listens
  // receive into an adopter's process: the shell it runs under (Launcher id and
  // token) and the device spec of the process that said it is ready.
  int64_t adopter_pid = 0;
  std::string adopter_token;
  std::string adopted_device;
  int64_t started_unix_ms = 0, ended_unix_ms = 0;
  Json report;        // the child's --json report, once it ended
  std::string cancel_reason;  // set by a cancel request; leads the detail once it ended
  std::string logged_phase;   // the session phase last told to on_job_event (not saved)
};

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Json RecordJson(const VmRecord& r) {
  Json j = {{"name", r.name}, {"device", r.device}};
  if (!r.receive_device.empty()) j["receive_device"] = r.receive_device;
  j["inventory"] = r.inventory;
  return j;
}

Result<VmRecord> RecordFrom(const Json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("device") ||
      !j["device"].is_string()) {
    return InvalidArgument(what + ": expected {\"name\": ..., \"device\": ..., \"inventory\": {...}}");
  }
  VmRecord r;
  r.name = j["name"].get<std::string>();
  r.device = j["device"].get<std::string>();
  if (j.contains("receive_device") && j["receive_device"].is_string()) r.receive_device = j["receive_device"];
  r.inventory = j.contains("inventory") && j["inventory"].is_object() ? j["inventory"] : Json::object();
  r.inventory["name"] = r.name;
  r.inventory.erase("host");
  if (r.name.empty() || r.device.empty()) return InvalidArgument(what + ": name and device must not be empty");
  return r;
}

std::string ReadTail(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > static_cast<std::streamoff>(max_bytes) ? size - max_bytes : 0;
  in.seekg(from);
  std::string s(static_cast<size_t>(size - from), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

// The last non-empty line of a child's stderr: its latest progress line or error.
std::string LastLine(const std::string& path) {
  std::string t = ReadTail(path, 4096);
  for (char& c : t) {
    if (c == '\r') c = '\n';  // a redrawn progress line
  }
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

std::string Substitute(std::string s, const std::string& key, const std::string& value) {
  for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + value.size())) {
    s.replace(at, key.size(), value);
  }
  return s;
}

Status WriteFileSynced(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Unavailable(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return Unavailable(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
    }
    off += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced) return Unavailable(fmt::format("cannot fsync {}", tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Unavailable(fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(errno)));
  }
  return Status::Ok();
}

Json Reply(Json j) {
  j["ok"] = true;
  return j;
}

// A refusal its caller acts on by its code (RefusalCode), not by its words.
Json Refuse(RefusalCode code, std::string message) {
  return {{"ok", false}, {"error", std::move(message)}, {"code", RefusalCodeName(code)}};
}

Json Refusal(const Status& s, const std::string& host) {
  return {{"ok", false}, {"error", std::string(s.message())}, {"host", host}};
}

// The flags a controller may pass through to `gpumigrate migrate`.
const std::map<std::string, std::string>& MigrateOptions() {
  static const std::map<std::string, std::string> m = {
      {"max_stun", "--max-stun"}, {"downtime_target", "--downtime-target"}, {"bandwidth", "--bandwidth"},
      {"streams", "--streams"},   {"codec", "--codec"},                     {"warmup", "--warmup"},
      {"max_rounds", "--max-rounds"}, {"resume_window", "--resume-window"}, {"max_total", "--max-total"}};
  return m;
}

// A child's --json report (its stdout), where it printed one.
std::optional<Json> ReadJobReport(const std::string& path) {
  std::ifstream out(path);
  std::stringstream ss;
  ss << out.rdbuf();
  Json r = Json::parse(ss.str(), nullptr, false);
  if (!r.is_discarded() && r.is_object()) return r;
  return std::nullopt;
}

// Why a migration failed: its report's error where it printed one (the last
// line of its stderr is often a progress line).
std::string FailureReason(const Json& report, const std::string& last) {
  return report.is_object() && report.contains("error") && report["error"].is_string() &&
                 !report["error"].get<std::string>().empty()
             ? report["error"].get<std::string>()
             : last;
}

// The adopter a receiving device names ("adopt:NAME"), "" where it names none:
// refused where this host configures no such adopter.
Result<std::string> ReceiveAdopter(const std::string& device, const std::string& vm, const AgentConfig& config) {
  std::string adopter;
  if (device.rfind("adopt:", 0) == 0) {
    adopter = device.substr(6);
    if (!config.adopters.count(adopter)) {
      std::string known;
      for (const auto& [n, a] : config.adopters) known += (known.empty() ? "" : ", ") + n;
      return FailedPrecondition(fmt::format("{} needs the adopter '{}', which {} does not configure ({})", vm,
                                            adopter, config.host,
                                            known.empty() ? "it configures none" : "it has " + known));
    }
  }
  return adopter;
}

// The port a receiving child listens on, once it wrote it: 0 (or less) where it
// ended first or the wait ran out.
int WaitForListenPort(const std::string& port_file, const std::string& rc_file, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  int port = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream pf(port_file);
    if (pf >> port && port > 0) break;
    std::ifstream rcf(rc_file);
    int code = 0;
    if (rcf >> code) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return port;
}

}  // namespace

Agent::Agent(AgentConfig config, AgentOptions options, std::unique_ptr<Launcher> launcher)
    : config_(std::move(config)), options_(std::move(options)), launcher_(std::move(launcher)) {}

Agent::~Agent() = default;

Result<std::unique_ptr<Agent>> Agent::Open(AgentConfig config, AgentOptions options,
                                           std::unique_ptr<Launcher> launcher) {
  std::error_code ec;
  fs::create_directories(fs::path(options.state_dir) / "jobs", ec);
  if (ec) return Unavailable(fmt::format("cannot create {}/jobs: {}", options.state_dir, ec.message()));
  std::unique_ptr<Agent> a(new Agent(std::move(config), std::move(options), std::move(launcher)));
  if (fs::exists(fs::path(a->options_.state_dir) / "state.json")) {
    GM_RETURN_IF_ERROR(a->Load());
  } else {
    a->vms_ = a->config_.vms;
    // Job files left by an earlier state (one moved away): new ids start above them.
    for (const auto& e : fs::directory_iterator(fs::path(a->options_.state_dir) / "jobs", ec)) {
      const std::string stem = e.path().stem().string();
      if (!stem.empty() && stem.find_first_not_of("0123456789") == std::string::npos && stem.size() < 15) {
        a->next_job_ = std::max<int64_t>(a->next_job_, std::stoll(stem) + 1);
      }
    }
    a->findings_.push_back(fmt::format("first start: {} VMs from the configuration", a->vms_.size()));
    std::lock_guard<std::mutex> lock(a->mu_);
    GM_RETURN_IF_ERROR(a->Save());
  }
  std::lock_guard<std::mutex> lock(a->mu_);
  a->PollLocked();
  return a;
}

std::string Agent::JobPath(int64_t id, const char* ext) const {
  return (fs::path(options_.state_dir) / "jobs" / fmt::format("{}.{}", id, ext)).string();
}

Status Agent::Save() {
  Json j = {{"version", 1}, {"host", config_.host}, {"maintenance", maintenance_}, {"next_job", next_job_}};
  j["vms"] = Json::array();
  for (const auto& v : vms_) j["vms"].push_back(RecordJson(v));
  j["held"] = Json::object();
  for (const auto& [vm, why] : held_) j["held"][vm] = why;
  j["jobs"] = Json::array();
  for (const auto& job : jobs_) {
    Json o = JobJson(*job);
    o["pid"] = job->pid;
    o["token"] = job->token;
    o["record"] = RecordJson(job->record);
    if (job->adopter_pid != 0) {
      o["adopter_pid"] = job->adopter_pid;
      o["adopter_token"] = job->adopter_token;
    }
    j["jobs"].push_back(o);
  }
  // A child's stderr may hold any bytes: replaced, never a throw.
  return WriteFileSynced((fs::path(options_.state_dir) / "state.json").string(),
                         j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n");
}

Status Agent::Load() {
  const std::string path = (fs::path(options_.state_dir) / "state.json").string();
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  Json j = Json::parse(ss.str(), nullptr, false);
  auto bad = [&](const std::string& what) { return Corrupt(fmt::format("{}: {}", path, what)); };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object (a damaged state file: move it away to start afresh from the configuration, after checking no migration is in flight)");
  try {
    if (j.value("host", "") != config_.host) {
      return bad(fmt::format("is the state of host '{}', not of '{}'", j.value("host", ""), config_.host));
    }
    maintenance_ = j.at("maintenance").get<bool>();
    next_job_ = j.at("next_job").get<int64_t>();
    for (const auto& v : j.at("vms")) {
      GM_ASSIGN_OR_RETURN(auto r, RecordFrom(v, "vms[]"));
      vms_.push_back(std::move(r));
    }
    for (const auto& [vm, why] : j.at("held").items()) held_[vm] = why.get<std::string>();
    for (const auto& o : j.at("jobs")) {
      auto job = std::make_unique<Job>();
      job->id = o.at("id").get<int64_t>();
      job->kind = o.at("kind").get<std::string>();
      job->vm = o.at("vm").get<std::string>();
      const std::string state = o.at("state").get<std::string>();
      const std::optional<JobState> known = ParseJobState(state);
      if (!known) return bad(fmt::format("jobs: job {} has the unknown state '{}'", job->id, state));
      job->state = *known;
      job->pid = o.at("pid").get<int64_t>();
      job->token = o.at("token").get<std::string>();
      if (o.contains("rc") && !o["rc"].is_null()) job->rc = o["rc"].get<int>();
      job->detail = o.value("detail", "");
      job->to = o.value("to", "");
      job->port = o.value("port", 0);
      job->started_unix_ms = o.value("started_unix_ms", int64_t{0});
      job->ended_unix_ms = o.value("ended_unix_ms", int64_t{0});
      if (o.contains("report")) job->report = o["report"];
      job->adopter_pid = o.value("adopter_pid", int64_t{0});
      job->adopter_token = o.value("adopter_token", "");
      job->adopted_device = o.value("device", "");
      GM_ASSIGN_OR_RETURN(job->record, RecordFrom(o.at("record"), "jobs[].record"));
      jobs_.push_back(std::move(job));
    }
  } catch (const Json::exception& e) {
    return bad(fmt::format("unexpected content: {}", e.what()));
  }
  findings_.push_back(fmt::format("restarted: {} VMs, {} held, {} jobs on record", vms_.size(), held_.size(),
                                  jobs_.size()));
  for (const auto& [vm, why] : held_) findings_.push_back(fmt::format("{} is held: {}", vm, why));
  for (auto& job : jobs_) {
    if (job->state != JobState::kRunning) continue;
    if (job->pid == 0) {
      findings_.push_back(fmt::format("job {} ({} {}) was recorded but the agent stopped while starting it",
                                      job->id, job->kind, job->vm));
      Finish(*job, std::nullopt);
      continue;
    }
    if (launcher_->Alive(job->pid, job->token)) {
      findings_.push_back(fmt::format("job {} ({} {}) is still running as process {}: watching it", job->id,
                                      job->kind, job->vm, job->pid));
    } else {
      findings_.push_back(fmt::format("job {} ({} {}) ended while the agent was down", job->id, job->kind, job->vm));
    }
  }
  return Status::Ok();
}

int Agent::RunningJobs() const {
  int n = 0;
  for (const auto& j : jobs_) n += j->state == JobState::kRunning && (j->kind == "migrate" || j->kind == "receive");
  return n;
}

Json Agent::JobJson(const Job& job) const {
  Json j = {{"id", job.id}, {"kind", job.kind}, {"vm", job.vm}, {"state", JobStateName(job.state)}};
  j["rc"] = job.rc ? Json(*job.rc) : Json(nullptr);
  if (!job.detail.empty()) j["detail"] = job.detail;
  if (!job.to.empty()) j["to"] = job.to;
  if (job.port != 0) j["port"] = job.port;
  if (!job.adopted_device.empty()) j["device"] = job.adopted_device;
  j["started_unix_ms"] = job.started_unix_ms;
  if (job.ended_unix_ms != 0) j["ended_unix_ms"] = job.ended_unix_ms;
  if (job.state == JobState::kRunning) {
    j["progress"] = LastLine(JobPath(job.id, "err"));
    // A migration's session phase, as its process last wrote it ("starting":
    // none yet; absent: unreadable, so the caller keeps what it knew).
    // Its progress in numbers (the source's): bytes sent, its rate over the
    // last second, the current round's bytes (the dirty set) and how far it is.
    if (job.kind == "migrate" || job.kind == "receive") {
      std::ifstream in(JobPath(job.id, "phase"));
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      Json ph = Json::parse(text, nullptr, false);
      if (!in.is_open()) {
        j["session_phase"] = "starting";
      } else if (ph.is_object() && ph.contains("phase") && ph["phase"].is_string()) {
        j["session_phase"] = ph["phase"];
        if (ph.contains("round") && ph["round"].is_number_unsigned()) j["round"] = ph["round"];
        for (const char* key : {"bytes_sent", "bytes_applied", "bytes_per_s", "round_bytes_total", "round_bytes_done",
                                "predicted_stun_ms"}) {
          if (ph.contains(key) && ph[key].is_number()) j[key] = ph[key];
        }
      }
    }
  } else if (!job.report.is_null()) {
    j["report"] = job.report;
  }
  return j;
}

std::string Agent::Metrics() {
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
  Json jobs = Json::array();
  for (const auto& j : jobs_) jobs.push_back(JobJson(*j));
  return RenderAgentMetrics(Inventory(), jobs, NowMs());
}

void Agent::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
}

void Agent::PollLocked() {
  launcher_->Reap();
  bool changed = false;
  for (auto& job : jobs_) {
    if (job->state != JobState::kRunning || job->pid == 0) continue;  // pid 0: being started, or lost at Load
    if (options_.on_job_event && (job->kind == "migrate" || job->kind == "receive")) {
      std::ifstream pf(JobPath(job->id, "phase"));
      Json ph = Json::parse(pf, nullptr, false);
      if (ph.is_object() && ph.contains("phase") && ph["phase"].is_string() && ph["phase"] != job->logged_phase) {
        job->logged_phase = ph["phase"].get<std::string>();
        const int64_t round = ph.contains("round") && ph["round"].is_number() ? ph["round"].get<int64_t>() : 0;
        JobEvent(*job, job->logged_phase,
                 fmt::format("job {} ({} {}): {}, round {}", job->id, job->kind, job->vm, job->logged_phase, round));
      }
    }
    std::ifstream rc(JobPath(job->id, "rc"));
    int code = 0;
    if (rc >> code) {
      Finish(*job, code);
      changed = true;
    } else if (!launcher_->Alive(job->pid, job->token)) {
      std::ifstream again(JobPath(job->id, "rc"));  // it may have ended between the two looks
      if (again >> code) {
        Finish(*job, code);
      } else {
        Finish(*job, std::nullopt);
      }
      changed = true;
    }
  }
  if (changed) {
    if (Status st = Save(); !st.ok()) findings_.push_back("could not save: " + std::string(st.message()));
  }
}

void Agent::Finish(Job& job, std::optional<int> rc) {
  job.rc = rc;
  job.ended_unix_ms = NowMs();
  if (std::optional<Json> r = ReadJobReport(JobPath(job.id, "out"))) job.report = *r;
  const std::string last = LastLine(JobPath(job.id, "err"));
  const std::string why = FailureReason(job.report, last);
  auto remove_vm = [&] {
    std::erase_if(vms_, [&](const VmRecord& v) { return v.name == job.vm; });
  };
  if (job.kind == "migrate") {
    if (rc == 0) {
      job.state = JobState::kCompleted;
      job.detail = fmt::format("{} runs at {} now", job.vm, job.to);
      remove_vm();
    } else if (rc == 1 || rc == 2 || rc == 126 || rc == 127) {  // 126/127: the shell could not run it
      job.state = JobState::kFailed;
      job.detail = fmt::format("rolled back, {} runs here: {}", job.vm, why);
    } else {
      job.state = rc ? JobState::kInDoubt : JobState::kLost;
      job.detail = rc ? fmt::format("in doubt (exit {}): {}", *rc, why)
                      : "the migrating process ended without an exit status (killed?)";
      held_[job.vm] = fmt::format("job {}: {}; resolve with `gpumigrate resume` or `release` on the source, then "
                                  "the agent's resolve request",
                                  job.id, job.detail);
    }
  } else if (job.kind == "receive") {
    const bool verified = job.report.is_object() && job.report.value("verified", false);
    if (!job.adopted_device.empty()) job.record.device = job.adopted_device;  // the VM's process here
    if (rc == 0 && verified) {
      job.state = JobState::kCompleted;
      job.detail = fmt::format("{} received and verified{}", job.vm,
                               job.adopted_device.empty() ? "" : ", adopted by " + job.adopted_device);
      remove_vm();
      vms_.push_back(job.record);
    } else if (rc == 3 || !rc) {
      // In doubt, or vanished: this host may hold the verified state, stopped.
      // Kept and held, so the VM is never listed nowhere: an operator resolves
      // it (gone, when the source ran on).
      job.state = rc ? JobState::kInDoubt : JobState::kLost;
      job.detail = rc ? fmt::format("in doubt (exit 3): {}", why)
                      : "the receiving process ended without an exit status (killed?)";
      remove_vm();
      vms_.push_back(job.record);
      held_[job.vm] = fmt::format("job {}: {}; this host may hold the VM stopped: resolve (gone, if the source "
                                  "runs on)",
                                  job.id, job.detail);
    } else {
      job.state = JobState::kFailed;
      job.detail = fmt::format("nothing kept (exit {}{}): {}", *rc, rc == 0 ? ", not verified" : "", why);
      // The process that was to adopt it holds nothing: it goes too.
      if (job.adopter_pid != 0) launcher_->Kill(job.adopter_pid, job.adopter_token);
    }
  } else {  // a hook
    if (rc == 0) {
      job.state = JobState::kCompleted;
      if (job.kind == "drain" || job.kind == "power-off") {
        remove_vm();
      } else {
        remove_vm();
        vms_.push_back(job.record);
      }
      job.detail = last;
    } else {
      job.state = JobState::kFailed;
      job.detail = rc ? fmt::format("hook exited {}: {}", *rc, last) : "the hook ended without an exit status";
    }
  }
  if (!job.cancel_reason.empty()) job.detail = fmt::format("{}; {}", job.cancel_reason, job.detail);
  const std::string ended(JobStateName(job.state));
  JobEvent(job, ended, fmt::format("job {} ({} {}): {}: {}", job.id, job.kind, job.vm, ended, job.detail));
}

// "models": those the host entry names and those its content store holds
// (read afresh: a store gains a model when one is copied into it).
Json Agent::HostModels() const {
  std::set<std::string> all;
  const Json& named = config_.host_entry.contains("models") ? config_.host_entry["models"] : Json();
  if (named.is_array()) {
    for (const auto& m : named) {
      if (m.is_string()) all.insert(m.get<std::string>());
    }
  }
  if (!config_.content_store.empty()) {
    auto held = ContentStoreModels(config_.content_store);
    if (held.ok()) all.insert(held->begin(), held->end());
  }
  return Json(std::vector<std::string>(all.begin(), all.end()));
}

Json Agent::Inventory() const {
  Json host = config_.host_entry;
  host["name"] = config_.host;
  host["maintenance"] = maintenance_;
  if (!config_.content_store.empty()) host["models"] = HostModels();
  if (!options_.listen_address.empty()) host["agent"] = options_.listen_address;
  Json vms = Json::array();
  for (const auto& v : vms_) {
    Json e = v.inventory;
    e["name"] = v.name;
    e["host"] = config_.host;
    e["device"] = v.device;
    if (!v.receive_device.empty()) e["receive_device"] = v.receive_device;
    if (held_.count(v.name)) e["held"] = held_.at(v.name);
    vms.push_back(e);
  }
  Json running = Json::array();
  for (const auto& j : jobs_) {
    if (j->state == JobState::kRunning) running.push_back(JobJson(*j));
  }
  return {{"host", host}, {"groups", config_.groups}, {"vms", vms}, {"running", running},
          {"max_migrations", config_.max_migrations}};
}

// The VMs here, the VMs arriving (receives and replicas in flight) and `rec`,
// as one inventory of this host, through the planner's placement rules.
Status Agent::FitsLocked(const VmRecord& rec) const {
  Json inv = {{"version", 1}, {"hosts", Json::array({config_.host_entry})}, {"groups", config_.groups},
              {"vms", Json::array()}};
  inv["hosts"][0]["name"] = config_.host;
  std::vector<const VmRecord*> all;
  std::set<std::string> names;
  for (const auto& v : vms_) {
    all.push_back(&v);
    names.insert(v.name);
  }
  for (const auto& j : jobs_) {  // a drain's VM is already here; a migrate's leaves
    if (j->state == JobState::kRunning && (j->kind == "receive" || j->kind == "start-replica") && !names.count(j->vm)) {
      all.push_back(&j->record);
    }
  }
  all.push_back(&rec);
  for (const VmRecord* v : all) {
    Json e = v->inventory;
    e["name"] = v->name;
    e["host"] = config_.host;
    inv["vms"].push_back(e);
  }
  auto checked = planner::ParseInventory(inv.dump(-1, ' ', false, Json::error_handler_t::replace));
  if (!checked.ok()) {
    return FailedPrecondition(fmt::format("{} does not fit on {}: {}", rec.name, config_.host,
                                          checked.status().message()));
  }
  return Status::Ok();
}

// Records the job (no process yet: pid 0) before starting it, so an agent that
// dies between the two finds a job it cannot account for and holds its VM,
// rather than a child running that it does not know of.
Result<Agent::Job*> Agent::StartLocked(std::unique_ptr<Job> job, const std::vector<std::string>& argv) {
  GM_ASSIGN_OR_RETURN(Job * j, RecordLocked(std::move(job)));
  GM_RETURN_IF_ERROR(LaunchLocked(*j, argv));
  return j;
}

Result<Agent::Job*> Agent::RecordLocked(std::unique_ptr<Job> job) {
  job->id = next_job_++;
  job->started_unix_ms = NowMs();
  for (const char* ext : {"out", "err", "rc", "rc.tmp", "port", "rate", "phase", "adopter.out", "adopter.err", "adopter.rc",
                          "adopter.rc.tmp"}) {  // a job id's files from an earlier life
    std::error_code ec;
    fs::remove(JobPath(job->id, ext), ec);
  }
  Job* j = job.get();
  jobs_.push_back(std::move(job));
  if (Status st = Save(); !st.ok()) {
    jobs_.pop_back();
    return st;
  }
  return j;
}

// A job given up before its process ran: failed, with why, and saved.
Status Agent::LaunchLocked(Job& j, const std::vector<std::string>& argv) {
  auto started = launcher_->Start(argv, JobPath(j.id, "out"), JobPath(j.id, "err"), JobPath(j.id, "rc"));
  if (!started.ok()) {
    j.state = JobState::kFailed;
    j.detail = std::string(started.status().message());
    j.rc = 127;
    j.ended_unix_ms = NowMs();
    if (j.adopter_pid != 0) launcher_->Kill(j.adopter_pid, j.adopter_token);
    (void)Save();
    return started.status();
  }
  j.pid = started->id;
  j.token = started->token;
  JobEvent(j, "started", fmt::format("job {}: {} {}{} started", j.id, j.kind, j.vm, j.to.empty() ? "" : " to " + j.to));
  return Save();
}

void Agent::JobEvent(const Job& j, const std::string& phase, const std::string& message) {
  if (!options_.on_job_event) return;
  options_.on_job_event({{"job", j.id}, {"kind", j.kind}, {"vm", j.vm}, {"phase", phase}, {"message", message}});
}

// Starts the adopter NAME for a receive job recorded (pid 0) and waits, without
// holding the agent, for its "ready pid=PID" line; returns the device spec of
// that process. On any failure the adopter is stopped and the job failed.
Result<std::string> Agent::StartAdopter(std::unique_lock<std::mutex>& lock, Job& j, const std::string& name) {
  auto fail = [&](Status st) {
    if (j.adopter_pid != 0) launcher_->Kill(j.adopter_pid, j.adopter_token);
    j.state = JobState::kFailed;
    j.detail = std::string(st.message());
    j.ended_unix_ms = NowMs();
    (void)Save();
    return st;
  };
  const Adopter& a = config_.adopters.at(name);
  std::vector<std::string> argv;
  for (const auto& arg : a.command) argv.push_back(Substitute(Substitute(arg, "{vm}", j.vm), "{host}", config_.host));
  const std::string out = JobPath(j.id, "adopter.out"), err = JobPath(j.id, "adopter.err");
  auto started = launcher_->Start(argv, out, err, JobPath(j.id, "adopter.rc"));
  if (!started.ok()) return fail(started.status());
  j.adopter_pid = started->id;
  j.adopter_token = started->token;
  GM_RETURN_IF_ERROR(Save());
  lock.unlock();
  const auto deadline = std::chrono::steady_clock::now() + options_.port_wait;
  int64_t pid = 0;
  bool ended = false;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("ready pid=", 0) == 0) pid = std::atoll(line.c_str() + 10);
    }
    if (pid > 0) break;
    std::ifstream rcf(JobPath(j.id, "adopter.rc"));
    int code = 0;
    if (rcf >> code) {
      ended = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  lock.lock();
  if (pid <= 0) {
    const std::string why = LastLine(err);
    return fail(Unavailable(fmt::format("the adopter '{}' for {} on {} {}{}", name, j.vm, config_.host,
                                        ended ? "ended before it was ready"
                                              : fmt::format("said no \"ready pid=PID\" within {} ms",
                                                            options_.port_wait.count()),
                                        why.empty() ? "" : ": " + why)));
  }
  j.adopted_device = Substitute(a.device, "{pid}", std::to_string(pid));
  GM_RETURN_IF_ERROR(Save());
  return j.adopted_device;
}

Result<Json> Agent::Receive(const Json& req) {
  GM_ASSIGN_OR_RETURN(VmRecord rec, RecordFrom(req.value("vm", Json()), "receive: vm"));
  std::unique_lock<std::mutex> lock(mu_);
  PollLocked();
  if (maintenance_) return FailedPrecondition(fmt::format("{} is in maintenance: it receives no VMs", config_.host));
  for (const auto& v : vms_) {
    if (v.name == rec.name) return FailedPrecondition(fmt::format("{} already runs here", rec.name));
  }
  for (const auto& j : jobs_) {
    if (j->state == JobState::kRunning && j->vm == rec.name) {
      return Refuse(RefusalCode::kVmInJob, fmt::format("{} is already in job {} ({})", rec.name, j->id, j->kind));
    }
  }
  // Where the VM goes here: the plan's target (gpus, placement), checked with the
  // planner's own rules against what this host holds, so two receives can never
  // be given the same slot.
  if (req.contains("gpus")) rec.inventory["gpus"] = req["gpus"];
  if (req.contains("placement")) rec.inventory["placement"] = req["placement"];
  GM_RETURN_IF_ERROR(FitsLocked(rec));
  std::string device = rec.receive_device.empty() ? rec.device : rec.receive_device;
  GM_ASSIGN_OR_RETURN(const std::string adopter, ReceiveAdopter(device, rec.name, config_));
  // After the fit: "never fits here" tells a controller more than "busy now".
  if (RunningJobs() >= config_.max_migrations) {
    return Refuse(RefusalCode::kBusy, fmt::format("busy: {} of max_migrations {} running", RunningJobs(),
                                          config_.max_migrations));
  }
  auto job = std::make_unique<Job>();
  job->kind = "receive";
  job->vm = rec.name;
  job->record = rec;
  std::string addr = config_.data_address;
  if (addr.empty()) addr = options_.listen_address.substr(0, options_.listen_address.rfind(':'));
  const std::string listen = addr.find(':') != std::string::npos && addr.front() != '[' ? "[" + addr + "]:0"
                                                                                         : addr + ":0";
  GM_ASSIGN_OR_RETURN(Job * recorded, RecordLocked(std::move(job)));
  Job& jr = *recorded;
  if (!adopter.empty()) {
    GM_ASSIGN_OR_RETURN(device, StartAdopter(lock, jr, adopter));
  }
  const std::string port_file = JobPath(jr.id, "port");
  std::vector<std::string> argv = {options_.self_exe, "receive", "--listen", listen, "--port-file", port_file,
                                   "--phase-file", JobPath(jr.id, "phase"), "--device", device,
                                   "--accept-timeout", req.value("accept_timeout", "60s"), "--json"};
  if (!config_.content_store.empty()) {
    argv.push_back("--content-store");
    argv.push_back(config_.content_store);
  }
  argv.insert(argv.end(), options_.child_tls_args.begin(), options_.child_tls_args.end());
  GM_RETURN_IF_ERROR(LaunchLocked(jr, argv));
  // Wait for it to listen, without holding the agent.
  lock.unlock();
  const int port = WaitForListenPort(port_file, JobPath(jr.id, "rc"), options_.port_wait);
  lock.lock();
  if (port <= 0) {
    launcher_->Kill(jr.pid, jr.token);
    PollLocked();
    return Unavailable(fmt::format("the receiving process for {} did not listen within {} ms: {}", rec.name,
                                   options_.port_wait.count(), LastLine(JobPath(jr.id, "err"))));
  }
  PollLocked();
  if (jr.state != JobState::kRunning) {
    return Unavailable(fmt::format("the receiving process for {} ended at once: {}", rec.name, jr.detail));
  }
  jr.port = port;
  GM_RETURN_IF_ERROR(Save());
  return Reply({{"job", jr.id}, {"address", addr}, {"port", port}});
}

Result<Json> Agent::Migrate(const Json& req) {
  const std::string name = req.value("vm", "");
  const std::string to = req.value("to", "");
  if (name.empty() || to.empty()) return InvalidArgument("migrate needs \"vm\" and \"to\" (the receiver's ADDR:PORT)");
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
  const VmRecord* rec = nullptr;
  for (const auto& v : vms_) {
    if (v.name == name) rec = &v;
  }
  if (rec == nullptr) return FailedPrecondition(fmt::format("{} does not run on {}", name, config_.host));
  if (held_.count(name)) return FailedPrecondition(fmt::format("{} is held: {}", name, held_.at(name)));
  for (const auto& j : jobs_) {
    if (j->state == JobState::kRunning && j->vm == name) {
      return Refuse(RefusalCode::kVmInJob, fmt::format("{} is already in job {} ({})", name, j->id, j->kind));
    }
  }
  if (RunningJobs() >= config_.max_migrations) {
    return Refuse(RefusalCode::kBusy, fmt::format("busy: {} of max_migrations {} running", RunningJobs(),
                                          config_.max_migrations));
  }
  std::vector<std::string> argv = {options_.self_exe, "migrate", "--to", to, "--device", rec->device, "--json"};
  std::string pace;  // paced: the rate it starts at, changed later by the "pace" op
  if (req.contains("options")) {
    if (!req["options"].is_object()) return InvalidArgument("migrate: options must be an object");
    for (const auto& [k, v] : req["options"].items()) {
      if (k == "pace" && v.is_string()) {
        if (v.get<std::string>() != "0") GM_RETURN_IF_ERROR(ParseRateBytesPerS(v.get<std::string>()).status().WithContext("migrate: option 'pace'"));
        pace = v.get<std::string>();
        continue;
      }
      auto it = MigrateOptions().find(k);
      if (it == MigrateOptions().end() || !v.is_string()) {
        std::string known;
        for (const auto& [name2, flag] : MigrateOptions()) known += (known.empty() ? "" : ", ") + name2;
        return InvalidArgument(fmt::format(
            "migrate: option '{}' is not one the agent passes on ({}, pace, as strings)", k, known));
      }
      argv.push_back(it->second);
      argv.push_back(v.get<std::string>());
    }
  }
  argv.insert(argv.end(), options_.child_tls_args.begin(), options_.child_tls_args.end());
  auto job = std::make_unique<Job>();
  job->kind = "migrate";
  job->vm = name;
  job->record = *rec;
  job->to = to;
  GM_ASSIGN_OR_RETURN(Job * started, RecordLocked(std::move(job)));
  if (!pace.empty()) {
    const std::string file = JobPath(started->id, "rate");
    if (Status w = WriteRateFile(file, pace); !w.ok()) {
      started->state = JobState::kFailed;
      started->detail = std::string(w.message());
      started->rc = 127;
      started->ended_unix_ms = NowMs();
      (void)Save();
      return w;
    }
    argv.push_back("--bandwidth-file");
    argv.push_back(file);
  }
  argv.push_back("--phase-file");
  argv.push_back(JobPath(started->id, "phase"));
  GM_RETURN_IF_ERROR(LaunchLocked(*started, argv));
  const int64_t id = started->id;
  return Reply({{"job", id}});
}

// A paced migration's new rate (its share of the link changed): written to the
// file its process re-reads every 20 ms.
Result<Json> Agent::Pace(const Json& req) {
  const int64_t id = req.value("job", int64_t{0});
  const std::string rate = req.value("bandwidth", "");
  if (id == 0 || rate.empty()) return InvalidArgument("pace needs \"job\" and \"bandwidth\" (e.g. \"12MB/s\", \"0\": none)");
  if (rate != "0") GM_RETURN_IF_ERROR(ParseRateBytesPerS(rate).status().WithContext("pace: bandwidth"));
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
  for (const auto& j : jobs_) {
    if (j->id != id) continue;
    if (j->kind != "migrate") return FailedPrecondition(fmt::format("job {} is a {}, not a migration", id, j->kind));
    if (j->state != JobState::kRunning) {
      return FailedPrecondition(fmt::format("job {} has ended ({})", id, JobStateName(j->state)));
    }
    const std::string file = JobPath(id, "rate");
    if (!fs::exists(file)) return Refuse(RefusalCode::kNotPaced, fmt::format("job {} was not started paced", id));
    GM_RETURN_IF_ERROR(WriteRateFile(file, rate));
    return Reply({{"job", id}, {"bandwidth", rate}});
  }
  return FailedPrecondition(fmt::format("no job {} on {}", id, config_.host));
}

// A running migration or receive stopped (SIGTERM to its process, which ends
// as a cancel: a migration rolls back, its source running; a receive keeps
// nothing). The controller cancels a receive whose source has already failed:
// left alone, it would wait for an Abort queued behind a slow link while it
// holds the VM's placement here. Replies at once; the job's end shows in status.
Result<Json> Agent::Cancel(const Json& req) {
  const int64_t id = req.value("job", int64_t{0});
  if (id == 0) return InvalidArgument("cancel needs \"job\" (and may say \"reason\")");
  const std::string reason = req.value("reason", "");
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
  for (auto& j : jobs_) {
    if (j->id != id) continue;
    if (j->kind != "migrate" && j->kind != "receive") {
      return FailedPrecondition(fmt::format("job {} is a {} hook; only a migrate or receive job can be cancelled", id,
                                            j->kind));
    }
    if (j->state != JobState::kRunning) return Reply({{"job", id}, {"state", JobStateName(j->state)}});  // ended already: nothing to do
    j->cancel_reason = reason.empty() ? "cancelled" : "cancelled: " + reason;
    if (j->pid != 0) launcher_->Kill(j->pid, j->token);
    return Reply({{"job", id}, {"state", "cancelling"}});
  }
  return FailedPrecondition(fmt::format("no job {} on {}", id, config_.host));
}

Result<Json> Agent::RunHook(const Json& req, bool drain) {
  const char* op = drain ? "drain" : "start-replica";
  VmRecord rec;
  if (drain) {
    rec.name = req.value("vm", "");
    if (rec.name.empty()) return InvalidArgument("drain needs \"vm\"");
  } else {
    GM_ASSIGN_OR_RETURN(rec, RecordFrom(req.value("vm", Json()), "start-replica: vm"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
  std::string group = req.value("group", "");
  if (drain) {
    const VmRecord* here = nullptr;
    for (const auto& v : vms_) {
      if (v.name == rec.name) here = &v;
    }
    if (here == nullptr) return FailedPrecondition(fmt::format("{} does not run on {}", rec.name, config_.host));
    if (held_.count(rec.name)) return FailedPrecondition(fmt::format("{} is held: {}", rec.name, held_.at(rec.name)));
    rec = *here;
    if (group.empty() && rec.inventory.contains("group") && rec.inventory["group"].is_string()) {
      group = rec.inventory["group"].get<std::string>();
    }
  } else {
    if (maintenance_) return FailedPrecondition(fmt::format("{} is in maintenance: it starts no replicas", config_.host));
    for (const auto& v : vms_) {
      if (v.name == rec.name) return FailedPrecondition(fmt::format("{} already runs here", rec.name));
    }
    GM_RETURN_IF_ERROR(FitsLocked(rec));
    if (group.empty() && rec.inventory.contains("group") && rec.inventory["group"].is_string()) {
      group = rec.inventory["group"].get<std::string>();
    }
  }
  auto h = config_.hooks.find(group);
  if (group.empty() || h == config_.hooks.end()) {
    return FailedPrecondition(fmt::format("{}: {} is in no replica group configured on {}", op, rec.name,
                                          config_.host));
  }
  const std::vector<std::string>& cmd = drain ? h->second.drain : h->second.start_replica;
  if (cmd.empty()) return FailedPrecondition(fmt::format("group {} has no {} hook on {}", group, op, config_.host));
  for (const auto& j : jobs_) {
    if (j->state == JobState::kRunning && j->vm == rec.name) {
      return Refuse(RefusalCode::kVmInJob, fmt::format("{} is already in job {} ({})", rec.name, j->id, j->kind));
    }
  }
  std::vector<std::string> argv;
  for (const auto& a : cmd) {
    argv.push_back(Substitute(Substitute(Substitute(a, "{vm}", rec.name), "{group}", group), "{host}", config_.host));
  }
  auto job = std::make_unique<Job>();
  job->kind = op;
  job->vm = rec.name;
  job->record = rec;
  GM_ASSIGN_OR_RETURN(Job * started, StartLocked(std::move(job), argv));
  const int64_t id = started->id;
  return Reply({{"job", id}});
}

Result<Json> Agent::PowerOff(const Json& req) {
  const std::string name = req.contains("vm") && req["vm"].is_string() ? req["vm"].get<std::string>() : "";
  if (name.empty()) return InvalidArgument("power-off needs \"vm\"");
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
  const VmRecord* here = nullptr;
  for (const auto& v : vms_) {
    if (v.name == name) here = &v;
  }
  if (here == nullptr) return FailedPrecondition(fmt::format("{} does not run on {}", name, config_.host));
  if (held_.count(name)) return FailedPrecondition(fmt::format("{} is held: {}", name, held_.at(name)));
  if (config_.power_off.empty()) {
    return FailedPrecondition(fmt::format("{} has no power_off hook: an operator powers {} off", config_.host, name));
  }
  for (const auto& j : jobs_) {
    if (j->state == JobState::kRunning && j->vm == name) {
      return Refuse(RefusalCode::kVmInJob, fmt::format("{} is already in job {} ({})", name, j->id, j->kind));
    }
  }
  std::vector<std::string> argv;
  for (const auto& a : config_.power_off) argv.push_back(Substitute(Substitute(a, "{vm}", name), "{host}", config_.host));
  auto job = std::make_unique<Job>();
  job->kind = "power-off";
  job->vm = name;
  job->record = *here;
  GM_ASSIGN_OR_RETURN(Job * started, StartLocked(std::move(job), argv));
  const int64_t id = started->id;
  return Reply({{"job", id}});
}

// An operator resolved a held source (gpumigrate resume or release on it): the
// hold is lifted; "gone": true when the VM no longer runs here.
Result<Json> Agent::Release(const Json& req) {
  const std::string name = req.value("vm", "");
  if (req.contains("gone") && !req["gone"].is_boolean()) return InvalidArgument("resolve: gone must be true or false");
  const bool gone = req.value("gone", false);
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_.count(name)) return FailedPrecondition(fmt::format("{} is not held on {}", name, config_.host));
  held_.erase(name);
  if (gone) std::erase_if(vms_, [&](const VmRecord& v) { return v.name == name; });
  GM_RETURN_IF_ERROR(Save());
  return Reply({{"vm", name}});
}

Result<Json> Agent::JobsStatus(const Json& request) {
  std::lock_guard<std::mutex> lock(mu_);
  PollLocked();
  Json jobs = Json::array();
  const int64_t want = request.value("job", int64_t{0});
  for (const auto& j : jobs_) {
    if (want == 0 || j->id == want) jobs.push_back(JobJson(*j));
  }
  if (want != 0 && jobs.empty()) return FailedPrecondition(fmt::format("no job {} on {}", want, config_.host));
  return Reply({{"jobs", jobs}});
}

Result<Json> Agent::SetMaintenance(const Json& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!request.contains("enter") || !request["enter"].is_boolean()) {
    return InvalidArgument("maintenance needs \"enter\": true or false");
  }
  maintenance_ = request["enter"].get<bool>();
  GM_RETURN_IF_ERROR(Save());
  return Reply({{"maintenance", maintenance_}, {"vms", vms_.size()}});
}

Result<Json> Agent::Dispatch(Op op, const Json& request) {
  switch (op) {
    case Op::kInventory: {
      std::lock_guard<std::mutex> lock(mu_);
      PollLocked();
      return Reply(Inventory());
    }
    case Op::kStatus:
      return JobsStatus(request);
    case Op::kReceive:
      return Receive(request);
    case Op::kMigrate:
      return Migrate(request);
    case Op::kPace:
      return Pace(request);
    case Op::kCancel:
      return Cancel(request);
    case Op::kStartReplica:
      return RunHook(request, false);
    case Op::kDrain:
      return RunHook(request, true);
    case Op::kPowerOff:
      return PowerOff(request);
    case Op::kResolve:
      return Release(request);
    case Op::kMaintenance:
      break;
  }
  return SetMaintenance(request);
}

Json Agent::Handle(const Json& request) {
  const std::string op =
      request.is_object() && request.contains("op") && request["op"].is_string() ? request["op"].get<std::string>()
                                                                               : "";
  Result<Json> r = InvalidArgument(
      fmt::format("unknown op '{}' (inventory, status, receive, migrate, pace, cancel, start-replica, drain, "
                  "power-off, resolve, maintenance)",
                  op));
  try {
    if (const std::optional<Op> known = ParseOp(op)) r = Dispatch(*known, request);
  } catch (const Json::exception& e) {
    r = InvalidArgument(fmt::format("{}: a key of the wrong type: {}", op, e.what()));
  } catch (const std::exception& e) {  // never let one request end the agent
    r = Internal(fmt::format("{}: {}", op, e.what()));
  }
  if (!r.ok()) return Refusal(r.status(), config_.host);
  Json out = *r;
  if (!out.contains("host")) out["host"] = config_.host;  // the inventory's own "host" says it already
  return out;
}

}  // namespace gpumigrate::agent
