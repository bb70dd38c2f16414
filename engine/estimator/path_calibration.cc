// The path calibration's fit and its store (gpumigrate/estimator/path_calibration.h). The
// runs themselves are spawned by the CLI (cli/path_calibration.cc): they are
// this binary's `migrate` and `receive`, which the engine library cannot start.
#include "gpumigrate/estimator/path_calibration.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/common/stats.h"
#include "engine/estimator/path_file.h"

namespace gpumigrate {

std::string PathConfig::Key() const {
  return fmt::format("{}/{}/{}/{}{}", transport, streams, codec,
                     cap_bytes_per_s > 0 ? fmt::format("{:.0f}B/s", cap_bytes_per_s) : std::string("uncapped"),
                     backend.empty() || backend == "sim" ? std::string() : "/" + backend);
}

std::string PathBackendFor(std::string_view device_spec) {
  return device_spec.substr(0, 5) == "proc:" ? "proc" : "sim";
}

namespace {

double Min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double Max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// Round 0 lasts startup + bytes / rate, through the medians of both sizes (`small_*`
// and `big_*`: the runs' round 0 bytes and ms); one size only (or a slope the noise
// made negative): no startup. Sets the startup and the round-0 rates of `c`.
void FitRound0(const PathConfig& config, const std::vector<PathRun>& runs, const std::vector<double>& small_b,
               const std::vector<double>& small_ms, const std::vector<double>& big_b, const std::vector<double>& big_ms,
               PathCalibration& c) {
  const double sb = Median(small_b), sm = Median(small_ms), bb = Median(big_b), bm = Median(big_ms);
  const double hi_b = std::max(sb, bb), hi_ms = sb > bb ? sm : bm, lo_b = std::min(sb, bb), lo_ms = sb > bb ? bm : sm;
  double startup_ms = 0;
  if (hi_b > 1.5 * lo_b && hi_ms > lo_ms) {
    const double slope = (hi_b - lo_b) / (hi_ms - lo_ms);  // bytes per ms
    startup_ms = std::clamp(hi_ms - hi_b / slope, 0.0, 0.9 * lo_ms);
  }
  c.round0_startup_ms = startup_ms;
  std::vector<double> rate;
  for (const auto& r : runs) {
    // A run faster than the medians may end before the fitted startup does: it
    // says nothing about the bulk rate (and would give a negative one).
    const double t = r.round0_ms - startup_ms;
    if (t > 0.1 * r.round0_ms) rate.push_back(r.round0_bytes / (t / 1e3));
  }
  c.bytes_per_s = (hi_b + lo_b) / ((hi_ms + lo_ms - 2 * startup_ms) / 1e3);
  c.low_bytes_per_s = rate.empty() ? c.bytes_per_s : std::min(c.bytes_per_s, Min(rate));
  c.high_bytes_per_s = rate.empty() ? c.bytes_per_s : std::max(c.bytes_per_s, Max(rate));
  if (config.cap_bytes_per_s > 0) {
    // The token bucket's first burst lets a short round 0 beat the cap, and the
    // startup fit can then put the bulk above it: no round runs faster than the cap.
    c.bytes_per_s = std::min(c.bytes_per_s, config.cap_bytes_per_s);
    c.low_bytes_per_s = std::min(c.low_bytes_per_s, config.cap_bytes_per_s);
    c.high_bytes_per_s = std::min(c.high_bytes_per_s, config.cap_bytes_per_s);
  }
}

// stun = fixed + final / rate, through the medians of both kinds; each large
// run gives its own rate and each small run its own fixed cost for the range.
// Sets the stun's fixed costs and final-round rates of `c`.
void FitStun(const std::vector<double>& small_stun, const std::vector<double>& small_final,
             const std::vector<double>& big_stun, const std::vector<double>& big_final, PathCalibration& c) {
  const double s_stun = Median(small_stun), s_final = Median(small_final);
  const double b_stun = Median(big_stun), b_final = Median(big_final);
  auto rate_through = [&](double stun, double final) {
    const double dt = (stun - s_stun) / 1e3, db = final - s_final;
    return dt > 0 && db > 0 ? db / dt : c.bytes_per_s;  // no measurable slope: the bulk's rate
  };
  c.final_bytes_per_s = rate_through(b_stun, b_final);
  std::vector<double> finals, fixeds;
  for (size_t i = 0; i < big_stun.size(); ++i) finals.push_back(rate_through(big_stun[i], big_final[i]));
  for (size_t i = 0; i < small_stun.size(); ++i) {
    fixeds.push_back(std::max(0.0, small_stun[i] - small_final[i] / c.final_bytes_per_s * 1e3));
  }
  c.fixed_ms = std::max(0.0, s_stun - s_final / c.final_bytes_per_s * 1e3);
  c.fixed_low_ms = std::min(c.fixed_ms, Min(fixeds));
  c.fixed_high_ms = std::max(c.fixed_ms, Max(fixeds));
  c.final_low_bytes_per_s = std::min(c.final_bytes_per_s, Min(finals));
  c.final_high_bytes_per_s = std::max(c.final_bytes_per_s, Max(finals));
}

}  // namespace

Result<PathCalibration> FitPathCalibration(const PathConfig& config, const std::vector<PathRun>& runs) {
  std::vector<double> ratio, small_stun, small_final, big_stun, big_final;
  std::vector<double> small_b, small_ms, big_b, big_ms;
  for (const auto& r : runs) {
    if (r.round0_ms <= 0 || r.round0_bytes <= 0) {
      return InvalidArgument("path calibration: a run reported an empty or instant round 0");
    }
    ratio.push_back(r.round0_raw_bytes > 0 ? r.round0_raw_bytes / r.round0_bytes : 1.0);
    (r.small_final ? small_stun : big_stun).push_back(r.stun_ms);
    (r.small_final ? small_final : big_final).push_back(r.final_bytes);
    (r.small_final ? small_b : big_b).push_back(r.round0_bytes);
    (r.small_final ? small_ms : big_ms).push_back(r.round0_ms);
  }
  if (small_stun.empty() || big_stun.empty()) {
    return InvalidArgument("path calibration: the fit needs runs with a small and with a large final round");
  }
  PathCalibration c;
  c.config = config;
  c.runs = static_cast<int>(runs.size());
  c.wire_ratio = std::max(1.0, UpperMedian(ratio));
  FitRound0(config, runs, small_b, small_ms, big_b, big_ms, c);
  c.raw_bytes_per_s = c.bytes_per_s * c.wire_ratio;

  // A dirty round lasts bytes / round-0 rate + overhead.
  std::vector<double> overhead;
  for (const auto& r : runs) {
    for (const auto& [bytes, ms] : r.dirty_rounds) overhead.push_back(ms - bytes / c.bytes_per_s * 1e3);
  }
  c.round_overhead_ms = overhead.empty() ? 0.0 : std::max(0.0, Median(overhead));
  FitStun(small_stun, small_final, big_stun, big_final, c);
  std::vector<double> syncs;
  for (const auto& r : runs) syncs.push_back(r.final_sync_ms);
  c.final_sync_ms = Median(syncs);
  return c;
}

Result<PathRun> PathRunFromReport(const std::string& report_json, bool small_final) {
  auto j = nlohmann::json::parse(report_json, nullptr, false);
  PathRun r;
  r.small_final = small_final;
  try {
    if (j.is_discarded() || !j.is_object()) return Corrupt("path calibration: the migration printed no JSON report");
    if (j.value("outcome", "") != "completed") {
      return Internal(fmt::format("path calibration: the test migration did not complete ({}): {}",
                                  j.value("outcome", "?"), j.value("error", j.value("status", std::string()))));
    }
    r.stun_ms = j.at("stun_ms").get<double>();
    if (j.contains("stun_breakdown_ms") && j["stun_breakdown_ms"].contains("final_sync")) {
      r.final_sync_ms = j["stun_breakdown_ms"]["final_sync"].get<double>();
    }
    bool first = true;
    for (const auto& x : j.at("rounds")) {
      const double bytes = x.at("bytes").get<double>(), ms = x.at("ms").get<double>();
      if (x.value("final", false)) {
        r.final_bytes += bytes;
      } else if (first) {
        r.round0_bytes = bytes;
        r.round0_raw_bytes = x.value("raw_bytes", bytes);
        r.round0_ms = ms;
        first = false;
      } else {
        r.dirty_rounds.emplace_back(bytes, ms);
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return Corrupt(fmt::format("path calibration: the migration's report lacks a field: {}", e.what()));
  }
  if (r.round0_ms <= 0) return Corrupt("path calibration: the migration's report has no round 0");
  return r;
}

std::string DefaultPathCalibrationFile() {
  std::string p = DefaultCalibrationPath();
  const std::string ext = ".json";
  if (p.size() > ext.size() && p.compare(p.size() - ext.size(), ext.size(), ext) == 0) {
    return p.substr(0, p.size() - ext.size()) + "-paths.json";
  }
  return p + "-paths.json";
}

namespace {

nlohmann::ordered_json ToJson(const PathCalibration& c) {
  return {{"transport", c.config.transport},
          {"streams", c.config.streams},
          {"codec", c.config.codec},
          {"cap_bytes_per_s", c.config.cap_bytes_per_s},
          {"backend", c.config.backend},
          {"bytes_per_s", c.bytes_per_s},
          {"low_bytes_per_s", c.low_bytes_per_s},
          {"high_bytes_per_s", c.high_bytes_per_s},
          {"round0_startup_ms", c.round0_startup_ms},
          {"raw_bytes_per_s", c.raw_bytes_per_s},
          {"wire_ratio", c.wire_ratio},
          {"round_overhead_ms", c.round_overhead_ms},
          {"fixed_ms", c.fixed_ms},
          {"fixed_low_ms", c.fixed_low_ms},
          {"fixed_high_ms", c.fixed_high_ms},
          {"final_bytes_per_s", c.final_bytes_per_s},
          {"final_low_bytes_per_s", c.final_low_bytes_per_s},
          {"final_high_bytes_per_s", c.final_high_bytes_per_s},
          {"final_sync_ms", c.final_sync_ms},
          {"runs", c.runs},
          {"measured_at", c.measured_at},
          {"method", c.method}};
}

Result<PathCalibration> FromJson(const nlohmann::ordered_json& e, const std::string& where) {
  PathCalibration c;
  try {
    c.config.transport = e.at("transport").get<std::string>();
    c.config.streams = e.at("streams").get<uint32_t>();
    c.config.codec = e.at("codec").get<std::string>();
    c.config.cap_bytes_per_s = e.at("cap_bytes_per_s").get<double>();
    c.config.backend = e.value("backend", "sim");  // files written before backends were told apart: sim
    c.bytes_per_s = e.at("bytes_per_s").get<double>();
    c.low_bytes_per_s = e.at("low_bytes_per_s").get<double>();
    c.high_bytes_per_s = e.at("high_bytes_per_s").get<double>();
    c.round0_startup_ms = e.at("round0_startup_ms").get<double>();
    c.raw_bytes_per_s = e.at("raw_bytes_per_s").get<double>();
    c.wire_ratio = e.at("wire_ratio").get<double>();
    c.round_overhead_ms = e.at("round_overhead_ms").get<double>();
    c.fixed_ms = e.at("fixed_ms").get<double>();
    c.fixed_low_ms = e.at("fixed_low_ms").get<double>();
    c.fixed_high_ms = e.at("fixed_high_ms").get<double>();
    c.final_bytes_per_s = e.at("final_bytes_per_s").get<double>();
    c.final_low_bytes_per_s = e.at("final_low_bytes_per_s").get<double>();
    c.final_high_bytes_per_s = e.at("final_high_bytes_per_s").get<double>();
    c.final_sync_ms = e.value("final_sync_ms", 0.0);  // entries written before it was kept: none known
    c.runs = e.value("runs", 0);
    c.measured_at = e.value("measured_at", "");
    c.method = e.value("method", "");
  } catch (const nlohmann::json::exception& ex) {
    return Corrupt(fmt::format("path calibration: {} is damaged: {}", where, ex.what()));
  }
  const double rates[] = {c.bytes_per_s, c.low_bytes_per_s, c.high_bytes_per_s, c.final_bytes_per_s,
                          c.final_low_bytes_per_s, c.final_high_bytes_per_s, c.wire_ratio};
  const double costs[] = {c.round0_startup_ms, c.round_overhead_ms, c.fixed_ms, c.fixed_low_ms, c.fixed_high_ms};
  if (std::any_of(std::begin(rates), std::end(rates), [](double x) { return !(x > 0) || !std::isfinite(x); }) ||
      std::any_of(std::begin(costs), std::end(costs), [](double x) { return !(x >= 0) || !std::isfinite(x); })) {
    return Corrupt(fmt::format("path calibration: {} holds a rate that is not positive or a cost that is negative",
                               where));
  }
  return c;
}

}  // namespace

Result<nlohmann::ordered_json> ReadPathFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::ordered_json{{"version", 1}, {"paths", nlohmann::ordered_json::object()}};
  auto j = nlohmann::ordered_json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("version", 0) != 1 || !j.contains("paths") ||
      !j["paths"].is_object()) {
    return Corrupt(fmt::format("path calibration: {} is not a version 1 path calibration file", path));
  }
  return j;
}

Status UpdatePathFile(const std::function<void(nlohmann::ordered_json&)>& change) {
  const std::string path = DefaultPathCalibrationFile();
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  // Every writer holds the lock from its read to its rename: two processes
  // adding at once both keep what they added.
  const std::string lock_path = path + ".lock";
  const int lock = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock < 0) return Status::FromErrno(errno, fmt::format("path calibration: open {}", lock_path));
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }  // closing drops the flock
  } unlock{lock};
  while (::flock(lock, LOCK_EX) != 0) {
    if (errno != EINTR) return Status::FromErrno(errno, fmt::format("path calibration: lock {}", lock_path));
  }
  auto read = ReadPathFile(path);
  // A damaged file is replaced, not merged: it is a cache of measurements.
  nlohmann::ordered_json out =
      read.ok() ? std::move(read).value()
                : nlohmann::ordered_json{{"version", 1}, {"paths", nlohmann::ordered_json::object()}};
  change(out);
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  {
    std::ofstream f(tmp);
    f << out.dump(2) << "\n";
    if (!f) return Status::FromErrno(errno, fmt::format("path calibration: write {}", tmp));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal(fmt::format("path calibration: rename {} failed: {}", tmp, ec.message()));
  return Status::Ok();
}

Result<std::optional<PathCalibration>> LoadPathCalibration(const PathConfig& config) {
  const std::string path = DefaultPathCalibrationFile();
  GM_ASSIGN_OR_RETURN(nlohmann::ordered_json file, ReadPathFile(path));
  const auto& paths = file["paths"];
  const std::string key = config.Key();
  if (!paths.contains(key)) return std::optional<PathCalibration>();
  GM_ASSIGN_OR_RETURN(PathCalibration c, FromJson(paths[key], fmt::format("{} (entry {})", path, key)));
  return std::optional<PathCalibration>(std::move(c));
}

Status StorePathCalibration(const PathCalibration& c) {
  return UpdatePathFile([&](nlohmann::ordered_json& file) { file["paths"][c.config.Key()] = ToJson(c); });
}

}  // namespace gpumigrate
