#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/estimator/path_calibration.h"

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "gpumigrate/common/stats.h"

namespace gpumigrate {
namespace {

constexpr const char* kSpec = "sim:size=512MiB,static=0.75,kv=0.2,kv_fill=1,kv_rate=0,hot=64KiB,page=64KiB,step=20ms";

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

std::string DefaultCalibrationPath() {
  if (const char* p = std::getenv("GPUMIGRATE_CALIBRATION"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/gpumigrate/calibration.json";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/gpumigrate/calibration.json";
  return "/tmp/gpumigrate-calibration.json";
}

Result<Calibration> MeasureCalibration() {
  auto spec = ParseSimSpec(kSpec);
  if (!spec.ok()) return spec.status();
  std::vector<double> fixed, bw;
  for (int i = 0; i < 3; ++i) {
    GM_ASSIGN_OR_RETURN(auto src, SimDevice::Create(*spec, SimRole::kSource));
    GM_ASSIGN_OR_RETURN(auto dst, SimDevice::Create(*spec, SimRole::kDestination));
    LocalMigrationOptions opt;
    opt.source.downtime_target = std::chrono::seconds(10);
    auto res = MigrateLocally(*src, *dst, opt);
    if (res.source.outcome != Outcome::kCompleted) {
      return res.source.status.WithContext("calibration: test migration failed");
    }
    fixed.push_back(res.source.stun_ms - res.source.stun_breakdown_ms.final_data_ms.value_or(0));
    const RoundReport& r0 = res.source.rounds.front();
    bw.push_back(static_cast<double>(r0.bytes) / (r0.ms / 1e3));
  }
  Calibration c;
  c.fixed_cost_ms = UpperMedian(fixed);
  c.inprocess_bytes_per_s = UpperMedian(bw);
  c.inprocess_low_bytes_per_s = *std::min_element(bw.begin(), bw.end());
  c.inprocess_high_bytes_per_s = *std::max_element(bw.begin(), bw.end());
  c.measured_at = NowUtc();
  c.measured_now = true;
  return c;
}

Result<Calibration> LoadStoredCalibration() {
  const std::string path = DefaultCalibrationPath();
  std::ifstream in(path);
  if (!in) return Unavailable(fmt::format("calibration: no stored calibration at {}", path));
  auto j = nlohmann::json::parse(in, nullptr, false);
  Calibration c;
  // json::value() throws when a field holds the wrong type: a damaged file, not a crash.
  try {
    if (j.is_discarded() || !j.is_object() || j.value("version", 0) != 1) {
      return Corrupt(fmt::format("calibration: {} is not a version 1 calibration file", path));
    }
    c.fixed_cost_ms = j.value("fixed_cost_ms", -1.0);
    c.inprocess_bytes_per_s = j.value("inprocess_bytes_per_s", -1.0);
    c.inprocess_low_bytes_per_s = j.value("inprocess_low_bytes_per_s", c.inprocess_bytes_per_s);
    c.inprocess_high_bytes_per_s = j.value("inprocess_high_bytes_per_s", c.inprocess_bytes_per_s);
    c.measured_at = j.value("measured_at", "");
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(fmt::format("calibration: {} is damaged: {}", path, e.what()));
  }
  c.path = path;
  if (c.fixed_cost_ms < 0 || c.inprocess_bytes_per_s <= 0) {
    return Corrupt(fmt::format("calibration: {} lacks its figures", path));
  }
  return c;
}

Result<Calibration> LoadOrCalibrate(bool force) {
  const std::string path = DefaultCalibrationPath();
  if (!force) {
    auto stored = LoadStoredCalibration();
    if (stored.ok()) return stored;
  }
  GM_ASSIGN_OR_RETURN(Calibration c, MeasureCalibration());
  c.path = path;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  nlohmann::ordered_json j{{"version", 1},
                           {"fixed_cost_ms", c.fixed_cost_ms},
                           {"inprocess_bytes_per_s", c.inprocess_bytes_per_s},
                           {"inprocess_low_bytes_per_s", c.inprocess_low_bytes_per_s},
                           {"inprocess_high_bytes_per_s", c.inprocess_high_bytes_per_s},
                           {"measured_at", c.measured_at},
                           {"method", std::string("median of 3 in-process migrations of ") + kSpec}};
  // Written to a temporary name and renamed, so a reader never sees half a file.
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return Status::FromErrno(errno, fmt::format("calibration: write {}", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal(fmt::format("calibration: rename {} failed: {}", tmp, ec.message()));
  return c;
}

std::chrono::nanoseconds StoredFixedCost(std::chrono::nanoseconds fallback) {
  auto cal = LoadStoredCalibration();
  if (!cal.ok()) return fallback;
  return std::chrono::nanoseconds(static_cast<int64_t>(cal->fixed_cost_ms * 1e6));
}

std::chrono::nanoseconds SwitchoverFixedCostFor(const std::optional<PathCalibration>& path,
                                                std::chrono::nanoseconds fallback) {
  if (path) return std::chrono::nanoseconds(static_cast<int64_t>(path->fixed_ms * 1e6));
  return StoredFixedCost(fallback);
}

}  // namespace gpumigrate
