// ProjectTable: `estimate --project-table`, the projection for 1..N GPUs at
// several links, each beside the stop-and-copy stun of the same device.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpumigrate/estimator/estimator.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate {
namespace {

// Everything non-zero (compressed as the model assumes) and the device state
// sent while the VM is stopped, at the cell's bandwidth, plus the fixed cost.
double StopAndCopyStunMs(const EstimateReport& e) {
  double bytes = static_cast<double>(e.modelled.device_state_bytes);
  for (const auto& r : e.modelled.regions) {
    bytes += static_cast<double>(r.info.size_bytes) * r.nonzero_fraction / r.compression_ratio;
  }
  const double fixed_ms = std::chrono::duration<double, std::milli>(e.params.fixed_cost).count();
  return e.params.bandwidth_mid > 0 ? bytes / e.params.bandwidth_mid * 1e3 + fixed_ms : INFINITY;
}

}  // namespace

Result<ProjectionTable> ProjectTable(const DeviceProfile& measured, const EstimateOptions& options,
                                     const Calibration& cal, const std::vector<uint32_t>& gpus,
                                     const std::vector<std::string>& links) {
  if (!options.project || !options.target) {
    return InvalidArgument("a projection table needs a projection (--project) and a target (--cores or --target)");
  }
  ProjectionTable t;
  for (uint32_t g : gpus) {
    for (const std::string& link : links) {
      EstimateOptions o = options;
      o.workload.gpus = g;
      GM_ASSIGN_OR_RETURN(o.link_bytes_per_s, ParseRateBytesPerS(link));
      o.link_text = link;
      ProjectionCell c;
      c.gpus = g;
      c.link = link;
      c.link_bytes_per_s = o.link_bytes_per_s;
      GM_ASSIGN_OR_RETURN(c.estimate, EstimateFromProfile(measured, o, cal));
      c.stop_and_copy_stun_ms = StopAndCopyStunMs(c.estimate);
      t.cells.push_back(std::move(c));
    }
  }
  if (!t.cells.empty()) t.assumptions = t.cells.back().estimate.assumptions;
  return t;
}

std::string ProjectionTableToJson(const ProjectionTable& t) {
  nlohmann::ordered_json cells = nlohmann::ordered_json::array();
  for (const auto& c : t.cells) {
    const Prediction& p = c.estimate.prediction;
    cells.push_back({{"gpus", c.gpus},
                     {"link", c.link},
                     {"link_bytes_per_s", c.link_bytes_per_s},
                     {"device", c.estimate.modelled.device},
                     {"decision", std::string(EstimateDecisionName(p.decision))},
                     {"predicted_stun_ms", p.mid.stun_ms},
                     {"predicted_stun_range_ms", {p.stun_low_ms, p.stun_high_ms}},
                     {"predicted_total_ms", p.mid.total_ms},
                     {"rounds", p.mid.rounds.size()},
                     {"stop_and_copy_stun_ms", c.stop_and_copy_stun_ms},
                     {"bandwidth_bytes_per_s", c.estimate.params.bandwidth_mid},
                     {"binds", c.estimate.pipeline ? c.estimate.pipeline->binds : std::string()}});
  }
  nlohmann::ordered_json j{{"cells", cells},
                           {"assumptions", t.assumptions},
                           {"published_comparison",
                            {{"what", "VMware vMotion of an 8x H100 80 GB vGPU VM over 100 Gbit (VCF 9.0): 21 s stun, "
                                      "~70% of GPU memory pre-copied as static"},
                             {"stun_ms", 21000},
                             {"source", "published by VMware; not measured by gpumigrate"}}}};
  return j.dump();
}

}  // namespace gpumigrate
