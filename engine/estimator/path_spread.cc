// The host's record of migrations against their path calibration, and the
// spread `estimate` draws its ranges from (gpumigrate/estimator/path_spread.h).
#include "gpumigrate/estimator/path_spread.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "engine/estimator/path_file.h"

namespace gpumigrate {
namespace {

constexpr size_t kKept = 64;
constexpr size_t kMinForSpread = 3;

bool Usable(double ratio) { return std::isfinite(ratio) && ratio > 0; }

}  // namespace

std::optional<PathObservation> ObservePath(const PathCalibration& c, const PathRun& run, std::string at) {
  PathObservation o;
  o.key = c.config.Key();
  o.at = std::move(at);
  o.capped = c.config.cap_bytes_per_s > 0;
  const double past_startup_ms = run.round0_ms - c.round0_startup_ms;
  if (run.round0_bytes > 0 && past_startup_ms > 0.1 * run.round0_ms && c.bytes_per_s > 0) {
    o.round0_ratio = run.round0_bytes / (past_startup_ms / 1e3) / c.bytes_per_s;
  }
  if (run.stun_ms > 0 && c.final_bytes_per_s > 0) {
    const double predicted_ms = c.fixed_ms + run.final_bytes / c.final_bytes_per_s * 1e3;
    if (predicted_ms > 0) o.stun_ratio = run.stun_ms / predicted_ms;
  }
  if (!Usable(o.round0_ratio) && !Usable(o.stun_ratio)) return std::nullopt;
  return o;
}

Result<std::vector<PathObservation>> LoadPathObservations() {
  const std::string path = DefaultPathCalibrationFile();
  GM_ASSIGN_OR_RETURN(nlohmann::ordered_json file, ReadPathFile(path));
  std::vector<PathObservation> out;
  if (!file.contains("observations")) return out;
  const auto& list = file["observations"];
  if (!list.is_array()) return Corrupt(fmt::format("path calibration: {}: \"observations\" is not a list", path));
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& e = list[i];
    try {
      PathObservation o;
      o.key = e.at("key").get<std::string>();
      o.at = e.value("at", "");
      o.capped = e.at("capped").get<bool>();
      o.round0_ratio = e.at("round0_ratio").get<double>();
      o.stun_ratio = e.at("stun_ratio").get<double>();
      out.push_back(std::move(o));
    } catch (const nlohmann::json::exception& ex) {
      return Corrupt(fmt::format("path calibration: {}: observation {} is damaged: {}", path, i, ex.what()));
    }
  }
  return out;
}

Status RecordPathObservation(const PathObservation& o) {
  return UpdatePathFile([&](nlohmann::ordered_json& file) {
    auto& list = file["observations"];
    if (!list.is_array()) list = nlohmann::ordered_json::array();  // damaged: a cache, started again
    list.push_back({{"key", o.key},
                    {"at", o.at},
                    {"capped", o.capped},
                    {"round0_ratio", o.round0_ratio},
                    {"stun_ratio", o.stun_ratio}});
    while (list.size() > kKept) list.erase(list.begin());
  });
}

namespace {

// The lowest and highest of `v`, leaving out the twentieth at each end from ten values on.
std::pair<double, double> Extent(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t drop = v.size() >= 10 ? (v.size() + 10) / 20 : 0;
  return {v[drop], v[v.size() - 1 - drop]};
}

}  // namespace

std::optional<PathSpread> SpreadFor(const PathConfig& c, const std::vector<PathObservation>& all) {
  const bool capped = c.cap_bytes_per_s > 0;
  std::vector<double> round0, stun;
  int n = 0;
  for (const auto& o : all) {
    if (o.capped != capped) continue;
    ++n;
    if (Usable(o.round0_ratio)) round0.push_back(o.round0_ratio);
    if (Usable(o.stun_ratio)) stun.push_back(o.stun_ratio);
  }
  if (round0.size() < kMinForSpread && stun.size() < kMinForSpread) return std::nullopt;
  PathSpread s;
  s.observations = n;
  s.pool = capped ? "capped paths" : "uncapped paths";
  if (round0.size() >= kMinForSpread) std::tie(s.round0_low, s.round0_high) = Extent(round0);
  if (stun.size() >= kMinForSpread) std::tie(s.stun_low, s.stun_high) = Extent(stun);
  // The calibration's own figures are one draw of the same spread: 1 is inside it.
  s.round0_low = std::min(s.round0_low, 1.0);
  s.round0_high = std::max(s.round0_high, 1.0);
  s.stun_low = std::min(s.stun_low, 1.0);
  s.stun_high = std::max(s.stun_high, 1.0);
  return s;
}

}  // namespace gpumigrate
