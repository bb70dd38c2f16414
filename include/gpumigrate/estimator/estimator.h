// Stun-time estimator: measure a device without moving anything (a dry run),
// then simulate the pre-copy rounds the engine would run and predict rounds,
// bytes, total time and stun, each with a range, and a decision for automation:
// live-migrate, drain-and-replace, or cannot-converge.
//
// Measurement (ProfileDevice): the device's own dirty tracker is synced every
// `interval` for `sample`; OR-ing 1, 2, 4, ... consecutive syncs gives samples of
// the dirty working-set curve W(t), the bytes dirtied within a window of length
// t, per region. Sampled pages give the non-zero fraction (zero pages are skipped
// in round 0). Nothing is sent.
//
// Model (Predict): round 0 sends the non-zero bytes; round k sends what was
// dirtied during round k-1, W(T_{k-1}); each round lasts bytes / bandwidth. After
// each round the engine's own switchover rule (DecideSwitchover) decides, so the
// prediction and the engine agree. The range comes from running the model with
// the lowest W and highest bandwidth (low) and the highest W and lowest
// bandwidth (high). Pure: no clock, no I/O.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <cstdint>
#include <string>
#include <vector>

#include "gpumigrate/estimator/calibration.h"
#include "gpumigrate/common/clock.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/estimator/path_calibration.h"
#include "gpumigrate/estimator/path_spread.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/estimator/projection.h"
#include "gpumigrate/session/session.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/policy/switchover.h"

namespace gpumigrate {

// W(t) for one region: for each window length, the lowest, median and highest
// bytes dirtied in any observed window of that length.
struct WorkingSetCurve {
  std::vector<double> window_s;
  std::vector<double> low_bytes, mid_bytes, high_bytes;
  enum class Bound { kLow, kMid, kHigh };
  // Piecewise linear between samples, proportional below the first, extended
  // along the last segment's slope beyond the last (the median and low bound
  // at most at the longest window's average rate), capped at `cap_bytes`.
  double Eval(double t_s, Bound b, double cap_bytes) const;
};

struct RegionProfile {
  RegionInfo info;
  double nonzero_fraction = 1.0;   // of pages, sampled
  double compression_ratio = 1.0;  // effective raw / wire bytes the model applies
  CodecSample codecs;              // sampled ratios and speeds of each codec
  std::string codec = "none";      // the codec the model assumes for this region
  WorkingSetCurve dirty;
  // Of its non-zero pages, the share the destination's content store holds
  // (estimate --content-store-hint): offered by SHA-256 in round 0, not sent.
  double held_fraction = 0;
};

struct DeviceProfile {
  std::string device;
  std::vector<RegionProfile> regions;
  uint64_t device_state_bytes = 0;
  double sample_s = 0;
  uint32_t syncs = 0;
  // How long one dirty-log sync of every region took (the median of the dry
  // run's): the switchover's final sync costs as much. A hash tracker reads
  // and hashes the whole device; a bitmap or PAGEMAP_SCAN costs far less.
  double sync_ms = 0;
  // How fast the source reads and SHA-256-hashes pages it offers by digest
  // (MeasureOfferRate; 0 when no region is held): round 0 spends
  // held bytes / this on them, beside sending the rest.
  double offer_bytes_per_s = 0;
};

struct SampleOptions {
  std::chrono::nanoseconds sample = std::chrono::seconds(2);
  std::chrono::nanoseconds interval = std::chrono::milliseconds(10);
  uint32_t pages_sampled_per_region = 512;
  uint32_t codec_sample_bytes = 1 << 20;  // of non-zero pages per region, for the codec ratios
  int codec_level = 1;
};

// Observes `device` (which must be RUNNING and not being migrated) for
// options.sample. Uses and stops the device's dirty tracker.
Result<DeviceProfile> ProfileDevice(Device& device, const SampleOptions& options, Clock& clock);

// Memory another mover sends beside the device over the same link, e.g. a QEMU
// guest's RAM, which QEMU migrates itself while the engine pre-copies the device
// memory (gpumigrate/qemu/qemu.h). What the model does with it (RunModel):
//
//   pre-copy   the device's round 0 (its bulk) has the link alone; the mover's
//              first pass (`bytes`) starts when it ends (the QEMU hook starts QEMU
//              there) and shares the link with the device's dirty rounds: the mover
//              gets `link_share` of it while both send.
//   QEMU 7.2   with its downtime-limit held at 0, QEMU pauses the guest by itself
//              as soon as its first pass is done; the engine then cuts its current
//              round short (switch_now): the rest of that round and what the device
//              dirtied in it go in the final round.
//   otherwise  when the engine's rule says go first, the switchover is held (the
//              device runs further rounds) while the mover, on the whole link,
//              converges (guest running): its backlog, the unsent first pass plus
//              the memory dirtied since it started (dirty rate x elapsed, capped;
//              see dirty_window_s), shrinks at link - dirty rate until it is within
//              downtime_target x link; QEMU sends on for up to 100 ms more (it
//              recomputes that threshold every 100 ms), then the guest stops.
//   stun       the device's final round (about one round's dirtying, at least the
//              hold's 100 ms step) and the mover's remainder share the link: the
//              guest is stopped for (both) / bandwidth + fixed cost.
// `bytes` 0: no such memory; the model is exactly the device-only one.
struct BesideMemory {
  std::string name = "memory beside the device";
  double bytes = 0;                 // the mover's first pass
  double dirty_bytes_per_s = 0;     // unique bytes dirtied per second, measured over one window:
  double dirty_window_s = 0;        // its length; the pessimistic (high) run assumes that window's
                                    // dirty set also for shorter windows (0: rate x t in every run)
  uint64_t page_bytes = 4096;
  double link_share = 0.5;          // the mover's share of the link while the device sends too
};

// The costs a path calibration measured (path_calibration.h), in the model's
// three runs: [0] optimistic, [1] mid, [2] pessimistic. Unset (final rate 0): the
// stun is the engine's own prediction, final bytes / bandwidth + fixed_cost.
struct PathTiming {
  double round0_startup_s = 0;         // added to round 0
  double round_overhead_s = 0;         // added to every round after round 0
  double fixed_ms[3] = {0, 0, 0};
  double final_bytes_per_s[3] = {0, 0, 0};
  // What this device's dirty-log sync costs beyond the calibration device's
  // (DeviceProfile::sync_ms - PathCalibration::final_sync_ms, at least minus the
  // fixed cost): in the stun's final sync and at the start of every later round.
  double sync_extra_ms = 0;
  bool calibrated() const { return final_bytes_per_s[1] > 0; }
};

struct ModelParams {
  double bandwidth_low = 0, bandwidth_mid = 0, bandwidth_high = 0;  // bytes/s
  // What the engine's switchover rule assumes (the migration's --fixed cost as
  // `migrate` loads it); with a PathTiming the predicted stun uses its figures.
  std::chrono::nanoseconds fixed_cost{0};
  PathTiming path;
  std::chrono::nanoseconds downtime_target = kDefaultDowntimeTarget;
  std::chrono::nanoseconds max_stun = kDefaultMaxStun;
  uint32_t max_rounds = kDefaultMaxRounds;
  BesideMemory beside;
  SwitchoverLimits Limits() const { return {downtime_target, max_stun, fixed_cost, max_rounds, false}; }
};

enum class EstimateDecision { kLiveMigrate, kDrainAndReplace, kCannotConverge };
std::string_view EstimateDecisionName(EstimateDecision d);  // "live-migrate", ...

struct PredictedRound {
  uint32_t round = 0;
  double bytes = 0;
  double seconds = 0;
  // Of `seconds`, reading and hashing pages offered by digest: left out of the
  // rounds' bandwidth as the engine leaves RoundReport::offer_ms out.
  double offer_seconds = 0;
};

struct ModelRun {
  std::vector<PredictedRound> rounds;  // pre-copy rounds
  double final_bytes = 0;              // sent during the stun (dirty set + device state)
  double stun_ms = 0;
  double total_ms = 0;                 // pre-copy + stun
  StopReason stop_reason = StopReason::kNone;  // why the rule stopped iterating
  bool switches = false;               // the engine's rule would switch over
  std::string policy_reason;
  // With BesideMemory (else zero): stun_ms and total_ms are the guest's, and
  double device_stun_ms = 0;           // what the engine's rule predicted for the device alone
  double beside_bytes = 0;             // everything the mover sends: first pass, re-sends, remainder
  double beside_final_bytes = 0;       // its remainder, sent during the stun
  double converge_ms = 0;              // engine said go -> the mover paused the guest (guest running)
  // The rounds the engine runs meanwhile, the switchover held (the QEMU hook
  // waits up to its 100 ms hold step for QEMU's pause, then a round sends what
  // was dirtied): the engine's rounds too, beyond `rounds`.
  uint32_t held_rounds = 0;
  // Device only: the stun the engine's rule predicted at each of its decisions
  // (the last one said stop); near the target they decide on timing noise.
  std::vector<double> decision_stun_ms;
  double stopped_before_switchover_ms = 0;  // the mover paused first: guest stopped while the round ends
  bool beside_paused_first = false;    // the mover paused the guest before the engine's rule said go
};

struct Prediction {
  ModelRun mid, low, high;
  // The reported ranges: min and max over the three runs (a larger dirty set can
  // add a round and so end with a smaller stun: the stun is not monotone in W).
  double stun_low_ms = 0, stun_high_ms = 0, total_low_ms = 0, total_high_ms = 0;
  // A decision of the mid run within 20% of the downtime target: the engine may
  // run one round more (or fewer) than predicted. The alternative outcome is
  // modelled too and the ranges include it; mid stays the likely one.
  bool marginal = false;
  std::optional<ModelRun> alternative;
  EstimateDecision decision = EstimateDecision::kLiveMigrate;
  std::string explanation;
};

// `which`: the PathTiming column (0 optimistic, 1 mid, 2 pessimistic).
ModelRun RunModel(const DeviceProfile& profile, const ModelParams& params, WorkingSetCurve::Bound w, double bandwidth,
                  int which = 1);
Prediction Predict(const DeviceProfile& profile, const ModelParams& params);

// Scales a profile to another device size: every region by size/current, and
// (when scale_dirty) every dirty curve by the same factor. The assumptions are
// written to `assumptions`.
DeviceProfile ProjectProfile(const DeviceProfile& profile, uint64_t device_bytes, bool scale_dirty,
                             std::vector<std::string>* assumptions);

// A whole estimate: measure, pick the bandwidth, predict; what `gpumigrate
// estimate` prints and what the probe run compares against.
struct EstimateOptions {
  SampleOptions sample;
  double link_bytes_per_s = 0;  // 0: the calibrated in-process pipeline
  std::string link_text;        // as the user wrote it, for the report
  std::chrono::nanoseconds downtime_target = kDefaultDowntimeTarget;
  std::chrono::nanoseconds max_stun = kDefaultMaxStun;
  uint32_t max_rounds = kDefaultMaxRounds;
  CodecChoice codec;            // what the migration will use
  bool project = false;         // model `workload` instead of the measured device
  WorkloadProjection workload;
  // Set: the bandwidth is the target's pipeline (TargetPipeline) at the link,
  // not this host's calibrated in-process pipeline; target->link_bytes_per_s is
  // link_bytes_per_s.
  std::optional<TargetSpec> target;
  bool recalibrate = false;
  BesideMemory beside;          // bytes 0: none (e.g. `estimate --qemu` sets the guest's RAM)
  // Set (and no target): the rates and costs of the path the migration will take,
  // measured across two processes; else the in-process calibration's.
  std::optional<PathCalibration> path;
  bool path_measured_now = false;
  // Why `path` is not the device's own backend's (e.g. a proc device modelled
  // on the sim path because no workload could be run to calibrate it): an assumption.
  std::string path_note;
  // This host's run-to-run spread against its path calibrations
  // (path_spread.h): the ranges hold it. nullopt: too few migrations recorded.
  std::optional<PathSpread> path_spread;
  // --content-store-hint: region name (or "static": every static region) to
  // the share of its non-zero pages the destination's content store holds.
  std::map<std::string, double> content_store_hint;
};

// Sets each region's held_fraction from a --content-store-hint map; an unknown
// region name is InvalidArgument naming the regions there are.
Status ApplyContentHint(const std::map<std::string, double>& hint, DeviceProfile& profile);
// Reads and SHA-256-hashes up to `max_bytes` of the held regions' pages, as the
// source does for pages it offers: bytes per second.
Result<double> MeasureOfferRate(Device& device, const DeviceProfile& profile, Clock& clock,
                                uint64_t max_bytes = 64ull << 20);

struct EstimateReport {
  DeviceProfile measured;
  DeviceProfile modelled;  // == measured unless projected
  ModelParams params;
  Prediction prediction;
  std::string link_source;
  // The link the prediction assumed, in the CLI's rate syntax ("100Gbit"; the
  // calibrated in-process rate as "NB/s" without --link), and this host's pipeline
  // rate: the JSON's "link" and "pipeline_bytes_per_s", which the planner reads.
  std::string link;
  double pipeline_bytes_per_s = 0;
  std::optional<PipelineBound> pipeline;  // with a target: what bounds the rate
  std::string calibration_path, calibration_time;
  bool calibrated_now = false;
  std::optional<PathCalibration> path;  // the path calibration modelled with, when there was one
  bool path_measured_now = false;
  std::optional<PathSpread> path_spread;  // the host's spread the ranges were widened by
  std::vector<std::string> assumptions;
};

Result<EstimateReport> EstimateDevice(Device& device, const EstimateOptions& options, Clock& clock);
// The model half of EstimateDevice, from a profile already measured: project,
// choose bandwidth and codecs, predict. Pure.
Result<EstimateReport> EstimateFromProfile(const DeviceProfile& measured, const EstimateOptions& options,
                                           const Calibration& calibration);

// `estimate --project-table`: one projection per GPU count and link.
struct ProjectionCell {
  uint32_t gpus = 0;
  double link_bytes_per_s = 0;
  std::string link;  // "100Gbit"
  EstimateReport estimate;
  double stop_and_copy_stun_ms = 0;  // everything non-zero sent during the stun, same link and pipeline
};
struct ProjectionTable {
  std::vector<ProjectionCell> cells;  // gpus-major
  std::vector<std::string> assumptions;  // shared by every cell (those of the largest)
};
// `links` as the CLI writes rates ("25Gbit"). Needs options.project and options.target.
Result<ProjectionTable> ProjectTable(const DeviceProfile& measured, const EstimateOptions& options,
                                     const Calibration& calibration, const std::vector<uint32_t>& gpus,
                                     const std::vector<std::string>& links);
std::string ProjectionTableToJson(const ProjectionTable& t);
std::string EstimateToJson(const EstimateReport& r);

// The path a migration of `device` (its spec) with these flags takes (its
// transport, streams, codec and cap, and the device's backend).
PathConfig PathConfigFor(const std::string& transport, uint32_t streams, const CodecChoice& codec,
                         double cap_bytes_per_s, const std::string& device);
// Sets o.path from the stored path calibration, measuring it first when there is
// none (or o.recalibrate); a projection to a target keeps its own rates. A proc
// device whose backend cannot be calibrated here (no gpumigrate-workload to
// run: programs.workload "") takes the sim path, and o.path_note says so.
Status AttachPathCalibration(const std::string& transport, uint32_t streams, const std::string& device,
                             EstimateOptions& o, const PathRunPrograms& programs);
// The stored calibration of a migration's path: its device's backend's, else
// the sim path's; nullopt when neither is stored. `migrate` takes its fixed
// switchover cost from it and records what it measured against it.
std::optional<PathCalibration> StoredPathFor(const PathConfig& path);

// The probe run's first half (`demo/migrate --dry-run`): estimate from
// observation alone, then make the source's switchover rule use the fixed cost
// the estimate assumed, so prediction and probe decide alike.
Result<EstimateReport> EstimateForProbe(Device& device, const EstimateOptions& options, SourceOptions& source,
                                        Clock& clock);
// The estimate's model run again at the rate the probe's round 0 measured on the
// real link (the estimate's low and high rates scaled alike); nullopt when the
// probe sent no round. The probe feeds what it measured back into the model.
struct ProbeRates {
  double round0_bytes_per_s = 0;
  Prediction prediction;
};
std::optional<ProbeRates> RepredictWithProbe(const EstimateReport& e, const MigrationReport& r);
// A probe's report: the migration report's JSON with the estimate under
// "estimate" and the re-prediction at the probe's rate under "estimate_at_probe_rate".
std::string ProbeReportToJson(const MigrationReport& r, const EstimateReport& e);

}  // namespace gpumigrate
