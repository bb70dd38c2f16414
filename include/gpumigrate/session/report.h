// What a migration reports: outcome, rounds, stun and its breakdown. Field names
// follow the CLI contract in docs/design.md, which automation depends on.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpumigrate/devices/outcome.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/policy/switchover.h"

namespace gpumigrate {

// Where a migration stood when it failed: a step and, for pre-copy, its round.
// Its name ("pre-copy round 3", "switchover: prepare") is for JSON and text only.
enum class Step : uint8_t {
  kNone,
  kConnect,
  kHandshake,
  kPreCopy,
  kStopDevice,
  kFinalSync,
  kFinalData,
  kDeviceState,
  kVerifyFull,
  kPrepare,
  kCommit,
};
struct StepAt {
  Step step = Step::kNone;
  uint32_t round = 0;  // kPreCopy only
  bool operator==(const StepAt&) const = default;
};
std::string StepName(StepAt s);  // "" for kNone
// True for the steps taken while the source device is stopped (stop device ... prepare).
bool IsSwitchoverStep(Step s);

// The stun, phase by phase, in the order they happen. A phase that was not
// reached (a failed migration) or not asked for (verify_full) is empty.
struct StunBreakdown {
  std::optional<double> stop_device_ms, final_sync_ms, final_data_ms, device_state_ms, verify_full_ms,
      prepare_verify_ms, commit_resume_ms;
  // (name, ms) of the phases reached, in order: the JSON and text names.
  std::vector<std::pair<std::string_view, double>> Phases() const;
  size_t size() const { return Phases().size(); }
};

struct RoundReport {
  uint32_t round = 0;
  bool final = false;         // sent during the stun
  uint64_t bytes = 0;         // bytes put on the data streams (headers, payload, tags)
  uint64_t dirty_bytes = 0;   // bytes of the pages this round had to consider
  uint64_t pages_sent = 0;    // pages sent with data
  uint64_t zero_pages = 0;    // pages sent as "now zero" (or skipped as zero in round 0)
  uint64_t known_pages = 0;   // data pages skipped: the destination held them already (a continuation)
  uint64_t raw_bytes = 0;     // bytes of the pages sent with data, before the codec
  uint64_t payload_bytes = 0; // the same pages' bytes as sent, after the codec
  // Content-addressed pre-copy (a destination with a content store): pages
  // offered by SHA-256 instead of their bytes, those of them the destination
  // could not fill (sent with data in the next round), and the time the source
  // spent reading and hashing them (not link time: left out of the round's
  // bandwidth sample, which then measures the pages sent with data, as a round
  // without offers does).
  uint64_t offered_pages = 0;
  uint64_t offer_missed_pages = 0;
  double offer_ms = 0;
  double ms = 0;
  double start_ms = 0;         // when it began, from the session's start (the final round: its data phase)
};

struct MigrationReport {
  Outcome outcome = Outcome::kAborted;
  Status status;              // why, when not completed
  StepAt failed_phase;        // where it failed (kNone when it did not)
  bool verified = false;      // destination digests matched what the source sent
  bool verify_full = false;   // source re-read at stop and compared too
  std::string device;
  uint64_t device_bytes = 0;
  double stun_ms = 0;
  double stun_start_ms = 0;   // when the source stopped, from the session's start (0: it never did)
  StunBreakdown stun_breakdown_ms;
  double total_ms = 0;
  uint64_t bytes_sent = 0;
  // The bandwidth the switchover rule used at its last decision: the rounds'
  // recent average (rounds_bandwidth_bytes_per_s), or the rate the link
  // carried at the end of the last round when that was lower (a link that
  // slowed down late, e.g. shared with a migration that started later).
  double bandwidth_bytes_per_s = 0;
  // The rounds' recent average alone: bytes over time of the last pre-copy
  // rounds, back to at least 64 MiB (RecentBandwidth in gpumigrate/policy/switchover.h).
  double rounds_bandwidth_bytes_per_s = 0;
  std::vector<RoundReport> rounds;
  double predicted_stun_ms = -1;     // at the switchover decision; < 0 when none was made
  std::string switchover_reason;
  // Why pre-copy stopped (the switchover rule's or the in-round link rule's
  // stop; kNone when no rule decided): kLinkTooSlow and kOverBudget abort.
  StopReason stop_reason = StopReason::kNone;
  // A rule aborted the migration because live migration cannot meet the
  // limits here (max stun, the time budget, at the link's rate): drain-and-replace.
  bool drain_recommended = false;
  std::string resolution;            // what an operator must do (in doubt, aborted)
  struct RegionCodec {
    std::string region;
    std::string codec;  // what this region's frames were encoded with
    double sampled_zstd_ratio = 0, sampled_shuffle_ratio = 0, sampled_bf16_ratio = 0;  // auto only
  };
  std::vector<RegionCodec> codecs;
  double compression_ratio = 1;      // raw page bytes / their payload bytes, whole migration
  uint32_t source_workers = 0;       // the source's reading workers (--threads); 0: a destination's report
  // A destination's workers opening and writing frames (receive --threads; 0:
  // each stream's thread did it all); unset in a source's report.
  std::optional<uint32_t> destination_workers;
  struct StreamStat {
    uint32_t stream = 0;
    uint64_t bytes = 0;
    uint64_t frames = 0;
    double bytes_per_s = 0;  // over the whole migration
  };
  std::vector<StreamStat> streams;
  Status source_cleanup;             // the device's SaveCleanup/LoadCleanup hook, when it failed
  // Source, completed and released: whether its memory was zeroed (Device::Scrub),
  // how long that took (outside the stun), and in words what was done or why not.
  bool scrubbed = false;
  double scrub_ms = 0;
  std::string scrub;                 // "" when no scrub was due (not completed, resumed, held)
  // Resumable pre-copy: each time the connection broke before the switchover and
  // the session went on over a new one instead of starting again.
  struct Resumption {
    uint32_t round = 0;          // the pre-copy round the connection broke in
    std::string reason;          // why it broke
    double reconnect_ms = 0;     // from the break to the session going on
    uint64_t saved_bytes = 0;    // bytes in rounds the destination had confirmed: what a restart would resend
    uint64_t resent_bytes = 0;   // page bytes of the unconfirmed round that had to go again
  };
  std::vector<Resumption> resumptions;
  // Content-addressed pre-copy, the whole migration: pages (and their bytes) the
  // destination filled from its content store instead of receiving them, and
  // pages offered by digest (source) or answered (destination). The
  // destination's report also says how big its store's index is.
  uint64_t dedup_pages = 0;
  uint64_t dedup_bytes = 0;
  uint64_t offered_pages = 0;
  uint64_t content_store_pages = 0;  // destination: distinct pages its store indexes
  bool dry_run = false;              // a probe: pre-copied, then aborted on purpose
  bool would_switch = false;         // dry run: the rule would have switched over (else aborted)
};

// One JSON object (a line, no trailing newline) with the CLI contract's keys.
std::string ReportToJson(const MigrationReport& r);

}  // namespace gpumigrate
