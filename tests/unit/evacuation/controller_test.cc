// The evacuation controller (include/gpumigrate/evacuation/evacuation.h) without a CLI or a
// network: three in-process agents (agent::Agent, each over a launcher whose
// children end as the test scripts them) reached through an agent::Client that
// hands each request to the agent at that address, and a state store in a
// directory. The same requests and replies as over TLS; no process is started.
#include "gpumigrate/evacuation/evacuation.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

namespace fs = std::filesystem;
using agent::Json;

std::string ArgAfter(const std::vector<std::string>& argv, const std::string& flag) {
  auto at = std::find(argv.begin(), argv.end(), flag);
  return at == argv.end() || at + 1 == argv.end() ? "" : *(at + 1);
}

// Every child of every agent. A migrate ends at once (completed, unless its
// device is scripted otherwise), or after `hold_polls` looks when its device is
// held; the receive of the same device ends with it (verified when it
// completed, nothing kept when it failed); a hook ends at once, exit 0.
struct World {
  struct Child {
    std::vector<std::string> argv;
    std::string out, rc;
    bool alive = true;
    int polls_left = 0;  // a held child: looks at it before it ends
  };
  std::vector<Child> children;
  // A migrate of this device: its exit status and report, taken one per try
  // (then completed).
  std::map<std::string, std::vector<std::pair<int, Json>>> script;
  std::set<std::string> held;  // migrations that run for hold_polls looks
  int hold_polls = 20;
  std::map<std::string, int> migrations;  // migrate children started, by device

  static Json Completed() {
    return {{"outcome", "completed"}, {"verified", true}, {"stun_ms", 12.5},
            {"rounds_bandwidth_bytes_per_s", 1e9}};
  }

  void End(Child& c, int rc, const Json& report) {
    std::ofstream(c.out) << report.dump();
    std::ofstream(c.rc) << rc << "\n";
    c.alive = false;
  }

  // The migrate of `device` ends: so does the receive waiting for it.
  void EndMigration(Child& c) {
    const std::string device = ArgAfter(c.argv, "--device");
    int rc = 0;
    Json report = Completed();
    if (auto s = script.find(device); s != script.end() && !s->second.empty()) {
      std::tie(rc, report) = s->second.front();
      s->second.erase(s->second.begin());
    }
    End(c, rc, report);
    for (auto& r : children) {
      if (r.alive && r.argv.size() > 1 && r.argv[1] == "receive" && ArgAfter(r.argv, "--device") == device) {
        End(r, rc == 0 ? 0 : 1, rc == 0 ? Json{{"verified", true}} : Json{{"error", "the source rolled back"}});
      }
    }
  }

  void Look(Child& c) {
    if (c.alive && c.polls_left > 0 && --c.polls_left == 0) EndMigration(c);
  }
};

class ScriptedLauncher : public agent::Launcher {
 public:
  explicit ScriptedLauncher(World* w) : w_(w) {}
  Result<Started> Start(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
                        const std::string& rc) override {
    std::ofstream(err) << "round 0: 1 MB\n";
    w_->children.push_back({argv, out, rc});
    World::Child& c = w_->children.back();
    const size_t id = w_->children.size();
    const std::string kind = argv.size() > 1 ? argv[1] : "";
    if (kind == "receive") {
      std::ofstream(ArgAfter(argv, "--port-file")) << 4242 << "\n";
    } else if (kind == "migrate") {
      const std::string device = ArgAfter(argv, "--device");
      ++w_->migrations[device];
      if (w_->held.count(device)) {
        c.polls_left = w_->hold_polls;
      } else {
        w_->EndMigration(c);
      }
    } else {  // a hook
      w_->End(c, 0, Json::object());
    }
    return Started{static_cast<int64_t>(id), fmt::format("t{}", id)};
  }
  bool Alive(int64_t id, const std::string& token) override {
    if (id < 1 || id > static_cast<int64_t>(w_->children.size()) || token != fmt::format("t{}", id)) return false;
    World::Child& c = w_->children[id - 1];
    w_->Look(c);
    return c.alive;
  }
  void Kill(int64_t id, const std::string&) override {
    if (id >= 1 && id <= static_cast<int64_t>(w_->children.size())) w_->children[id - 1].alive = false;
  }

 private:
  World* w_;
};

// Requests to ADDR go to the agent listening there; an address in `down` does not answer.
class InProcessAgents : public agent::Client {
 public:
  Result<Json> Call(const std::string& address, const Json& request, std::chrono::milliseconds) override {
    ++calls;
    if (down.count(address)) return Unavailable(address + ": connection refused");
    auto it = agents.find(address);
    if (it == agents.end()) return Unavailable(address + ": no agent there");
    return it->second->Handle(request);
  }
  std::map<std::string, agent::Agent*> agents;
  std::set<std::string> down;
  int calls = 0;
};

constexpr const char* kGroups = R"([ { "name": "chat", "min_serving": 1, "replica_start": "1s", "drain": "1s",
    "hooks": { "start_replica": ["hook", "start", "{vm}"], "drain": ["hook", "drain", "{vm}"] } } ])";

std::string HostEntry(const std::string& name) {
  return fmt::format(R"({{ "name": "{}", "link": "10Gbit", "max_migrations": 2,
      "gpus": [ {{ "index": 0, "model": "H100-80GB", "mode": "mig" }} ] }})",
                     name);
}

std::string Address(const std::string& host) { return host + ".example:7000"; }

const std::map<std::string, std::string> kVms = {
    {"gpu-a", R"([
      { "name": "llm-1", "device": "sim:seed=1", "gpus": [0], "profile": "3g.40gb", "placement": 0, "class": "inference" },
      { "name": "llm-2", "device": "sim:seed=2", "gpus": [0], "profile": "1g.10gb", "placement": 4, "class": "inference" },
      { "name": "chat-1", "device": "sim:seed=3", "gpus": [0], "profile": "1g.10gb", "placement": 5,
        "class": "stateless-inference", "group": "chat" } ])"},
    {"gpu-b", "[]"},
    {"gpu-c", R"([
      { "name": "chat-2", "device": "sim:seed=4", "gpus": [0], "profile": "1g.10gb", "placement": 6,
        "class": "stateless-inference", "group": "chat" } ])"},
};

class EvacuationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("gm-evacuation-{}-{}", getpid(),
                                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const auto& [host, vms] : kVms) OpenAgent(host, vms);
    auto store = OpenFileStore((dir_ / "store").string());
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_ = std::move(*store);
  }
  void TearDown() override {
    agents_.clear();
    fs::remove_all(dir_);
  }

  void OpenAgent(const std::string& host, const std::string& vms) {
    const std::string config = fmt::format(R"({{ "version": 1, "host": {}, "groups": {}, "vms": {} }})",
                                           HostEntry(host), kGroups, vms);
    auto cfg = agent::ParseAgentConfig(config);
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    agent::AgentOptions o;
    o.self_exe = "/usr/bin/gpumigrate";
    o.state_dir = (dir_ / host).string();
    o.listen_address = Address(host);
    o.port_wait = std::chrono::milliseconds(300);
    auto a = agent::Agent::Open(std::move(*cfg), o, std::make_unique<ScriptedLauncher>(&world_));
    ASSERT_TRUE(a.ok()) << a.status().message();
    client_.agents[Address(host)] = a->get();
    agents_[host] = std::move(*a);
  }

  static std::string Inventory() {
    std::string hosts;
    for (const auto& [host, vms] : kVms) {
      Json h = Json::parse(HostEntry(host));
      h["agent"] = Address(host);
      hosts += (hosts.empty() ? "" : ",") + h.dump();
    }
    return fmt::format(R"({{ "version": 1, "policy": {{ "max_stun": "100s" }}, "hosts": [{}],
        "groups": [ {{ "name": "chat", "min_serving": 1, "replica_start": "1s", "drain": "1s" }} ], "vms": [] }})",
                       hosts);
  }

  std::unique_ptr<Evacuation> Open(const std::string& id = "evac") {
    EvacuationOptions o;
    o.id = id;
    o.host = "gpu-a";
    o.poll = std::chrono::milliseconds(1);
    auto e = Evacuation::Open(Inventory(), o, client_);
    EXPECT_TRUE(e.ok()) << e.status().message();
    if (!e.ok()) return nullptr;
    (*e)->OnLine([this](const std::string& line) { lines_.push_back(line); });
    return std::move(*e);
  }

  EvacuationSummary Run(const std::string& id = "evac") {
    auto e = Open(id);
    if (!e) return {2, "not opened", {}};
    return e->Run(std::nullopt, *store_, nullptr, cancel_);
  }

  std::vector<std::string> VmsOn(const std::string& host) {
    std::vector<std::string> names;
    const Json inv = agents_[host]->Handle({{"op", "inventory"}});
    for (const auto& v : inv["vms"]) names.push_back(v["name"]);
    std::sort(names.begin(), names.end());
    return names;
  }

  static const EvacuationOutcome* Of(const EvacuationSummary& s, const std::string& vm) {
    for (const auto& o : s.vms) {
      if (o.vm == vm) return &o;
    }
    return nullptr;
  }

  std::string Lines() const {
    std::string all;
    for (const auto& l : lines_) all += l + "\n";
    return all;
  }

  std::vector<JournalEntry> Journal(const std::string& id = "evac") {
    auto j = store_->Journal(id);
    EXPECT_TRUE(j.ok()) << j.status().message();
    return j.ok() ? *j : std::vector<JournalEntry>{};
  }

  fs::path dir_;
  World world_;
  InProcessAgents client_;
  std::map<std::string, std::unique_ptr<agent::Agent>> agents_;
  std::unique_ptr<EvacuationStore> store_;
  std::atomic<bool> cancel_{false};
  std::vector<std::string> lines_;
};

TEST_F(EvacuationTest, EveryVmLeavesTheHostOnceThroughItsAgents) {
  const EvacuationSummary s = Run();
  ASSERT_EQ(s.exit_code, 0) << s.error << "\n" << Lines();
  ASSERT_EQ(s.vms.size(), 3u) << Lines();
  for (const auto& o : s.vms) EXPECT_EQ(o.result, VmResult::kCompleted) << o.vm << ": " << o.detail;
  EXPECT_EQ(VmsOn("gpu-a"), std::vector<std::string>{});
  // Each inference VM migrated once, with its measured stun; the stateless one
  // replaced (its replica started elsewhere, then it drained), never migrated.
  EXPECT_EQ(world_.migrations["sim:seed=1"], 1);
  EXPECT_EQ(world_.migrations["sim:seed=2"], 1);
  EXPECT_EQ(world_.migrations.count("sim:seed=3"), 0u);
  EXPECT_EQ(Of(s, "llm-1")->action, "live-migrate");
  EXPECT_DOUBLE_EQ(Of(s, "llm-1")->measured_stun_ms, 12.5);
  EXPECT_EQ(Of(s, "chat-1")->action, "drain-and-replace");
  std::vector<std::string> elsewhere = VmsOn("gpu-b");
  for (const auto& v : VmsOn("gpu-c")) elsewhere.push_back(v);
  std::sort(elsewhere.begin(), elsewhere.end());
  EXPECT_EQ(elsewhere, (std::vector<std::string>{"chat-1-replica", "chat-2", "llm-1", "llm-2"}));
  // Journaled (started, then completed, for each) and every reservation given back.
  std::map<std::string, std::vector<JournalPhase>> phases;
  for (const auto& e : Journal()) {
    if (e.phase == JournalPhase::kStarted || e.phase == JournalPhase::kCompleted) phases[e.vm].push_back(e.phase);
  }
  for (const char* vm : {"llm-1", "llm-2", "chat-1"}) {
    EXPECT_EQ(phases[vm], (std::vector<JournalPhase>{JournalPhase::kStarted, JournalPhase::kCompleted})) << vm;
  }
  auto held = store_->Reservations();
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(held->empty());
}

// The engine's own verdict (drain_recommended in its report), not the words of
// its error, tells the controller a VM cannot be live-migrated: it is not tried
// again, it runs on at its source, and the evacuation says it could not finish.
TEST_F(EvacuationTest, AMigrationTheEngineSaysCannotMeetMaxStunIsNotTriedAgain) {
  world_.script["sim:seed=1"] = {
      {1, {{"outcome", "failed"}, {"error", "some words"}, {"drain_recommended", true}}}};
  const EvacuationSummary s = Run();
  EXPECT_EQ(s.exit_code, 1) << Lines();
  ASSERT_NE(Of(s, "llm-1"), nullptr) << Lines();
  EXPECT_NE(Of(s, "llm-1")->result, VmResult::kCompleted);
  EXPECT_NE(Of(s, "llm-1")->result, VmResult::kInDoubt);
  EXPECT_EQ(world_.migrations["sim:seed=1"], 1) << Lines();
  EXPECT_EQ(VmsOn("gpu-a"), std::vector<std::string>{"llm-1"});
  EXPECT_EQ(Of(s, "llm-2")->result, VmResult::kCompleted);
  EXPECT_NE(Lines().find("re-planned the VMs left after: llm-1 failed"), std::string::npos) << Lines();
}

// A migration that rolled back for another reason is planned again and tried
// again (at most three tries in all), and the VM moves once it succeeds.
TEST_F(EvacuationTest, ARolledBackMigrationIsReplannedAndTriedAgain) {
  world_.script["sim:seed=2"] = {{1, {{"outcome", "failed"}, {"error", "connection reset"}}}};
  const EvacuationSummary s = Run();
  EXPECT_EQ(s.exit_code, 0) << Lines();
  EXPECT_EQ(world_.migrations["sim:seed=2"], 2);
  ASSERT_NE(Of(s, "llm-2"), nullptr);
  EXPECT_EQ(Of(s, "llm-2")->result, VmResult::kCompleted);
  int failed = 0, replanned = 0;
  for (const auto& e : Journal()) {
    failed += e.vm == "llm-2" && e.phase == JournalPhase::kFailed;
    replanned += e.vm == "llm-2" && e.phase == JournalPhase::kReplanned;
  }
  EXPECT_EQ(failed, 1);
  EXPECT_GE(replanned, 1);

}

// Three failures in a row are the last: no fourth try; the VM runs at its source.
TEST_F(EvacuationTest, ThreeFailedTriesAreTheLast) {
  world_.script["sim:seed=1"] = {{1, {{"error", "x"}}}, {1, {{"error", "y"}}}, {1, {{"error", "z"}}}, {1, {{"error", "w"}}}};
  const EvacuationSummary s = Run();
  EXPECT_EQ(s.exit_code, 1) << Lines();
  EXPECT_EQ(world_.migrations["sim:seed=1"], 3);
  ASSERT_NE(Of(s, "llm-1"), nullptr);
  EXPECT_EQ(Of(s, "llm-1")->result, VmResult::kFailed);
  EXPECT_EQ(VmsOn("gpu-a"), std::vector<std::string>{"llm-1"});
}

// A controller stopped after it started a migration (its journal says started,
// the source still runs it) and opened again with the same id follows that
// migration to its end: the VM is never migrated a second time.
TEST_F(EvacuationTest, AControllerOpenedAgainFollowsTheMigrationUnderWay) {
  world_.held.insert("sim:seed=1");
  Json rec = agents_["gpu-b"]->Handle(
      {{"op", "receive"},
       {"vm", {{"name", "llm-1"}, {"device", "sim:seed=1"},
               {"inventory", {{"gpus", {0}}, {"profile", "3g.40gb"}, {"placement", 0}, {"class", "inference"}}}}}});
  ASSERT_TRUE(rec.value("ok", false)) << rec.dump();
  JournalEntry e;
  e.evacuation = "evac";
  e.controller = "gone:1";
  e.vm = "llm-1";
  e.action = "live-migrate";
  e.phase = JournalPhase::kStarted;
  e.target = "gpu-b";
  e.detail = R"(attempt 1; target {"host":"gpu-b","gpus":[0],"placement":0})";
  ASSERT_TRUE(store_->Append(e).ok());
  Json m = agents_["gpu-a"]->Handle({{"op", "migrate"}, {"vm", "llm-1"}, {"to", "gpu-b.example:4242"}});
  ASSERT_TRUE(m.value("ok", false)) << m.dump();
  ASSERT_EQ(world_.migrations["sim:seed=1"], 1);

  const EvacuationSummary s = Run();
  EXPECT_EQ(s.exit_code, 0) << s.error << "\n" << Lines();
  EXPECT_EQ(world_.migrations["sim:seed=1"], 1) << "migrated twice";
  ASSERT_NE(Of(s, "llm-1"), nullptr);
  EXPECT_EQ(Of(s, "llm-1")->result, VmResult::kCompleted);
  EXPECT_NE(Lines().find("llm-1: live-migrate started before a controller restart is still under way"),
            std::string::npos)
      << Lines();
  const auto on_b = VmsOn("gpu-b");
  EXPECT_NE(std::find(on_b.begin(), on_b.end(), "llm-1"), on_b.end());
  EXPECT_EQ(VmsOn("gpu-a"), std::vector<std::string>{});
}

// Nowhere to go: refused before anything moves, and said why.
TEST_F(EvacuationTest, AnInfeasiblePlanMovesNothing) {
  for (const char* h : {"gpu-b", "gpu-c"}) {
    ASSERT_TRUE(agents_[h]->Handle({{"op", "maintenance"}, {"enter", true}}).value("ok", false));
  }
  const EvacuationSummary s = Run();
  EXPECT_EQ(s.exit_code, 1);
  EXPECT_NE(Lines().find("refused:"), std::string::npos) << Lines();
  EXPECT_TRUE(world_.children.empty());
  EXPECT_EQ(VmsOn("gpu-a"), (std::vector<std::string>{"chat-1", "llm-1", "llm-2"}));
}

// A target whose agent does not answer is no target; the host being evacuated
// not answering is an error before anything starts.
TEST_F(EvacuationTest, AnAgentThatDoesNotAnswer) {
  client_.down.insert(Address("gpu-b"));
  EvacuationSummary s = Run();
  EXPECT_EQ(s.exit_code, 0) << Lines();
  EXPECT_TRUE(VmsOn("gpu-b").empty());
  EXPECT_EQ(VmsOn("gpu-a"), std::vector<std::string>{});

  client_.down.insert(Address("gpu-a"));
  s = Run("evac-2");
  EXPECT_EQ(s.exit_code, 2);
  EXPECT_NE(s.error.find("the agent of gpu-a"), std::string::npos) << s.error;
}

// Interrupted before it starts: every action is left, nothing moved.
TEST_F(EvacuationTest, CancelledLeavesTheActionsNotStarted) {
  cancel_ = true;
  const EvacuationSummary s = Run();
  EXPECT_EQ(s.exit_code, 1);
  for (const auto& o : s.vms) EXPECT_EQ(o.result, VmResult::kLeft) << o.vm;
  EXPECT_TRUE(world_.children.empty());
  EXPECT_NE(Lines().find("interrupted: 3 actions not started"), std::string::npos) << Lines();
}

TEST_F(EvacuationTest, OpenRefusesWhatItCannotRun) {
  EvacuationOptions o;
  o.host = "gpu-z";
  auto e = Evacuation::Open(Inventory(), o, client_);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(std::string(e.status().message()).find("gpu-z is not in the inventory"), std::string::npos);
  o.host = "gpu-a";
  Json inv = Json::parse(Inventory());
  inv["hosts"][1].erase("agent");
  e = Evacuation::Open(inv.dump(), o, client_);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(std::string(e.status().message()).find("has no \"agent\""), std::string::npos) << e.status().message();
}

}  // namespace
}  // namespace gpumigrate
