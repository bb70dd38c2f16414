// Which path calibration an estimate or a migration takes (estimator.h):
// the path's configuration from a migration's flags, the stored calibration,
// and an estimate's, measured first when there is none.
#include <fmt/format.h>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/estimator/path_calibration.h"
#include "gpumigrate/estimator/path_spread.h"

namespace gpumigrate {

PathConfig PathConfigFor(const std::string& transport, uint32_t streams, const CodecChoice& codec,
                         double cap_bytes_per_s, const std::string& device) {
  PathConfig c;
  c.transport = transport;
  c.streams = streams ? streams : DefaultStreams();
  c.codec = codec.ToString();
  c.cap_bytes_per_s = cap_bytes_per_s;
  c.backend = PathBackendFor(device);
  return c;
}

Status AttachPathCalibration(const std::string& transport, uint32_t streams, const std::string& device,
                             EstimateOptions& o, const PathRunPrograms& programs) {
  if (transport == "in-process" || o.target) return Status::Ok();
  PathConfig config = PathConfigFor(transport, streams, o.codec, o.link_bytes_per_s, device);
  if (config.backend == "proc") {
    auto stored = LoadPathCalibration(config);
    const bool have = !o.recalibrate && stored.ok() && stored->has_value();
    if (!have && programs.workload.empty()) {
      o.path_note = fmt::format(
          "the proc backend's own costs (its shim's stop and resume, the last dirty scan, adoption, scattered 4 KiB "
          "pages) are not calibrated: {}; the sim path's figures stand in for them",
          programs.workload_missing);
      if (programs.progress) programs.progress(o.path_note);
      config.backend = "sim";
    }
  }
  bool now = false;
  GM_ASSIGN_OR_RETURN(PathCalibration c, LoadOrMeasurePath(config, o.recalibrate, programs, &now));
  o.path = std::move(c);
  o.path_measured_now = now;
  auto observations = LoadPathObservations();
  if (observations.ok()) {
    o.path_spread = SpreadFor(config, *observations);
  } else if (programs.progress) {
    programs.progress(fmt::format("{}; the ranges leave this host's run-to-run spread out",
                                  observations.status().message()));
  }
  return Status::Ok();
}

std::optional<PathCalibration> StoredPathFor(const PathConfig& path) {
  PathConfig p = path;
  for (int i = 0; i < 2; ++i, p.backend = "sim") {
    auto stored = LoadPathCalibration(p);
    if (stored.ok() && stored->has_value()) return **stored;
  }
  return std::nullopt;
}

}  // namespace gpumigrate
