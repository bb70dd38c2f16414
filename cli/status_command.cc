#include "cli/status_command.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/agent/agent.h"
#include "cli/plan_command.h"
#include "cli/print.h"
#include "gpumigrate/evacuation/evacuation_store.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {
namespace {

using agent::Json;

// "2026-12-07 10:31:02 UTC" for a Unix time in ms (-1: now).
std::string FormatUnixMs(int64_t ms) {
  if (ms < 0) {
    ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
             .count();
  }
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

std::string Cut(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

// A running migration's progress as its agent reports it: "round-start r2 31.5 MiB 12.0 MB/s".
std::string Progress(const Json& job) {
  std::string s = job.value("session_phase", "");
  if (job.contains("round")) s += fmt::format(" r{}", job["round"].get<int64_t>());
  for (const char* key : {"bytes_sent", "bytes_applied"}) {  // the source's, the destination's
    if (job.contains(key) && job[key].is_number()) s += " " + FormatBytes(job[key].get<double>());
  }
  if (job.contains("bytes_per_s") && job["bytes_per_s"].is_number()) {
    s += fmt::format(" {:.1f} MB/s", job["bytes_per_s"].get<double>() / 1e6);
  }
  return s;
}

// One agent's jobs: running ones first, then the last ended ones.
Result<std::string> AgentView(const StatusFlags& f, std::chrono::milliseconds timeout, Json* raw) {
  auto r = agent::CallAgent(f.agent, f.tls, agent::Request(agent::Op::kStatus), timeout);
  if (!r.ok()) return r.status();
  if (!r->value("ok", false)) return Unavailable(fmt::format("{} refused: {}", f.agent, r->value("error", "")));
  *raw = *r;
  std::string out = fmt::format("{:<5} {:<14} {:<10} {:<10} {:<38} {}\n", "job", "vm", "kind", "state", "progress",
                                "detail");
  std::vector<Json> jobs((*r)["jobs"].begin(), (*r)["jobs"].end());
  std::stable_partition(jobs.begin(), jobs.end(), [](const Json& j) { return j.value("state", "") == "running"; });
  for (const auto& j : jobs) {
    const bool running = j.value("state", "") == "running";
    out += fmt::format("{:<5} {:<14} {:<10} {:<10} {:<38} {}\n", j.value("id", int64_t{0}), j.value("vm", ""),
                       j.value("kind", ""), j.value("state", ""), running ? Cut(Progress(j), 38) : "",
                       Cut(running ? j.value("progress", "") : j.value("detail", ""), 80));
  }
  if (jobs.empty()) out += "(no jobs)\n";
  return out;
}

// Every agent's running jobs by VM, from the inventory's hosts (unreachable ones skipped).
std::map<std::string, Json> RunningJobs(const StatusFlags& f, std::chrono::milliseconds timeout) {
  std::map<std::string, Json> by_vm;
  if (f.inventory.empty()) return by_vm;
  std::string text, error;
  if (!ReadWholeFile(f.inventory, &text, &error)) return by_vm;
  Json inv = Json::parse(text, nullptr, false);
  if (!inv.is_object() || !inv.contains("hosts")) return by_vm;
  for (const auto& h : inv["hosts"]) {
    if (!h.contains("agent") || !h["agent"].is_string()) continue;
    auto r = agent::CallAgent(h["agent"].get<std::string>(), f.tls, agent::Request(agent::Op::kStatus), timeout);
    if (!r.ok() || !r->value("ok", false)) continue;
    for (const auto& j : (*r)["jobs"]) {
      if (j.value("state", "") == "running" && j.value("kind", "") == "migrate") by_vm[j.value("vm", "")] = j;
    }
  }
  return by_vm;
}

// The evacuations in the store (or --id's): each VM's state from its journal,
// with a running migration's progress from its source agent.
Result<std::string> StoreView(const StatusFlags& f, EvacuationStore& store, std::chrono::milliseconds timeout,
                              Json* raw) {
  GM_ASSIGN_OR_RETURN(auto entries, store.Journal(f.id));
  if (!f.id.empty() && entries.empty()) return FailedPrecondition(fmt::format("no evacuation {} in {}", f.id, store.Describe()));
  std::map<std::string, std::vector<JournalEntry>> by_evacuation;
  for (auto& e : entries) by_evacuation[e.evacuation].push_back(e);
  const auto running = RunningJobs(f, timeout);
  std::string out;
  *raw = Json::array();
  for (const auto& [evac, list] : by_evacuation) {
    std::map<std::string, const JournalEntry*> last;  // each VM's latest entry
    for (const auto& e : list) last[e.vm] = &e;
    out += fmt::format("evacuation {} ({} entries, last {})\n", evac, list.size(),
                       FormatUnixMs(list.back().unix_ms));
    out += fmt::format("  {:<14} {:<18} {:<8} {:<10} {:>3} {:<38} {}\n", "vm", "action", "target", "state", "try",
                       "progress", "detail");
    Json vms = Json::array();
    for (const auto& s : SummarizeJournal(list)) {
      const JournalEntry& e = *last[s.vm];
      std::string progress;
      Json v = {{"vm", s.vm}, {"action", s.action}, {"target", s.target},
                {"state", std::string(JournalPhaseName(s.last))}, {"attempts", s.attempts}, {"detail", e.detail}};
      if (s.unresolved()) {
        if (auto it = running.find(s.vm); it != running.end()) {
          progress = Progress(it->second);
          v["job"] = it->second;
        }
      }
      out += fmt::format("  {:<14} {:<18} {:<8} {:<10} {:>3} {:<38} {}\n", s.vm, s.action,
                         s.target.empty() ? "-" : s.target, JournalPhaseName(s.last), s.attempts, Cut(progress, 38),
                         Cut(e.detail, 70));
      vms.push_back(v);
    }
    raw->push_back({{"evacuation", evac}, {"vms", vms}});
  }
  if (by_evacuation.empty()) out += fmt::format("no evacuation in {}\n", store.Describe());
  return out;
}

}  // namespace

CLI::App* AddStatusCommand(CLI::App& app, StatusFlags& f) {
  auto* c = app.add_subcommand(
      "status",
      "What is happening now: a running agent's jobs (--agent), or an evacuation's VMs from its journal (--store / "
      "--etcd), each running migration's phase, round, bytes and rate from its agent; --watch follows it live.");
  c->add_option("--agent", f.agent, "ADDR:PORT of a running agent: its jobs (mutual TLS: --tls-*)");
  c->add_option("--store", f.store, "An evacuation's state store, a directory: its journal");
  c->add_option("--etcd", f.etcd, "An evacuation's state store in etcd at http://HOST:PORT");
  c->add_option("--etcd-prefix", f.etcd_prefix, "Every key under this prefix")->capture_default_str();
  c->add_option("--id", f.id, "The evacuation (default: every one in the store)");
  c->add_option("--inventory", f.inventory,
                "The fleet (its hosts' \"agent\"): the running migrations' progress is asked of the agents");
  c->add_flag("--watch", f.watch, "Redraw every --interval until interrupted (Ctrl-C)");
  c->add_option("--interval", f.interval, "How often --watch redraws")->capture_default_str();
  c->add_option("--timeout", f.timeout, "How long one request to an agent may take")->capture_default_str();
  c->add_flag("--json", f.json, "Print one JSON object (with --watch: one per line, every --interval)");
  c->add_option("--tls-ca", f.tls.ca, "CA certificate (PEM) that signs the agents' certificates");
  c->add_option("--tls-cert", f.tls.cert, "This side's certificate chain (PEM)");
  c->add_option("--tls-key", f.tls.key, "This side's private key (PEM)");
  return c;
}

int RunStatus(const StatusFlags& f, const std::atomic<bool>& cancel) {
  auto usage = [](const std::string& m) {
    Print(stderr, "gpumigrate status: {}\n", m);
    return 2;
  };
  const int sources = !f.agent.empty() + !f.store.empty() + !f.etcd.empty();
  if (sources != 1) return usage("name one thing to ask: --agent ADDR:PORT, --store DIR or --etcd http://HOST:PORT");
  const bool tls_given = !f.tls.ca.empty() || !f.tls.cert.empty() || !f.tls.key.empty();
  const bool tls_all = !f.tls.ca.empty() && !f.tls.cert.empty() && !f.tls.key.empty();
  if ((!f.agent.empty() || !f.inventory.empty() || tls_given) && !tls_all) {
    return usage("asking agents needs --tls-ca, --tls-cert and --tls-key");
  }
  auto interval = ParseDuration(f.interval);
  auto timeout = ParseDuration(f.timeout);
  if (!interval.ok() || !timeout.ok()) {
    return usage(std::string((!interval.ok() ? interval.status() : timeout.status()).message()));
  }
  const auto to = std::chrono::duration_cast<std::chrono::milliseconds>(*timeout);
  std::unique_ptr<EvacuationStore> store;
  if (f.agent.empty()) {
    auto s = f.store.empty() ? OpenEtcdStore(f.etcd, f.etcd_prefix) : OpenFileStore(f.store);
    if (!s.ok()) return usage(fmt::format("state store: {}", s.status().message()));
    store = std::move(s).value();
  }
  const bool tty = isatty(STDOUT_FILENO);
  for (bool first = true; first || (f.watch && !cancel.load()); first = false) {
    Json raw;
    Result<std::string> view = f.agent.empty() ? StoreView(f, *store, to, &raw) : AgentView(f, to, &raw);
    if (!view.ok() && !f.watch) {
      Print(stderr, "gpumigrate status: {}\n", view.status().message());
      return view.status().code() == StatusCode::kFailedPrecondition ? 1 : 2;
    }
    if (f.json) {
      Print("{}\n", view.ok() ? raw.dump(-1, ' ', false, Json::error_handler_t::replace)
                              : Json({{"error", view.status().message()}}).dump());
    } else {
      // --watch redraws in place on a terminal (and in tmux); piped, it appends.
      if (f.watch && tty) Print("\x1b[H\x1b[2J");
      if (f.watch) Print("gpumigrate status  {}  (every {}; Ctrl-C stops)\n\n", FormatUnixMs(-1), f.interval);
      Print("{}", view.ok() ? *view : fmt::format("(no answer: {})\n", view.status().message()));
    }
    std::fflush(stdout);
    if (!f.watch) break;
    const auto until = std::chrono::steady_clock::now() + *interval;
    while (!cancel.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return 0;
}

}  // namespace gpumigrate::cli
