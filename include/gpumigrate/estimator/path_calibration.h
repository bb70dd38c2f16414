// Calibration of the path a migration will really take: `migrate` and `receive`
// as two processes of this host, over the transport (TLS or not), streams,
// codec and rate cap the migration will use. The in-process calibration
// (calibration.h) measures the pipeline without a socket between two
// processes; on a host whose cores both processes share it is several times
// faster than what `migrate` reaches, and a prediction made with it is wrong.
//
// What is measured, from a few migrations of a small sim device:
//   round rate          round 0 (the bulk) lasts startup + bytes / rate: fitted
//                       through runs of two device sizes (a round 0 of a few
//                       hundred MB spends a good part of its time ramping up);
//   round overhead      what a short dirty round costs beyond its bytes at that
//                       rate (the round-end exchange, the ramp-up);
//   stun                fixed + final bytes / final rate, fitted through two
//                       kinds of runs: one whose final round is nearly empty
//                       (the fixed cost: stop, sync, Prepare, Commit) and one
//                       whose final round carries a hot set of megabytes (the
//                       rate a small transfer reaches). The two kinds run on
//                       devices of different sizes, which gives round 0's fit.
// Stored per configuration (PathConfig::Key) in one JSON file beside the
// in-process calibration, so each configuration is measured once per host.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpumigrate/common/launcher.h"
#include "gpumigrate/session/report.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct PathConfig {
  std::string transport = "tls";   // "tls" (PSK TLS 1.3, AES-GCM) or "insecure"
  uint32_t streams = 2;
  std::string codec = "none";      // as CodecChoice::ToString writes it
  double cap_bytes_per_s = 0;      // --bandwidth; 0: uncapped
  // The device backend the runs migrate: "sim" (the default: any device without
  // a calibration of its own) or "proc" (a live process through its shim: its
  // switchover stops, scans, adopts and resumes processes, and moves 4 KiB pages).
  std::string backend = "sim";
  // "tls/2/none/uncapped", "insecure/4/zstd:1/125000000B/s"; a backend other
  // than sim is appended: "tls/2/none/uncapped/proc".
  std::string Key() const;
};

// One measured migration, as its report says (the parts the fit needs).
struct PathRun {
  double round0_bytes = 0, round0_raw_bytes = 0, round0_ms = 0;
  std::vector<std::pair<double, double>> dirty_rounds;  // (bytes, ms) of rounds after round 0
  double final_bytes = 0;
  double stun_ms = 0;
  double final_sync_ms = 0;  // of the stun: the last dirty-log sync (stun_breakdown_ms.final_sync)
  bool small_final = false;  // the kind whose final round is nearly empty
};

struct PathCalibration {
  PathConfig config;
  // Round 0's wire rate past its startup: the fit's, the slowest and fastest run's.
  double bytes_per_s = 0, low_bytes_per_s = 0, high_bytes_per_s = 0;
  double round0_startup_ms = 0;
  double raw_bytes_per_s = 0;  // the same rounds' raw (pre-codec) bytes per second
  double wire_ratio = 1;       // raw / wire bytes of those rounds (1 without a codec)
  double round_overhead_ms = 0;
  // stun = fixed + final / final rate; low, mid and high.
  double fixed_ms = 0, fixed_low_ms = 0, fixed_high_ms = 0;
  double final_bytes_per_s = 0, final_low_bytes_per_s = 0, final_high_bytes_per_s = 0;
  // Of the fixed cost: the calibration device's last dirty-log sync (median).
  // A device whose tracker syncs slower (a hash tracker reads the whole device)
  // pays the difference in its stun.
  double final_sync_ms = 0;
  int runs = 0;
  std::string measured_at;  // UTC, ISO 8601
  std::string method;
};

// The backend whose calibration a device spec takes: "proc" for proc:PID, else "sim".
std::string PathBackendFor(std::string_view device_spec);

// Fits the figures above from runs of both kinds (at least one of each).
Result<PathCalibration> FitPathCalibration(const PathConfig& config, const std::vector<PathRun>& runs);
// Reads a migration report (`migrate --json`) into a PathRun.
Result<PathRun> PathRunFromReport(const std::string& report_json, bool small_final);

// Beside DefaultCalibrationPath(): its name with "-paths" before ".json".
std::string DefaultPathCalibrationFile();
// nullopt when the file has no entry for the configuration; an error when the
// file is damaged (it names the file and what is wrong).
Result<std::optional<PathCalibration>> LoadPathCalibration(const PathConfig& config);
// Adds or replaces the configuration's entry (written to a temporary file and renamed).
Status StorePathCalibration(const PathCalibration& c);

// The switchover rule's fixed cost for a migration on a path: its stored
// calibration's (`estimate` measured it between two processes) when there is
// one, else the in-process calibration's (StoredFixedCost), else `fallback`.
std::chrono::nanoseconds SwitchoverFixedCostFor(const std::optional<PathCalibration>& path,
                                                std::chrono::nanoseconds fallback);

// The programs a calibration runs, and how (engine/estimator/path_runner.cc).
struct PathRunPrograms {
  std::string gpumigrate;        // the binary whose receive and migrate run the migrations
  std::string workload;          // gpumigrate-workload, for a proc backend ("": none)
  std::string workload_missing;  // why there is none, when it is ""
  Launcher* launcher = nullptr;  // null: MakeProcessLauncher()
  std::function<void(const std::string&)> progress;  // a line per step ("calibrating ..."); may be empty
};

// The sim devices a configuration is calibrated on: 512 MiB uncapped, or what
// the cap moves in 1 s (64 to 512 MiB), with a large final round; a quarter of
// that with a nearly empty one. $GPUMIGRATE_PATH_CALIBRATION_SIZE overrides the
// larger size (e.g. for tests).
std::string PathCalibrationDevice(const PathConfig& c, bool large_final);
// A proc backend's runs migrate gpumigrate-workload processes (the shim linked
// in) into adopting ones: the arguments of the two kinds' source (the
// destination adds --adopt).
std::vector<std::string> ProcCalibrationWorkload(const PathConfig& c, bool large_final);

// Four migrations measured now (two of each kind) between two processes on
// loopback, fitted.
Result<PathCalibration> MeasurePath(const PathConfig& c, const PathRunPrograms& programs);
// The stored calibration of `c`, or (none stored, or `force`) MeasurePath's, stored.
Result<PathCalibration> LoadOrMeasurePath(const PathConfig& c, bool force, const PathRunPrograms& programs,
                                          bool* measured_now);
// Adds what a completed migration `r` on `c`'s path measured against `c` to
// the host's record (path_spread.h).
Status RecordAgainstPath(const PathCalibration& c, const MigrationReport& r);

}  // namespace gpumigrate
