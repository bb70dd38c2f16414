// The agent's pieces: its configuration (checked with the planner's rules), the
// control channel's framing, the request handler over a fake launcher (jobs,
// limits, holds, restarts), and the real process launcher.
#include "gpumigrate/agent/agent.h"
#include "gpumigrate/common/rate_file.h"
#include "gpumigrate/planner/planner.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace gpumigrate::agent {
namespace {

namespace fs = std::filesystem;

constexpr const char* kConfig = R"({
  "version": 1,
  "host": { "name": "gpu-a", "link": "10Gbit", "max_migrations": 2,
            "gpus": [ { "index": 0, "model": "H100-80GB", "mode": "mig" },
                      { "index": 1, "model": "H100-80GB", "mode": "passthrough" } ] },
  "data_address": "127.0.0.1",
  "groups": [ { "name": "chat", "min_serving": 1, "replica_start": "2s",
                "hooks": { "start_replica": ["hook", "start", "{vm}", "{group}", "{host}"],
                           "drain": ["hook", "drain", "{vm}"] } } ],
  "vms": [
    { "name": "llm-1", "device": "sim:size=8MiB", "gpus": [0], "profile": "3g.40gb", "placement": 0,
      "class": "inference" },
    { "name": "chat-1", "device": "sim:size=4MiB", "gpus": [0], "profile": "1g.10gb", "placement": 4,
      "class": "stateless-inference", "group": "chat" }
  ]
})";

Json Parsed(const char* text) { return Json::parse(text); }

std::string WithVm(const std::string& extra_vm) {
  Json j = Parsed(kConfig);
  j["vms"].push_back(Json::parse(extra_vm));
  return j.dump();
}

TEST(AgentConfig, ReadsHostVmsGroupsAndHooks) {
  auto c = ParseAgentConfig(kConfig);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->host, "gpu-a");
  EXPECT_EQ(c->max_migrations, 2);
  EXPECT_EQ(c->data_address, "127.0.0.1");
  ASSERT_EQ(c->vms.size(), 2u);
  EXPECT_EQ(c->vms[0].device, "sim:size=8MiB");
  EXPECT_FALSE(c->vms[0].inventory.contains("device"));
  EXPECT_EQ(c->vms[1].inventory["group"], "chat");
  EXPECT_EQ(c->hooks.at("chat").drain, (std::vector<std::string>{"hook", "drain", "{vm}"}));
  EXPECT_FALSE(c->groups[0].contains("hooks"));
}

TEST(AgentConfig, ErrorsNameTheKey) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {"[]", "not a JSON object"},
      {R"({"version": 2, "host": {}})", "version"},
      {R"({"version": 1})", "host: missing"},
      // The planner's own rules, with this file's key names.
      {WithVm(R"({"name": "x", "device": "sim", "gpus": [0], "profile": "3g.40gb", "placement": 2,
                  "class": "inference"})"),
       "vms[2].placement"},
      {WithVm(R"({"name": "x", "gpus": [1], "profile": "passthrough", "class": "inference"})"), "vms[2].device: missing"},
      {WithVm(R"({"name": "x", "host": "gpu-b", "device": "sim", "gpus": [1], "profile": "passthrough",
                  "class": "inference"})"),
       "vms[2].host"},
  };
  for (const auto& c : cases) {
    auto r = ParseAgentConfig(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(std::string(r.status().message()).find(c.want), std::string::npos) << r.status().message();
  }
  Json j = Parsed(kConfig);
  j["groups"][0]["hooks"]["drain"] = "not an array";
  auto r = ParseAgentConfig(j.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("groups[0].hooks.drain"), std::string::npos);
  j = Parsed(kConfig);
  j["host"]["link"] = "fast";
  r = ParseAgentConfig(j.dump());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(std::string(r.status().message()).rfind("host.link", 0), 0u) << r.status().message();
}

TEST(AgentMessage, RoundTripsAndRefusesDamage) {
  auto [a, b] = MakePipe("agent-test");
  Json m = {{"op", "inventory"}, {"n", 3}};
  ASSERT_TRUE(WriteMessage(*a, m).ok());
  auto got = ReadMessage(*b);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, m);

  // A length over the limit is refused before the body is read.
  const std::byte big[4] = {std::byte(0x7f), std::byte(0xff), std::byte(0xff), std::byte(0xff)};
  ASSERT_TRUE(a->WriteAll(big).ok());
  got = ReadMessage(*b);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(std::string(got.status().message()).find("over the limit"), std::string::npos);

  auto [c, d] = MakePipe("agent-test-2");
  const char body[] = "[1,2]";
  const std::byte len[4] = {std::byte(0), std::byte(0), std::byte(0), std::byte(5)};
  ASSERT_TRUE(c->WriteAll(len).ok());
  ASSERT_TRUE(c->WriteAll(std::as_bytes(std::span(body, 5))).ok());
  got = ReadMessage(*d);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(std::string(got.status().message()).find("not a JSON object"), std::string::npos);

  // Cut off within the body; then a clean close before a message is kUnavailable.
  const std::byte len9[4] = {std::byte(0), std::byte(0), std::byte(0), std::byte(9)};
  ASSERT_TRUE(c->WriteAll(len9).ok());
  ASSERT_TRUE(c->WriteAll(std::as_bytes(std::span(body, 2))).ok());
  c->Close();
  got = ReadMessage(*d);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(std::string(got.status().message()).find("cut off"), std::string::npos);
  auto [e, f] = MakePipe("agent-test-3");
  e->Close();
  got = ReadMessage(*f);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
}

// Records every start; a test ends a child by writing its files.
struct FakeChildren {
  struct Child {
    std::vector<std::string> argv;
    std::string out, err, rc;
    bool alive = true;
  };
  std::vector<Child> started;
  bool listen = true;  // a receive child writes its port file at once
  // An adopter ("adopt-cmd ..."): what it writes to stdout at once, and whether
  // it then ends (exit 1, its stderr saying why).
  std::string adopter_out = "ready pid=777 role=adopt\n";
  bool adopter_ends = false;
};

class FakeLauncher : public Launcher {
 public:
  explicit FakeLauncher(FakeChildren* c) : c_(c) {}
  Result<Started> Start(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
                        const std::string& rc) override {
    c_->started.push_back({argv, out, err, rc, true});
    if (!argv.empty() && argv[0] == "adopt-cmd") {
      std::ofstream(out) << c_->adopter_out;
      if (c_->adopter_ends) {
        std::ofstream(err) << "workload: cannot map 64 MiB\n";
        std::ofstream(rc) << 1 << "\n";
        c_->started.back().alive = false;
      }
      return Started{static_cast<int64_t>(c_->started.size()), "t" + std::to_string(c_->started.size())};
    }
    std::ofstream(err) << "round 0: 1 MB\n";
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--port-file" && c_->listen) std::ofstream(argv[i + 1]) << 4242 << "\n";
    }
    return Started{static_cast<int64_t>(c_->started.size()), "t" + std::to_string(c_->started.size())};
  }
  bool Alive(int64_t id, const std::string& token) override {
    return id >= 1 && id <= static_cast<int64_t>(c_->started.size()) && token == "t" + std::to_string(id) &&
           c_->started[id - 1].alive;
  }
  void Kill(int64_t id, const std::string&) override {
    if (id >= 1 && id <= static_cast<int64_t>(c_->started.size())) c_->started[id - 1].alive = false;
  }

 private:
  FakeChildren* c_;
};

// The value a child's command line gives `flag` ("" when it has none).
std::string After(const std::vector<std::string>& argv, const std::string& flag) {
  auto at = std::find(argv.begin(), argv.end(), flag);
  return at == argv.end() || at + 1 == argv.end() ? "" : *(at + 1);
}

void End(FakeChildren& c, size_t index, int rc, const std::string& report) {
  std::ofstream(c.started[index].out) << report;
  std::ofstream(c.started[index].rc) << rc << "\n";
  c.started[index].alive = false;
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("gm-agent-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    Reopen();
  }
  void TearDown() override {
    agent_.reset();
    fs::remove_all(dir_);
  }
  void Reopen(const std::string& config = kConfig) {
    agent_.reset();
    auto cfg = ParseAgentConfig(config);
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    AgentOptions o;
    o.self_exe = "/usr/bin/gpumigrate";
    o.state_dir = dir_.string();
    o.listen_address = "127.0.0.1:7070";
    o.child_tls_args = {"--tls-ca", "ca.pem"};
    o.port_wait = std::chrono::milliseconds(300);
    o.on_job_event = [this](const Json& e) { events_.push_back(e); };
    auto a = Agent::Open(std::move(*cfg), o, std::make_unique<FakeLauncher>(&children_));
    ASSERT_TRUE(a.ok()) << a.status().message();
    agent_ = std::move(*a);
  }
  Json Call(Json req) { return agent_->Handle(req); }
  std::vector<std::string> VmNames() {
    std::vector<std::string> names;
    const Json inv = Call({{"op", "inventory"}});  // kept: a loop over a temporary's member would dangle
    for (const auto& v : inv["vms"]) names.push_back(v["name"]);
    return names;
  }
  std::string Error(const Json& reply) {
    EXPECT_FALSE(reply.value("ok", true)) << reply.dump();
    return reply.value("error", "");
  }

  fs::path dir_;
  std::vector<Json> events_;  // on_job_event's
  FakeChildren children_;
  std::unique_ptr<Agent> agent_;
};

const char* kIncoming = R"({"name": "llm-9", "device": "sim:size=8MiB",
  "inventory": {"gpus": [0], "profile": "3g.40gb", "placement": 0, "class": "inference"}})";

// Every request has one name, shared by the agent and its callers.
TEST(AgentOps, EveryOpHasOneNameBothEndsRead) {
  std::set<std::string> names;
  for (Op op : {Op::kInventory, Op::kStatus, Op::kReceive, Op::kMigrate, Op::kPace, Op::kCancel, Op::kStartReplica,
                Op::kDrain, Op::kPowerOff, Op::kResolve, Op::kMaintenance}) {
    const std::string name(OpName(op));
    EXPECT_TRUE(names.insert(name).second) << name << " named twice";
    EXPECT_EQ(ParseOp(name), op) << name;
    EXPECT_EQ(Request(op, {{"job", 3}}), (Json{{"job", 3}, {"op", name}}));
  }
  EXPECT_FALSE(ParseOp("power_off").has_value());
  EXPECT_FALSE(ParseOp("").has_value());
  for (JobState s : {JobState::kRunning, JobState::kCompleted, JobState::kFailed, JobState::kInDoubt, JobState::kLost}) {
    EXPECT_EQ(ParseJobState(JobStateName(s)), s);
  }
  EXPECT_FALSE(ParseJobState("in_doubt").has_value()) << "the report's spelling is not a job state";
}

TEST_F(AgentTest, InventoryIsThePlannersFormat) {
  Json inv = Call({{"op", "inventory"}});
  ASSERT_TRUE(inv["ok"]) << inv.dump();
  EXPECT_EQ(inv["host"]["name"], "gpu-a");
  EXPECT_EQ(inv["host"]["agent"], "127.0.0.1:7070");
  EXPECT_EQ(inv["host"]["maintenance"], false);
  ASSERT_EQ(inv["vms"].size(), 2u);
  EXPECT_EQ(inv["vms"][0]["host"], "gpu-a");
  EXPECT_EQ(inv["vms"][0]["device"], "sim:size=8MiB");
  EXPECT_EQ(inv["max_migrations"], 2);
  EXPECT_NE(Error(Call({{"op", "fly"}})).find("unknown op 'fly'"), std::string::npos);
}

TEST_F(AgentTest, MigrateRunsTheCliAndTheVmLeavesOnlyWhenItCompleted) {
  Json r = Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "10.0.0.2:5000"}, {"options", {{"max_stun", "2s"}}}});
  ASSERT_TRUE(r["ok"]) << r.dump();
  ASSERT_EQ(children_.started.size(), 1u);
  const std::string phase_file = (dir_ / "jobs" / fmt::format("{}.phase", r["job"].get<int64_t>())).string();
  const std::vector<std::string> want = {"/usr/bin/gpumigrate", "migrate", "--to", "10.0.0.2:5000", "--device",
                                         "sim:size=8MiB", "--json", "--max-stun", "2s", "--tls-ca", "ca.pem",
                                         "--phase-file", phase_file};
  EXPECT_EQ(children_.started[0].argv, want);
  // While it runs: reported with its progress line, and not started twice.
  Json st = Call({{"op", "status"}, {"job", r["job"]}});
  EXPECT_EQ(st["jobs"][0]["state"], "running");
  EXPECT_EQ(st["jobs"][0]["progress"], "round 0: 1 MB");
  EXPECT_EQ(st["jobs"][0]["session_phase"], "starting") << "no phase written yet";
  // The session's phase, as the child writes it (the controller paces by it).
  std::ofstream(phase_file) << R"({"phase": "round-start", "round": 2})";
  st = Call({{"op", "status"}, {"job", r["job"]}});
  EXPECT_EQ(st["jobs"][0]["session_phase"], "round-start");
  EXPECT_EQ(st["jobs"][0]["round"], 2);
  std::ofstream(phase_file) << "{torn";
  EXPECT_FALSE(Call({{"op", "status"}, {"job", r["job"]}})["jobs"][0].contains("session_phase"));
  const Json again = Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "10.0.0.3:5000"}});
  EXPECT_EQ(RefusalCodeOf(again), RefusalCode::kVmInJob) << again.dump();
  EXPECT_NE(Error(again).find("already in job"),
            std::string::npos);
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", "nope"}, {"to", "x:1"}})).find("does not run on gpu-a"),
            std::string::npos);
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", "chat-1"}, {"to", "x:1"}, {"options", {{"rm", "-rf"}}}}))
                .find("option 'rm' is not one the agent passes on"),
            std::string::npos);
  End(children_, 0, 0, R"({"outcome": "completed", "verified": true, "stun_ms": 12.5})");
  st = Call({{"op", "status"}, {"job", r["job"]}});
  EXPECT_EQ(st["jobs"][0]["state"], "completed");
  EXPECT_EQ(st["jobs"][0]["report"]["stun_ms"], 12.5);
  EXPECT_EQ(VmNames(), std::vector<std::string>{"chat-1"});
}

// A paced migration (an evacuation's controller divides the link): its process
// follows a rate file the agent rewrites on "pace"; an ended job is refused.
TEST_F(AgentTest, APacedMigrationFollowsTheRateTheAgentWrites) {
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}, {"options", {{"pace", "x"}}}}))
                .find("option 'pace'"),
            std::string::npos);
  Json r = Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}, {"options", {{"pace", "12MB/s"}}}});
  ASSERT_TRUE(r["ok"]) << r.dump();
  const auto& argv = children_.started[0].argv;
  auto at = std::find(argv.begin(), argv.end(), "--bandwidth-file");
  ASSERT_NE(at, argv.end());
  ASSERT_NE(at + 1, argv.end());
  const std::string file = *(at + 1);
  auto rate = ReadRateFile(file);
  ASSERT_TRUE(rate.ok()) << rate.status().message();
  EXPECT_DOUBLE_EQ(*rate, 12e6);
  Json p = Call({{"op", "pace"}, {"job", r["job"]}, {"bandwidth", "3MB/s"}});
  ASSERT_TRUE(p["ok"]) << p.dump();
  EXPECT_DOUBLE_EQ(*ReadRateFile(file), 3e6);
  EXPECT_NE(Error(Call({{"op", "pace"}, {"job", r["job"]}, {"bandwidth", "fast"}})).find("pace: bandwidth"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(*ReadRateFile(file), 3e6) << "a refused pace changes nothing";
  EXPECT_NE(Error(Call({{"op", "pace"}, {"job", 99}, {"bandwidth", "1MB/s"}})).find("no job 99"), std::string::npos);
  End(children_, 0, 0, R"({"outcome": "completed", "verified": true})");
  EXPECT_NE(Error(Call({{"op", "pace"}, {"job", r["job"]}, {"bandwidth", "1MB/s"}})).find("has ended"),
            std::string::npos);
  // Unpaced: no file, and pace says so.
  Json u = Call({{"op", "migrate"}, {"vm", "chat-1"}, {"to", "h:1"}});
  ASSERT_TRUE(u["ok"]);
  EXPECT_EQ(std::count(children_.started[1].argv.begin(), children_.started[1].argv.end(), "--bandwidth-file"), 0);
  const Json unpaced = Call({{"op", "pace"}, {"job", u["job"]}, {"bandwidth", "1MB/s"}});
  EXPECT_EQ(RefusalCodeOf(unpaced), RefusalCode::kNotPaced) << unpaced.dump();
  EXPECT_NE(Error(unpaced).find("not started paced"),
            std::string::npos);
}

// /metrics: the host's gauges, a running migration's progress as its process
// writes it, and counters over ended jobs (each line as Prometheus reads it).
TEST_F(AgentTest, MetricsShowTheHostARunningMigrationAndTheEndedOnes) {
  auto has = [](const std::string& text, const std::string& line) {
    return text.find("\n" + line + "\n") != std::string::npos;
  };
  std::string m = agent_->Metrics();
  EXPECT_TRUE(has(m, R"(gpumigrate_host_vms{host="gpu-a"} 2)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_host_max_migrations{host="gpu-a"} 2)")) << m;
  // GPU 0 (MIG, 8 slices): llm-1's 3g.40gb holds 4, chat-1's 1g.10gb 1. GPU 1: passthrough, free.
  EXPECT_TRUE(has(m, R"(gpumigrate_gpu_mig_slices_free{host="gpu-a",gpu="0"} 3)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_gpu_passthrough_free{host="gpu-a",gpu="1"} 1)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_host_migrations_in_flight{host="gpu-a",direction="out"} 0)")) << m;

  Json r = Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}});
  ASSERT_TRUE(r["ok"]) << r.dump();
  const std::string phase_file = (dir_ / "jobs" / fmt::format("{}.phase", r["job"].get<int64_t>())).string();
  m = agent_->Metrics();
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_phase{host="gpu-a",vm="llm-1",direction="out",phase="starting"} 1)"))
      << m;
  std::ofstream(phase_file) << R"({"phase": "round-start", "round": 1, "bytes_sent": 9000000, "bytes_per_s": 2500000,
                                   "round_bytes_total": 1048576, "round_bytes_done": 4096, "predicted_stun_ms": 250})";
  m = agent_->Metrics();
  EXPECT_TRUE(has(m, R"(gpumigrate_host_migrations_in_flight{host="gpu-a",direction="out"} 1)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_phase{host="gpu-a",vm="llm-1",direction="out",phase="round-start"} 1)"))
      << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_phase{host="gpu-a",vm="llm-1",direction="out",phase="starting"} 0)"))
      << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_round{host="gpu-a",vm="llm-1",direction="out"} 1)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_sent_bytes_total{host="gpu-a",vm="llm-1",direction="out"} 9000000)"))
      << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_rate_bytes_per_second{host="gpu-a",vm="llm-1",direction="out"} 2500000)"))
      << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_dirty_bytes{host="gpu-a",vm="llm-1",direction="out"} 1048576)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_predicted_stun_seconds{host="gpu-a",vm="llm-1",direction="out"} 0.25)"))
      << m;
  EXPECT_NE(m.find(R"(gpumigrate_migration_elapsed_seconds{host="gpu-a",vm="llm-1",direction="out"} )"),
            std::string::npos);

  // A receive's file counts bytes applied.
  Json in = Json::parse(kIncoming);
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  Json rr = Call({{"op", "receive"}, {"vm", in}});
  ASSERT_TRUE(rr["ok"]) << rr.dump();
  std::ofstream((dir_ / "jobs" / fmt::format("{}.phase", rr["job"].get<int64_t>())).string())
      << R"({"phase": "round-end", "round": 0, "bytes_applied": 7000000, "bytes_per_s": 2000000})";
  m = agent_->Metrics();
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_applied_bytes_total{host="gpu-a",vm="llm-9",direction="in"} 7000000)"))
      << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_host_migrations_in_flight{host="gpu-a",direction="in"} 1)")) << m;
  End(children_, 1, 1, "{}");
  End(children_, 0, 0, R"({"outcome": "completed", "verified": true, "stun_ms": 125, "predicted_stun_ms": 100,
                           "bytes_sent": 26000000, "resumptions": [{"round": 1}], "scrub_ms": 250})");
  m = agent_->Metrics();
  EXPECT_EQ(m.find("gpumigrate_migration_phase{"), std::string::npos) << "an ended migration has no phase";
  EXPECT_TRUE(has(m, R"(gpumigrate_host_vms{host="gpu-a"} 1)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_gpu_mig_slices_free{host="gpu-a",gpu="0"} 7)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_last_stun_seconds{host="gpu-a",vm="llm-1",direction="out"} 0.125)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_last_predicted_stun_seconds{host="gpu-a",vm="llm-1",direction="out"} 0.1)"))
      << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migrations_total{host="gpu-a",direction="out",outcome="completed"} 1)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migrations_total{host="gpu-a",direction="out",outcome="failed"} 0)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_resumptions_total{host="gpu-a"} 1)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_scrub_seconds_total{host="gpu-a"} 0.25)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migrated_bytes_total{host="gpu-a"} 26000000)")) << m;

  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "chat-1"}, {"to", "h:1"}})["ok"]);
  End(children_, 2, 1, R"({"outcome": "aborted", "error": "max stun"})");
  m = agent_->Metrics();
  EXPECT_TRUE(has(m, R"(gpumigrate_migrations_total{host="gpu-a",direction="out",outcome="failed"} 1)")) << m;
  EXPECT_TRUE(has(m, R"(gpumigrate_migration_last_stun_seconds{host="gpu-a",vm="llm-1",direction="out"} 0.125)")) << m;
  EXPECT_EQ(m.find(R"(gpumigrate_migration_last_stun_seconds{host="gpu-a",vm="chat-1")"), std::string::npos)
      << "a rolled-back migration has no stun";
}

// What the agent command logs (to journald under systemd): a job's start, each
// session phase its process reports, seen once at a poll, and its end.
TEST_F(AgentTest, JobEventsTellStartEachPhaseOnceAndTheEnd) {
  Json r = Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}});
  ASSERT_TRUE(r["ok"]) << r.dump();
  const std::string phase_file = (dir_ / "jobs" / fmt::format("{}.phase", r["job"].get<int64_t>())).string();
  std::ofstream(phase_file) << R"({"phase": "round-start", "round": 0})";
  agent_->Poll();
  agent_->Poll();  // the same phase again: not told twice
  std::ofstream(phase_file) << R"({"phase": "round-start", "round": 0, "bytes_sent": 5})";
  agent_->Poll();
  std::ofstream(phase_file) << R"({"phase": "switchover", "round": 3})";
  agent_->Poll();
  End(children_, 0, 0, R"({"outcome": "completed", "verified": true})");
  agent_->Poll();
  std::vector<std::string> phases;
  for (const auto& e : events_) {
    EXPECT_EQ(e["vm"], "llm-1");
    EXPECT_EQ(e["kind"], "migrate");
    EXPECT_EQ(e["job"], r["job"]);
    phases.push_back(e["phase"]);
  }
  EXPECT_EQ(phases, (std::vector<std::string>{"started", "round-start", "switchover", "completed"}));
  EXPECT_EQ(events_.back()["message"], "job 1 (migrate llm-1): completed: llm-1 runs at h:1 now");
  EXPECT_EQ(events_[2]["message"], "job 1 (migrate llm-1): switchover, round 3");
}

TEST_F(AgentTest, ARolledBackMigrationKeepsTheVm) {
  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})["ok"]);
  std::ofstream(children_.started[0].err) << "gpumigrate migrate: aborted: predicted stun 3 s > max stun 2 s\n";
  End(children_, 0, 1, R"({"outcome": "aborted"})");
  Json st = Call({{"op", "status"}});
  EXPECT_EQ(st["jobs"][0]["state"], "failed");
  EXPECT_NE(st["jobs"][0]["detail"].get<std::string>().find("max stun 2 s"), std::string::npos);
  EXPECT_EQ(VmNames().size(), 2u);
  EXPECT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:2"}})["ok"]);  // may be tried again
}

TEST_F(AgentTest, MaxMigrationsCountsInAndOut) {
  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})["ok"]);
  ASSERT_TRUE(Call({{"op", "receive"}, {"vm", Json::parse(R"({"name": "p", "device": "sim",
      "inventory": {"gpus": [1], "profile": "passthrough", "class": "inference"}})")}})["ok"]);
  const Json busy = Call({{"op", "migrate"}, {"vm", "chat-1"}, {"to", "h:1"}});
  EXPECT_EQ(RefusalCodeOf(busy), RefusalCode::kBusy) << busy.dump();
  EXPECT_EQ(RefusalCodeOf(Call({{"op", "fly"}})), RefusalCode::kOther) << "a refusal nobody acts on has no code";
  EXPECT_NE(Error(busy).find("busy: 2 of max_migrations 2"),
            std::string::npos);
  End(children_, 0, 1, "{}");
  EXPECT_TRUE(Call({{"op", "migrate"}, {"vm", "chat-1"}, {"to", "h:1"}})["ok"]);
}

TEST_F(AgentTest, InDoubtHoldsTheSourceUntilResolved) {
  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})["ok"]);
  End(children_, 0, 3, R"({"outcome": "in-doubt"})");
  Json inv = Call({{"op", "inventory"}});
  ASSERT_EQ(inv["vms"].size(), 2u);
  EXPECT_NE(inv["vms"][0]["held"].get<std::string>().find("in doubt"), std::string::npos);
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:2"}})).find("llm-1 is held"),
            std::string::npos);
  EXPECT_TRUE(Call({{"op", "resolve"}, {"vm", "llm-1"}})["ok"]);
  EXPECT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:2"}})["ok"]);
}

TEST_F(AgentTest, ReceiveListensAndKeepsTheVmOnlyWhenVerified) {
  // llm-1 holds MIG slices 0-3 of GPU 0: a second 3g.40gb at start 0 does not fit.
  EXPECT_NE(Error(Call({{"op", "receive"}, {"vm", Json::parse(kIncoming)}})).find("does not fit on gpu-a"),
            std::string::npos);
  EXPECT_TRUE(children_.started.empty());
  Json r = Call({{"op", "receive"}, {"vm", Json::parse(kIncoming)}, {"placement", 4}, {"gpus", {0}}});
  // chat-1 is at 4: still does not fit; at a free passthrough GPU it does.
  EXPECT_NE(Error(r).find("does not fit"), std::string::npos);
  Json in = Json::parse(kIncoming);
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  r = Call({{"op", "receive"}, {"vm", in}});
  ASSERT_TRUE(r["ok"]) << r.dump();
  EXPECT_EQ(r["port"], 4242);
  EXPECT_EQ(r["address"], "127.0.0.1");
  ASSERT_EQ(children_.started.size(), 1u);
  const auto& argv = children_.started[0].argv;
  ASSERT_GE(argv.size(), 8u);
  EXPECT_EQ(argv[1], "receive");
  EXPECT_EQ(argv[3], "127.0.0.1:0");
  EXPECT_EQ(After(argv, "--device"), "sim:size=8MiB");
  // The slot is taken while it runs: a second VM for the same GPU does not fit.
  in["name"] = "llm-10";
  EXPECT_NE(Error(Call({{"op", "receive"}, {"vm", in}})).find("does not fit"), std::string::npos);
  End(children_, 0, 0, R"({"outcome": "completed", "verified": true})");
  EXPECT_EQ(VmNames(), (std::vector<std::string>{"llm-1", "chat-1", "llm-9"}));
  EXPECT_NE(Error(Call({{"op", "receive"}, {"vm", Json::parse(kIncoming)}})).find("llm-9 already runs here"),
            std::string::npos);
}

// A receive whose source already failed (its Abort stuck behind a slow link):
// the controller cancels it, its process is stopped, the detail says why, and
// the slot it held is free again. Only migrate and receive jobs are cancelled.
TEST_F(AgentTest, ACancelledReceiveEndsAndFreesItsSlot) {
  Json in = Json::parse(kIncoming);
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  Json r = Call({{"op", "receive"}, {"vm", in}});
  ASSERT_TRUE(r["ok"]) << r.dump();
  EXPECT_NE(Error(Call({{"op", "cancel"}})).find("cancel needs \"job\""), std::string::npos);
  EXPECT_NE(Error(Call({{"op", "cancel"}, {"job", 99}})).find("no job 99"), std::string::npos);
  Json c = Call({{"op", "cancel"}, {"job", r["job"]}, {"reason", "the source's migration failed"}});
  ASSERT_TRUE(c["ok"]) << c.dump();
  EXPECT_EQ(c["state"], "cancelling");
  EXPECT_FALSE(children_.started[0].alive) << "the receiving process was not stopped";
  // As `gpumigrate receive --json` ends on SIGTERM: exit 1, its error in the report (its stderr's last line is
  // a progress line).
  End(children_, 0, 1, R"({"outcome": "aborted", "error": "migration aborted in pre-copy round 0: cancelled"})");
  Json st = Call({{"op", "status"}, {"job", r["job"]}});
  EXPECT_EQ(st["jobs"][0]["state"], "failed");
  EXPECT_EQ(st["jobs"][0]["detail"], "cancelled: the source's migration failed; nothing kept (exit 1): migration "
                                     "aborted in pre-copy round 0: cancelled");
  EXPECT_EQ(VmNames(), (std::vector<std::string>{"llm-1", "chat-1"}));
  in["name"] = "llm-10";
  EXPECT_TRUE(Call({{"op", "receive"}, {"vm", in}})["ok"]) << "the cancelled receive's slot is free";
  // Ended already: nothing to do, said so.
  c = Call({{"op", "cancel"}, {"job", r["job"]}});
  ASSERT_TRUE(c["ok"]) << c.dump();
  EXPECT_EQ(c["state"], "failed");
  Json d = Call({{"op", "drain"}, {"vm", "chat-1"}});
  ASSERT_TRUE(d["ok"]) << d.dump();
  EXPECT_NE(Error(Call({{"op", "cancel"}, {"job", d["job"]}})).find("only a migrate or receive job"),
            std::string::npos);
}

// A host with a content store (its model weights): every receive fills the
// pages a source offers by digest from it; a relative path is refused.
TEST_F(AgentTest, AReceiveUsesTheHostsContentStore) {
  Json cfg = Json::parse(kConfig);
  Json in = Json::parse(kIncoming);
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  ASSERT_TRUE(Call({{"op", "receive"}, {"vm", in}})["ok"]);
  EXPECT_EQ(After(children_.started[0].argv, "--content-store"), "") << "none configured, none passed";
  End(children_, 0, 0, R"({"outcome": "completed", "verified": false})");
  cfg["content_store"] = "/var/lib/models";
  Reopen(cfg.dump());
  ASSERT_TRUE(Call({{"op", "receive"}, {"vm", in}})["ok"]);
  EXPECT_EQ(After(children_.started.back().argv, "--content-store"), "/var/lib/models");
  cfg["content_store"] = "models";
  auto bad = ParseAgentConfig(cfg.dump());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("content_store: 'models' is not an absolute path"), std::string::npos)
      << bad.status().message();
}

// The host's "models" (the planner prefers a target holding a VM's model) are
// the ones its entry names and those its content store holds, read afresh at
// every inventory: a model copied into the store is offered from then on.
TEST_F(AgentTest, InventoryNamesTheModelsItsContentStoreHolds) {
  const fs::path store = dir_ / "store";
  fs::create_directories(store / "mistral-b");
  std::ofstream(store / "llama-a.weights.raw") << "w";
  std::ofstream(store / "llama-a.kv.raw") << "k";
  std::ofstream(store / "mistral-b" / "model-00001-of-00002.safetensors") << "s";
  std::ofstream(store / ".gpumigrate-index-4096") << "index";
  Json cfg = Json::parse(kConfig);
  Json inv = Call({{"op", "inventory"}});
  EXPECT_FALSE(inv["host"].contains("models")) << "no store, no models said: " << inv["host"].dump();
  cfg["content_store"] = store.string();
  cfg["host"]["models"] = {"phi-c"};
  Reopen(cfg.dump());
  inv = Call({{"op", "inventory"}});
  EXPECT_EQ(inv["host"]["models"], Json({"llama-a", "mistral-b", "phi-c"}));
  std::ofstream(store / "qwen-d.weights.raw") << "q";
  inv = Call({{"op", "inventory"}});
  EXPECT_EQ(inv["host"]["models"], Json({"llama-a", "mistral-b", "phi-c", "qwen-d"}));
  // The planner reads it: a host holding a VM's model.
  Json planner_inv = {{"version", 1}, {"hosts", Json::array({inv["host"]})}, {"vms", Json::array()}};
  auto parsed = planner::ParseInventory(planner_inv.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_TRUE(parsed->hosts[0].Holds("qwen-d"));
  // A store gone: the models the entry names stay.
  fs::remove_all(store);
  inv = Call({{"op", "inventory"}});
  EXPECT_EQ(inv["host"]["models"], Json({"phi-c"}));
}

TEST_F(AgentTest, AnUnverifiedOrSilentReceiveKeepsNothing) {
  Json in = Json::parse(kIncoming);
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  ASSERT_TRUE(Call({{"op", "receive"}, {"vm", in}})["ok"]);
  End(children_, 0, 0, R"({"outcome": "completed", "verified": false})");
  EXPECT_EQ(VmNames().size(), 2u);
  EXPECT_EQ(Call({{"op", "status"}})["jobs"][0]["state"], "failed");
  children_.listen = false;
  Json r = Call({{"op", "receive"}, {"vm", in}});
  EXPECT_NE(Error(r).find("did not listen within 300 ms"), std::string::npos);
  EXPECT_FALSE(children_.started[1].alive);  // killed
}

TEST_F(AgentTest, MaintenanceRefusesReceivesAndSurvivesARestart) {
  ASSERT_TRUE(Call({{"op", "maintenance"}, {"enter", true}})["ok"]);
  EXPECT_NE(Error(Call({{"op", "receive"}, {"vm", Json::parse(kIncoming)}})).find("in maintenance"),
            std::string::npos);
  Reopen();
  EXPECT_EQ(Call({{"op", "inventory"}})["host"]["maintenance"], true);
  ASSERT_TRUE(Call({{"op", "maintenance"}, {"enter", false}})["ok"]);
  EXPECT_EQ(Call({{"op", "inventory"}})["host"]["maintenance"], false);
}

TEST_F(AgentTest, ARestartHoldsASourceWhoseChildVanishedAndWatchesOneThatRuns) {
  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})["ok"]);
  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "chat-1"}, {"to", "h:1"}})["ok"]);
  agent_.reset();
  children_.started[0].alive = false;  // killed with the agent, no exit status
  Reopen();
  std::string findings;
  for (const auto& f : agent_->Findings()) findings += f + "\n";
  EXPECT_NE(findings.find("job 1 (migrate llm-1) ended while the agent was down"), std::string::npos) << findings;
  EXPECT_NE(findings.find("job 2 (migrate chat-1) is still running"), std::string::npos) << findings;
  Json st = Call({{"op", "status"}});
  EXPECT_EQ(st["jobs"][0]["state"], "lost");
  EXPECT_EQ(st["jobs"][1]["state"], "running");
  // Held, never resumed or started again by the agent.
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})).find("is held"), std::string::npos);
  EXPECT_EQ(children_.started.size(), 2u);
  End(children_, 1, 0, R"({"outcome": "completed", "verified": true})");
  EXPECT_EQ(VmNames(), std::vector<std::string>{"llm-1"});
  // The state file records it all: a third start agrees.
  Reopen();
  EXPECT_EQ(VmNames(), std::vector<std::string>{"llm-1"});
  EXPECT_EQ(Call({{"op", "status"}})["jobs"][1]["state"], "completed");
}

TEST_F(AgentTest, HooksRunWithTheirNamesAndMoveTheReplica) {
  ASSERT_TRUE(Call({{"op", "drain"}, {"vm", "chat-1"}})["ok"]);
  EXPECT_EQ(children_.started[0].argv, (std::vector<std::string>{"hook", "drain", "chat-1"}));
  End(children_, 0, 0, "");
  EXPECT_EQ(VmNames(), std::vector<std::string>{"llm-1"});
  Json rep = Json::parse(R"({"name": "chat-2", "device": "sim",
      "inventory": {"gpus": [0], "profile": "1g.10gb", "placement": 5, "class": "stateless-inference",
                    "group": "chat"}})");
  ASSERT_TRUE(Call({{"op", "start-replica"}, {"vm", rep}})["ok"]);
  EXPECT_EQ(children_.started[1].argv, (std::vector<std::string>{"hook", "start", "chat-2", "chat", "gpu-a"}));
  End(children_, 1, 0, "");
  EXPECT_EQ(VmNames(), (std::vector<std::string>{"llm-1", "chat-2"}));
  EXPECT_NE(Error(Call({{"op", "drain"}, {"vm", "llm-1"}})).find("in no replica group"), std::string::npos);
}

TEST_F(AgentTest, ADamagedStateFileIsRefusedNamingIt) {
  agent_.reset();
  std::ofstream(dir_ / "state.json") << "{\"version\": 1, \"host\": \"gpu-a\", \"maint";
  auto cfg = ParseAgentConfig(kConfig);
  AgentOptions o;
  o.state_dir = dir_.string();
  auto a = Agent::Open(std::move(*cfg), o, std::make_unique<FakeLauncher>(&children_));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(std::string(a.status().message()).find((dir_ / "state.json").string()), std::string::npos);
  std::ofstream(dir_ / "state.json") << R"({"version": 1, "host": "gpu-z"})";
  cfg = ParseAgentConfig(kConfig);
  a = Agent::Open(std::move(*cfg), o, std::make_unique<FakeLauncher>(&children_));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(std::string(a.status().message()).find("state of host 'gpu-z'"), std::string::npos);
  // A job whose state no agent writes ("in_doubt", the report's spelling) is
  // refused, not read as running or ended.
  std::ofstream(dir_ / "state.json") << R"({"version": 1, "host": "gpu-a", "maintenance": false, "next_job": 2,
    "vms": [], "held": {}, "jobs": [{"id": 1, "kind": "migrate", "vm": "llm-1", "state": "in_doubt", "pid": 0,
    "token": ""}]})";
  cfg = ParseAgentConfig(kConfig);
  a = Agent::Open(std::move(*cfg), o, std::make_unique<FakeLauncher>(&children_));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(std::string(a.status().message()).find("job 1 has the unknown state 'in_doubt'"), std::string::npos)
      << a.status().message();
}

TEST_F(AgentTest, PowerOffRunsTheHostsHookOrIsRefused) {
  EXPECT_NE(Error(Call({{"op", "power-off"}, {"vm", "llm-1"}})).find("no power_off hook"), std::string::npos);
  Json cfg = Parsed(kConfig);
  cfg["power_off"] = {"off", "{vm}", "{host}"};
  Reopen(cfg.dump());
  ASSERT_TRUE(Call({{"op", "power-off"}, {"vm", "llm-1"}})["ok"]);
  EXPECT_EQ(children_.started[0].argv, (std::vector<std::string>{"off", "llm-1", "gpu-a"}));
  EXPECT_NE(Error(Call({{"op", "power-off"}, {"vm", "llm-1"}})).find("already in job"), std::string::npos);
  End(children_, 0, 0, "");
  EXPECT_EQ(VmNames(), std::vector<std::string>{"chat-1"});
  ASSERT_TRUE(Call({{"op", "power-off"}, {"vm", "chat-1"}})["ok"]);
  End(children_, 1, 1, "");
  EXPECT_EQ(VmNames(), std::vector<std::string>{"chat-1"});  // a failed hook keeps it
  cfg["power_off"] = "off";
  EXPECT_FALSE(ParseAgentConfig(cfg.dump()).ok());
}

// Found in review: each of these crashed the agent, lost a VM or gave a slot twice.
TEST_F(AgentTest, WrongTypesAndOddBytesAreRefusedNeverFatal) {
  EXPECT_NE(Error(Call({{"op", 1}})).find("unknown op"), std::string::npos);
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", 7}, {"to", "h:1"}})).find("wrong type"), std::string::npos);
  EXPECT_FALSE(Call({{"op", "status"}, {"job", "one"}})["ok"]);
  // A child that prints bytes that are not UTF-8: saved, reported, reopened.
  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})["ok"]);
  std::ofstream(children_.started[0].err) << "caf\xe9 \xff\xfe failed\n";
  End(children_, 0, 1, "{}");
  Json st = Call({{"op", "status"}});
  ASSERT_TRUE(st["ok"]) << st.dump(-1, ' ', false, Json::error_handler_t::replace);
  EXPECT_EQ(st["jobs"][0]["state"], "failed");
  Reopen();
  EXPECT_EQ(Call({{"op", "status"}})["jobs"][0]["state"], "failed");
}

TEST_F(AgentTest, ADeepMessageIsRefusedBeforeParsing) {
  auto [a, b] = MakePipe("deep");
  std::string body = "{\"op\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const uint32_t n = static_cast<uint32_t>(body.size());
  const std::byte len[4] = {std::byte(n >> 24), std::byte(n >> 16), std::byte(n >> 8), std::byte(n)};
  std::thread w([&, a = a.get()] {
    (void)a->WriteAll(len);
    (void)a->WriteAll(std::as_bytes(std::span(body.data(), body.size())));
  });
  auto got = ReadMessage(*b);
  w.join();
  ASSERT_FALSE(got.ok());
  EXPECT_NE(std::string(got.status().message()).find("nested deeper than 64"), std::string::npos);
}

TEST_F(AgentTest, AReceiveFitsBesideADrainAndAReplicaIsCheckedLikeAReceive) {
  ASSERT_TRUE(Call({{"op", "drain"}, {"vm", "chat-1"}})["ok"]);
  Json in = Json::parse(kIncoming);
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  Json r = Call({{"op", "receive"}, {"vm", in}});
  EXPECT_TRUE(r["ok"]) << r.dump();  // chat-1, being drained, is counted once
  Json rep = Json::parse(R"({"name": "chat-2", "device": "sim",
      "inventory": {"gpus": [0], "profile": "3g.40gb", "placement": 0, "class": "stateless-inference",
                    "group": "chat"}})");
  EXPECT_NE(Error(Call({{"op", "start-replica"}, {"vm", rep}})).find("does not fit on gpu-a"), std::string::npos);
  rep["name"] = "llm-1";
  EXPECT_NE(Error(Call({{"op", "start-replica"}, {"vm", rep}})).find("llm-1 already runs here"), std::string::npos);
}

TEST_F(AgentTest, AResolveWithABadKeyChangesNothing) {
  ASSERT_TRUE(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})["ok"]);
  End(children_, 0, 3, "{}");
  EXPECT_NE(Error(Call({{"op", "resolve"}, {"vm", "llm-1"}, {"gone", "yes"}})).find("gone must be"),
            std::string::npos);
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})).find("is held"), std::string::npos);
  EXPECT_NE(Error(Call({{"op", "drain"}, {"vm", "llm-1"}})).find("is held"), std::string::npos);
  ASSERT_TRUE(Call({{"op", "resolve"}, {"vm", "llm-1"}, {"gone", true}})["ok"]);
  EXPECT_EQ(VmNames(), std::vector<std::string>{"chat-1"});
}

TEST_F(AgentTest, AReceiveInDoubtOrVanishedKeepsTheVmHeld) {
  Json in = Json::parse(kIncoming);
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  ASSERT_TRUE(Call({{"op", "receive"}, {"vm", in}})["ok"]);
  End(children_, 0, 3, R"({"outcome": "in-doubt"})");
  Json inv = Call({{"op", "inventory"}});
  ASSERT_EQ(inv["vms"].size(), 3u);
  EXPECT_EQ(inv["vms"][2]["name"], "llm-9");
  EXPECT_NE(inv["vms"][2]["held"].get<std::string>().find("may hold the VM stopped"), std::string::npos);
}

TEST_F(AgentTest, OldJobFilesAndAJobRecordedButNotStartedAreNeverTakenForResults) {
  // A state moved away leaves jobs/1.*: a new first start numbers above them.
  agent_.reset();
  fs::remove(dir_ / "state.json");
  std::ofstream(dir_ / "jobs" / "1.rc") << "0\n";
  std::ofstream(dir_ / "jobs" / "1.out") << R"({"outcome": "completed", "verified": true})";
  Reopen();
  Json r = Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}});
  ASSERT_TRUE(r["ok"]);
  EXPECT_EQ(r["job"], 2);
  EXPECT_EQ(Call({{"op", "status"}})["jobs"][0]["state"], "running");
  // The agent died after recording a job and before its process started.
  agent_.reset();
  std::ifstream in(dir_ / "state.json");
  Json state = Json::parse(in);
  state["jobs"][0]["pid"] = 0;
  std::ofstream(dir_ / "state.json") << state.dump();
  Reopen();
  EXPECT_EQ(Call({{"op", "status"}})["jobs"][0]["state"], "lost");
  EXPECT_NE(Error(Call({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "h:1"}})).find("is held"), std::string::npos);
}

// The real launcher: the exit status outlives the agent, SIGTERM reaches the child.
// A proc VM moves into a process the receiving host starts for it: its adopter.
std::string WithAdopter() {
  Json j = Parsed(kConfig);
  j["adopters"] = Json::parse(R"({"w": {"command": ["adopt-cmd", "--name", "{vm}", "--on", "{host}"]}})");
  return j.dump();
}

Json ProcIncoming() {
  Json in = Json::parse(kIncoming);
  in["device"] = "proc:4242";
  in["receive_device"] = "adopt:w";
  in["inventory"] = {{"gpus", {1}}, {"profile", "passthrough"}, {"class", "inference"}};
  return in;
}

TEST(AgentConfig, ReadsAdoptersAndNamesWhatIsWrong) {
  auto c = ParseAgentConfig(WithAdopter());
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->adopters.at("w").command[0], "adopt-cmd");
  EXPECT_EQ(c->adopters.at("w").device, "proc:{pid}");
  Json j = Parsed(kConfig);
  for (auto [bad, want] : std::vector<std::pair<std::string, std::string>>{
           {"[]", "adopters: expected an object"},
           {R"({"w": {"command": "sh"}})", "adopters.w.command"},
           {R"({"w": {"device": "cuda:{pid}"}})", "adopters.w.command: missing"},
           {R"({"w": {"command": ["x"], "device": "proc:1"}})", "adopters.w.device: 'proc:1' names no {pid}"}}) {
    j["adopters"] = Json::parse(bad);
    auto r = ParseAgentConfig(j.dump());
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(std::string(r.status().message()).find(want), std::string::npos) << r.status().message();
  }
}

TEST_F(AgentTest, AProcVmIsReceivedIntoTheProcessItsAdopterStarts) {
  // Without the adopter here: refused, naming it, nothing started.
  EXPECT_NE(Error(Call({{"op", "receive"}, {"vm", ProcIncoming()}})).find("needs the adopter 'w', which gpu-a does "
                                                                           "not configure (it configures none)"),
            std::string::npos);
  EXPECT_TRUE(children_.started.empty());
  Reopen(WithAdopter());
  Json r = Call({{"op", "receive"}, {"vm", ProcIncoming()}});
  ASSERT_TRUE(r["ok"]) << r.dump();
  ASSERT_EQ(children_.started.size(), 2u);
  EXPECT_EQ(children_.started[0].argv, (std::vector<std::string>{"adopt-cmd", "--name", "llm-9", "--on", "gpu-a"}));
  const auto& argv = children_.started[1].argv;
  ASSERT_GE(argv.size(), 8u);
  EXPECT_EQ(argv[1], "receive");
  EXPECT_EQ(After(argv, "--device"), "proc:777");  // the process that said it was ready
  EXPECT_EQ(Call({{"op", "status"}})["jobs"][0]["device"], "proc:777");
  End(children_, 1, 0, R"({"outcome": "completed", "verified": true})");
  Json inv = Call({{"op", "inventory"}});
  ASSERT_EQ(inv["vms"].size(), 3u);
  EXPECT_EQ(inv["vms"][2]["device"], "proc:777");         // where it runs now, to migrate it on
  EXPECT_EQ(inv["vms"][2]["receive_device"], "adopt:w");  // and how the next host receives it
  EXPECT_TRUE(children_.started[0].alive);                // the VM's process runs on
  // After a restart too.
  Reopen(WithAdopter());
  EXPECT_EQ(Call({{"op", "inventory"}})["vms"][2]["device"], "proc:777");
}

TEST_F(AgentTest, AFailedReceiveStopsItsAdopter) {
  Reopen(WithAdopter());
  ASSERT_TRUE(Call({{"op", "receive"}, {"vm", ProcIncoming()}})["ok"]);
  End(children_, 1, 1, R"({"outcome": "failed"})");
  EXPECT_EQ(Call({{"op", "status"}})["jobs"][0]["state"], "failed");
  EXPECT_FALSE(children_.started[0].alive);
  EXPECT_EQ(VmNames().size(), 2u);
}

TEST_F(AgentTest, AnAdopterThatIsNeverReadyFailsTheReceiveWithItsReason) {
  Reopen(WithAdopter());
  children_.adopter_out = "starting\n";
  EXPECT_NE(Error(Call({{"op", "receive"}, {"vm", ProcIncoming()}}))
                .find("the adopter 'w' for llm-9 on gpu-a said no \"ready pid=PID\" within 300 ms"),
            std::string::npos);
  ASSERT_EQ(children_.started.size(), 1u);  // no receive started
  EXPECT_FALSE(children_.started[0].alive);
  children_.adopter_ends = true;
  EXPECT_NE(Error(Call({{"op", "receive"}, {"vm", ProcIncoming()}}))
                .find("ended before it was ready: workload: cannot map 64 MiB"),
            std::string::npos);
  ASSERT_EQ(children_.started.size(), 2u);
  Json st = Call({{"op", "status"}});
  EXPECT_EQ(st["jobs"][0]["state"], "failed");
  EXPECT_EQ(st["jobs"][1]["state"], "failed");
  EXPECT_EQ(VmNames().size(), 2u);
  // The slot is free again: a receive that works now goes ahead.
  children_.adopter_out = "ready pid=778\n";
  children_.adopter_ends = false;
  ASSERT_TRUE(Call({{"op", "receive"}, {"vm", ProcIncoming()}})["ok"]);
  EXPECT_EQ(After(children_.started.back().argv, "--device"), "proc:778");
}

TEST(ProcessLauncher, WritesTheExitStatusAndForwardsKill) {
  const fs::path d = fs::temp_directory_path() / ("gm-launch-" + std::to_string(getpid()));
  fs::create_directories(d);
  auto l = MakeProcessLauncher();
  auto wait_rc = [&](const std::string& rc) {
    for (int i = 0; i < 500; ++i) {
      std::ifstream in(rc);
      int code = -1;
      if (in >> code) return code;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  };
  auto s = l->Start({"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, (d / "1.out").string(),
                    (d / "1.err").string(), (d / "1.rc").string());
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(wait_rc((d / "1.rc").string()), 7);
  std::ifstream out(d / "1.out");
  std::string line;
  std::getline(out, line);
  EXPECT_EQ(line, "out");
  for (int i = 0; i < 200 && fs::exists(fmt::format("/proc/{}", s->id)); ++i) {
    l->Reap();  // the shell, once it exits, is collected: no zombie left behind
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(fs::exists(fmt::format("/proc/{}", s->id)));
  EXPECT_FALSE(l->Alive(s->id, s->token));

  s = l->Start({"sleep", "30"}, (d / "2.out").string(), (d / "2.err").string(), (d / "2.rc").string());
  ASSERT_TRUE(s.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(l->Alive(s->id, s->token));
  EXPECT_FALSE(l->Alive(s->id, "another start time"));
  l->Kill(s->id, s->token);
  EXPECT_EQ(wait_rc((d / "2.rc").string()), 143);  // the child's SIGTERM, recorded by the shell
  fs::remove_all(d);
}

// The real launcher records a child's exit status even when the child exits
// at once (a hook that appends a line): its shell once lost those to a race
// and wrote 127 for two of three.
TEST(ProcessLauncher, RecordsTheExitStatusOfChildrenThatExitAtOnce) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("gm-launcher-{}", getpid());
  fs::create_directories(dir);
  auto launcher = MakeProcessLauncher();
  constexpr int kJobs = 40;
  for (int i = 0; i < kJobs; ++i) {
    const std::string base = (dir / std::to_string(i)).string();
    auto started = launcher->Start({"sh", "-c", fmt::format("echo {} >> {}/hooks.log; exit {}", i, dir.string(), i % 7)}, base + ".out", base + ".err",
                                   base + ".rc");
    ASSERT_TRUE(started.ok()) << started.status().ToString();
  }
  for (int i = 0; i < kJobs; ++i) {
    const std::string rc = (dir / std::to_string(i)).string() + ".rc";
    for (int t = 0; t < 500 && !fs::exists(rc); ++t) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream in(rc);
    int code = -1;
    in >> code;
    EXPECT_EQ(code, i % 7) << "job " << i;
  }
  launcher->Reap();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace gpumigrate::agent
