// The path calibration's runs (MeasurePath, engine/estimator/path_runner.cc)
// through the launcher seam: a fake launcher stands in for the processes, so
// the test sees every command line the runs start and hands back the reports a
// real `migrate --json` would print (round 0 at 500 MB/s after 30 ms, dirty
// rounds 4 ms beyond their bytes, a stun of 20 ms + final bytes at 250 MB/s).
#include "gpumigrate/estimator/path_calibration.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/common/launcher.h"

namespace gpumigrate {
namespace {

std::string Flag(const std::vector<std::string>& argv, const std::string& flag) {
  auto at = std::find(argv.begin(), argv.end(), flag);
  return at == argv.end() || at + 1 == argv.end() ? "" : *(at + 1);
}

// The report of a migration of `device` ("sim:size=NMiB,...,hot=HKiB,...").
std::string ReportFor(const std::string& device, bool large_final) {
  const double size = std::stod(device.substr(device.find("size=") + 5)) * (1 << 20);
  const double hot = large_final ? std::stod(device.substr(device.find("hot=") + 4)) * 1024 : 0.1e6;
  nlohmann::json rounds = nlohmann::json::array();
  rounds.push_back({{"bytes", size}, {"ms", 30.0 + size / 500e6 * 1e3}});
  if (large_final) {
    for (int i = 0; i < 2; ++i) rounds.push_back({{"bytes", hot}, {"ms", hot / 500e6 * 1e3 + 4.0}});
  }
  rounds.push_back({{"bytes", hot}, {"ms", 1.0}, {"final", true}});
  return nlohmann::json{{"outcome", "completed"}, {"stun_ms", 20.0 + hot / 250e6 * 1e3}, {"rounds", rounds}}.dump();
}

class FakeRuns : public Launcher {
 public:
  struct Child {
    std::vector<std::string> argv;
    std::string out, err, rc;
    bool alive = true;
  };
  Result<Started> Start(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
                        const std::string& rc) override {
    children.push_back({argv, out, err, rc});
    const std::string kind = argv.size() > 1 ? argv[1] : "";
    if (kind == "receive") {
      std::ofstream(Flag(argv, "--port-file")) << 5000 << "\n";
    } else if (kind == "migrate") {
      const bool large_final = Flag(argv, "--max-rounds") == "3";
      End(children.size() - 1, migrate_rc, migrate_rc == 0 ? ReportFor(Flag(argv, "--device"), large_final) : "",
          migrate_rc == 0 ? "" : "gpumigrate migrate: connection refused\n");
      for (size_t i = 0; i + 1 < children.size(); ++i) {
        if (children[i].alive && children[i].argv[1] == "receive") End(i, migrate_rc == 0 ? 0 : 1, "{}", "");
      }
    }
    return Started{static_cast<int64_t>(children.size()), "t"};
  }
  bool Alive(int64_t id, const std::string&) override { return children.at(id - 1).alive; }
  void Kill(int64_t id, const std::string&) override { End(id - 1, 143, "", "killed\n"); }

  void End(size_t i, int rc, const std::string& out, const std::string& err) {
    std::ofstream(children[i].out) << out;
    std::ofstream(children[i].err) << err;
    std::ofstream(children[i].rc) << rc << "\n";
    children[i].alive = false;
  }
  std::vector<std::vector<std::string>> StartedOf(const std::string& kind) const {
    std::vector<std::vector<std::string>> v;
    for (const auto& c : children) {
      if (c.argv.size() > 1 && c.argv[1] == kind) v.push_back(c.argv);
    }
    return v;
  }

  std::vector<Child> children;
  int migrate_rc = 0;
};

PathConfig TlsPath() {
  PathConfig c;
  c.transport = "tls";
  c.streams = 2;
  c.codec = "none";
  c.cap_bytes_per_s = 0;
  c.backend = "sim";
  return c;
}

TEST(PathRunner, FourMigrationsBetweenTwoProcessesAreFitted) {
  FakeRuns runs;
  PathRunPrograms p;
  p.gpumigrate = "/opt/gpumigrate";
  p.launcher = &runs;
  std::vector<std::string> lines;
  p.progress = [&lines](const std::string& l) { lines.push_back(l); };
  auto c = MeasurePath(TlsPath(), p);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const auto migrates = runs.StartedOf("migrate"), receives = runs.StartedOf("receive");
  ASSERT_EQ(migrates.size(), 4u);
  ASSERT_EQ(receives.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const auto& m = migrates[i];
    EXPECT_EQ(m[0], "/opt/gpumigrate");
    EXPECT_EQ(Flag(m, "--to"), "127.0.0.1:5000") << "the port the receiver wrote";
    EXPECT_EQ(Flag(m, "--streams"), "2");
    EXPECT_EQ(Flag(m, "--codec"), "none");
    EXPECT_FALSE(Flag(m, "--psk-file").empty()) << "a TLS path runs over TLS, with a throwaway key";
    EXPECT_EQ(Flag(m, "--psk-file"), Flag(receives[i], "--psk-file"));
    EXPECT_EQ(Flag(m, "--device"), Flag(receives[i], "--device"));
    EXPECT_EQ(Flag(m, "--max-rounds") == "3", i % 2 == 1) << "the kinds alternate: nearly empty final round, large";
  }
  EXPECT_NEAR(c->bytes_per_s, 500e6, 500e6 * 0.01);
  EXPECT_NEAR(c->round_overhead_ms, 4.0, 0.1);
  EXPECT_NEAR(c->fixed_ms, 20.0, 0.5);
  EXPECT_NEAR(c->final_bytes_per_s, 250e6, 250e6 * 0.05);
  EXPECT_EQ(c->runs, 4);
  EXPECT_NE(c->method.find("between two processes of this binary"), std::string::npos) << c->method;
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("calibrating the path"), std::string::npos) << lines[0];
}

TEST(PathRunner, AFailedTestMigrationIsAnErrorNamingItsExitAndWords) {
  FakeRuns runs;
  runs.migrate_rc = 1;
  PathRunPrograms p;
  p.gpumigrate = "/opt/gpumigrate";
  p.launcher = &runs;
  auto c = MeasurePath(TlsPath(), p);
  ASSERT_FALSE(c.ok());
  const std::string m(c.status().message());
  EXPECT_NE(m.find("migrate exit 1"), std::string::npos) << m;
  EXPECT_NE(m.find("connection refused"), std::string::npos) << m;
  EXPECT_EQ(runs.StartedOf("migrate").size(), 1u) << "no further runs after one failed";
}

TEST(PathRunner, AProcPathWithoutItsWorkloadIsRefusedBeforeAnythingStarts) {
  FakeRuns runs;
  PathRunPrograms p;
  p.gpumigrate = "/opt/gpumigrate";
  p.launcher = &runs;
  PathConfig c = TlsPath();
  c.backend = "proc";
  auto r = MeasurePath(c, p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(runs.children.empty());
}

}  // namespace
}  // namespace gpumigrate
