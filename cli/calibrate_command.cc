#include "cli/calibrate_command.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/print.h"
#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/estimator/projection.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

CLI::App* AddCalibrateCommand(CLI::App& app, CalibrateFlags& f) {
  auto* c = app.add_subcommand(
      "calibrate",
      "Measure this host: the switchover's fixed cost, the in-process pipeline, and the per-core rate of each "
      "pipeline stage (copy, page hash, AES-GCM, socket, codecs); stored for `estimate`. Run it on a target host "
      "with --profile-out to project there (`estimate --target FILE`).");
  c->add_option("--profile-out", f.profile_out, "Also write the host profile to this file");
  c->add_flag("--json", f.json, "Print one JSON object on stdout");
  return c;
}

int RunCalibrate(const CalibrateFlags& f) {
  Print(stderr, "calibrating: three small in-process migrations, then each pipeline stage on one core...\n");
  auto cal = LoadOrCalibrate(true);
  if (!cal.ok()) {
    Print(stderr, "gpumigrate calibrate: {}\n", cal.status().message());
    return 1;
  }
  auto hp = LoadOrMeasureHostProfile(true);
  if (!hp.ok()) {
    Print(stderr, "gpumigrate calibrate: {}\n", hp.status().message());
    return 1;
  }
  if (!f.profile_out.empty()) {
    if (Status s = SaveHostProfile(*hp, f.profile_out); !s.ok()) {
      Print(stderr, "gpumigrate calibrate: {}\n", s.message());
      return 1;
    }
  }
  if (f.json) {
    nlohmann::ordered_json j{{"fixed_cost_ms", cal->fixed_cost_ms},
                             {"inprocess_bytes_per_s", cal->inprocess_bytes_per_s},
                             {"calibration_path", cal->path},
                             {"host_profile_path", DefaultHostProfilePath()},
                             {"host_profile", nlohmann::ordered_json::parse(HostProfileToJson(*hp))}};
    if (!f.profile_out.empty()) j["profile_out"] = f.profile_out;
    Print("{}\n", j.dump());
    return 0;
  }
  const StageRates& r = hp->per_core;
  Print("gpumigrate calibrate: {} ({} cores), {}\n", hp->host, hp->cores, hp->measured_at);
  Print("  fixed switchover cost {:.2f} ms; in-process pipeline {}  ({})\n", cal->fixed_cost_ms,
        FormatRate(cal->inprocess_bytes_per_s), cal->path);
  Print("  per core: copy {}, page hash {}, AES-GCM {}, loopback TCP {}\n", FormatRate(r.copy), FormatRate(r.hash),
        FormatRate(r.aes_gcm), FormatRate(r.tcp));
  Print("            zstd {} / {} (compress / decompress), shuffle+zstd {} / {}, bf16 {} / {}\n",
        FormatRate(r.zstd_compress), FormatRate(r.zstd_decompress), FormatRate(r.shuffle_compress),
        FormatRate(r.shuffle_decompress), FormatRate(r.bf16_compress), FormatRate(r.bf16_decompress));
  Print("  host profile: {}{}\n", DefaultHostProfilePath(),
        f.profile_out.empty() ? "" : fmt::format(", and {}", f.profile_out));
  return 0;
}

}  // namespace gpumigrate::cli
