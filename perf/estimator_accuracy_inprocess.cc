// Benchmark: how well the estimator predicts. For each workload of a matrix
// (device size, KV append rate, hot-set size, bandwidth cap), a dry run observes
// the running source and predicts; then the same source is migrated for real
// (in process, capped at that bandwidth) and the prediction is compared with
// what happened. One JSON object per workload, then a summary with the median
// and worst absolute errors.
//
//   estimator_accuracy_inprocess [--sample DURATION] [--only N]
// (perf/estimator_accuracy.py is the cross-process one: what users run.)
#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/stats.h"
#include "gpumigrate/common/units.h"

using namespace gpumigrate;
using json = nlohmann::ordered_json;

namespace {

struct Workload {
  const char* spec;
  const char* cap;  // "" = uncapped: the estimate uses the calibrated in-process bandwidth
};

const Workload kMatrix[] = {
    {"sim:size=512MiB,kv_rate=16MiB/s,hot=8MiB,page=64KiB,step=10ms", "500MB/s"},
    {"sim:size=512MiB,kv_rate=64MiB/s,hot=8MiB,page=64KiB,step=10ms", "500MB/s"},
    {"sim:size=512MiB,kv_rate=128MiB/s,hot=32MiB,page=64KiB,step=10ms", "500MB/s"},
    {"sim:size=1GiB,kv_rate=32MiB/s,hot=16MiB,page=64KiB,step=20ms", "1GB/s"},
    {"sim:size=1GiB,kv_rate=128MiB/s,hot=64MiB,page=64KiB,step=20ms", "1GB/s"},
    {"sim:size=1GiB,kv_rate=256MiB/s,hot=16MiB,page=64KiB,step=20ms", "1GB/s"},
    {"sim:size=256MiB,kv_rate=32MiB/s,hot=4MiB,page=16KiB,step=5ms", "200MB/s"},
    {"sim:size=256MiB,kv_rate=96MiB/s,hot=16MiB,page=16KiB,step=5ms", "200MB/s"},
    {"sim:size=2GiB,kv_rate=64MiB/s,hot=32MiB,page=64KiB,step=20ms", "2GB/s"},
    {"sim:size=2GiB,kv_rate=64MiB/s,hot=32MiB,page=64KiB,step=20ms", ""},
    {"sim:size=1GiB,kv_rate=128MiB/s,hot=8MiB,page=64KiB,step=20ms", ""},
    {"sim:size=512MiB,kv_rate=0,hot=128MiB,page=64KiB,step=20ms", "400MB/s"},
    {"sim:size=512MiB,kv_rate=200MiB/s,hot=64MiB,page=64KiB,step=10ms", "300MB/s"},
};

double RelErr(double predicted, double measured) { return measured > 0 ? (predicted - measured) / measured : NAN; }

// What the workloads compared add up to.
struct Tally {
  std::vector<double> stun_err, total_err;
  int decisions_agree = 0, n = 0;
};

// Compares workload w's prediction with its migration and prints the line; the
// errors count where both went live.
void Compare(int w, const Workload& wl, const Prediction& p, const MigrationReport& r, Tally& t) {
  bool predicted_live = p.decision == EstimateDecision::kLiveMigrate;
  bool measured_live = r.outcome == Outcome::kCompleted;
  ++t.n;
  if (predicted_live == measured_live) ++t.decisions_agree;
  json j{{"workload", w},
         {"device", wl.spec},
         {"bandwidth_cap", *wl.cap ? wl.cap : "none (calibrated in-process rate)"},
         {"predicted_decision", EstimateDecisionName(p.decision)},
         {"measured_outcome", OutcomeName(r.outcome)},
         {"predicted_rounds", p.mid.rounds.size()},
         {"measured_rounds", r.rounds.empty() ? 0 : r.rounds.size() - (r.outcome == Outcome::kCompleted ? 1 : 0)},
         {"predicted_stun_ms", p.mid.stun_ms},
         {"predicted_stun_range_ms", {p.stun_low_ms, p.stun_high_ms}},
         {"measured_stun_ms", r.stun_ms},
         {"predicted_total_ms", p.mid.total_ms},
         {"measured_total_ms", r.total_ms},
         {"engine_predicted_stun_ms", r.predicted_stun_ms}};
  if (measured_live && predicted_live) {
    double se = RelErr(p.mid.stun_ms, r.stun_ms), te = RelErr(p.mid.total_ms, r.total_ms);
    j["stun_error"] = se;
    j["total_error"] = te;
    j["stun_within_range"] = r.stun_ms >= p.stun_low_ms && r.stun_ms <= p.stun_high_ms;
    t.stun_err.push_back(std::fabs(se));
    t.total_err.push_back(std::fabs(te));
  } else if (!measured_live) {
    j["measured_error"] = r.status.message();
  }
  fmt::print("{}\n", j.dump());
  std::fflush(stdout);
}

// Workload w: a dry run on the running source, then the real migration at the
// same cap. Nonzero: the exit code, after printing why.
int RunWorkload(int w, const std::string& sample, Tally& t) {
  const Workload& wl = kMatrix[w];
  auto spec = ParseSimSpec(wl.spec);
  if (!spec.ok()) {
    fmt::print(stderr, "{}\n", spec.status().message());
    return 2;
  }
  auto src = *SimDevice::Create(*spec, SimRole::kSource);
  auto dst = *SimDevice::Create(*spec, SimRole::kDestination);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  EstimateOptions eo;
  eo.sample.sample = *ParseDuration(sample);
  eo.max_stun = std::chrono::seconds(2);
  eo.downtime_target = std::chrono::milliseconds(50);
  double cap = 0;
  if (*wl.cap) {
    cap = *ParseRateBytesPerS(wl.cap);
    eo.link_bytes_per_s = cap;
    eo.link_text = wl.cap;
  }
  auto est = EstimateDevice(*src, eo, SystemClock());
  if (!est.ok()) {
    fmt::print(stderr, "workload {}: {}\n", w, est.status().message());
    return 1;
  }
  LocalMigrationOptions mo;
  mo.source.bandwidth_limit_bytes_per_s = cap;
  mo.source.downtime_target = eo.downtime_target;
  mo.source.max_stun = eo.max_stun;
  mo.source.switchover_fixed_cost = est->params.fixed_cost;
  auto res = MigrateLocally(*src, *dst, mo);
  Compare(w, wl, est->prediction, res.source, t);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sample = "1s";
  int only = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--sample") sample = argv[i + 1];
    else if (k == "--only") only = std::stoi(argv[i + 1]);
    else {
      fmt::print(stderr, "usage: estimator_accuracy_inprocess [--sample DURATION] [--only N]\n");
      return 2;
    }
  }
  Tally t;
  for (int w = 0; w < static_cast<int>(std::size(kMatrix)); ++w) {
    if (only >= 0 && w != only) continue;
    if (int rc = RunWorkload(w, sample, t); rc != 0) return rc;
  }
  const std::vector<double>& stun_err = t.stun_err;
  const std::vector<double>& total_err = t.total_err;
  json summary{{"summary", "estimator_accuracy"},
               {"workloads", t.n},
               {"decisions_agree", t.decisions_agree},
               {"compared", stun_err.size()},
               {"median_abs_stun_error", UpperMedian(stun_err)},
               {"worst_abs_stun_error", stun_err.empty() ? NAN : *std::max_element(stun_err.begin(), stun_err.end())},
               {"median_abs_total_error", UpperMedian(total_err)},
               {"worst_abs_total_error",
                total_err.empty() ? NAN : *std::max_element(total_err.begin(), total_err.end())}};
  fmt::print("{}\n", summary.dump());
  return 0;
}
