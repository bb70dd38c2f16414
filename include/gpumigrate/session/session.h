// Migration sessions: the source side (pre-copy rounds, switchover decision,
// switchover, rollback) and the destination side (apply, verify, commit).
//
//   Source                                   Destination
//   Hello ─────────────────────────────────▶
//         ◀───────────────────────────────── Hello
//   Manifest ──────────────────────────────▶ check the device fits
//         ◀───────────────────────────────── Ready
//   round 0..k: frames on data streams, RoundEnd on control
//   STOP_COPY (stun starts), final sync, final frames, device state
//   Prepare(digests) ──────────────────────▶ wait for every frame, verify digests
//         ◀───────────────────────────────── Prepared
//   Commit ────────────────────────────────▶ device RUNNING
//         ◀───────────────────────────────── Running   (stun ends)
//
// Safety: until the source has Prepared, any failure aborts and the source device
// goes back to RUNNING with its memory untouched while the destination discards
// (device ERROR). After Prepared, a failure leaves both sides stopped with the
// source's state intact: outcome kInDoubt; neither side resumes on its own.
//
// RunSource/RunDestination block until the session ends; streams are borrowed
// and must outlive the call. Both sides close their streams when they fail, so
// the peer learns promptly.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <optional>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpumigrate/common/clock.h"
#include "gpumigrate/codec/codec.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/session/report.h"
#include "gpumigrate/common/stream.h"
#include "gpumigrate/policy/switchover.h"

namespace gpumigrate {

using namespace std::chrono_literals;

// Points a test or a UI can observe. Tests use them to inject faults.
enum class Phase {
  kHandshake,
  kRoundStart,       // before the first frame of a round
  kRoundEnd,         // after a round's RoundEnd was sent
  kSwitchover,       // about to stop the device
  kPrepareSent,
  kPreparedReceived,
  kCommitSent,
  kCompleted,
  // Destination only:
  kPrepareReceived,
  kPreparedSent,
  kCommitReceived,
  // Either side, resumable pre-copy: the connection broke (round = the round it
  // broke in) and a new one is being joined; then the session goes on over it.
  kReconnecting,
  kResumed,
};
std::string_view PhaseName(Phase p);

struct Progress {
  Phase phase = Phase::kHandshake;
  uint32_t round = 0;
  uint64_t round_bytes_total = 0;  // bytes of pages this round must consider
  uint64_t round_bytes_done = 0;
  uint64_t bytes_sent = 0;         // whole session so far
  double elapsed_s = 0;
  // The stun the switchover rule predicted at the last round's end, were the
  // source to switch over then (-1: no round has ended yet). Source only.
  double predicted_stun_ms = -1;
};

// What becomes of the source device once a session has completed (the
// destination confirmed it holds a verified copy). A migration releases it; a
// checkpoint usually lets it run on.
enum class SourceFate {
  kRelease,  // stays stopped and is released: the copy elsewhere runs (migration)
  kResume,   // runs on here (a checkpoint of a live device); the stun ends when it does
  kStop,     // stays stopped with its state intact, released by nobody (an operator decides)
};
std::string_view SourceFateName(SourceFate f);  // "release", "resume", "stop"

// The source's reading workers on a host of `cores` cores when --threads is
// not given: one per core, at most 8 (two 1 MiB chunks in flight each). The
// engine and the estimator's projection (gpumigrate/estimator/projection.h) both use it.
uint32_t DefaultSourceWorkers(uint32_t cores);
// The destination's workers (threads that open, decode and write frames beside
// each data stream's receiving thread) on a host of `cores` cores receiving
// `streams` data streams, when receive --threads is not given: the cores the
// streams' threads leave, at most 8; none where they leave none (each stream's
// thread then does it all). The engine and the projection both use it.
uint32_t DefaultDestinationWorkers(uint32_t cores, uint32_t streams);

// Carries on a session whose earlier part went to the same destination before
// (an incremental checkpoint after its base): the destination already holds what
// that part sent, so round 0 sends only pages whose hash differs from it, and
// rounds and frame sequence numbers go on from where it ended. The session id
// (SourceOptions::session_id) must be the earlier part's.
struct SessionContinuation {
  uint32_t first_round = 0;
  std::vector<uint64_t> frames_per_stream;             // sequence numbers go on from these
  std::vector<std::vector<uint64_t>> page_hashes;      // per region (Regions() order), per page (HashPage)
};

// Resumable pre-copy: a new connection of the same session, joined after the
// old one broke (the transport proved it is the same peer). Streams are
// borrowed: the caller keeps them alive until the session returns.
struct Reconnected {
  SessionStreams streams;
  std::optional<std::array<std::byte, 32>> aes_key;  // the new connection's data key (TLS); unset: integrity only
};
// Joins that connection within `window` (the source connects, the destination
// accepts), or says why it could not.
using Reconnect = std::function<Result<Reconnected>(std::chrono::nanoseconds window)>;

// The data streams a migration opens by default: one per core (at least 2, at
// most 8), each with its own sending thread.
inline uint32_t DefaultStreams() {
  const unsigned n = std::thread::hardware_concurrency();
  return n < 2 ? 2 : (n > 8 ? 8 : n);
}

struct SourceOptions {
  // Switch over when the predicted stun is within downtime_target; when not
  // converging, switch if within max_stun, else abort.
  std::chrono::nanoseconds downtime_target = kDefaultDowntimeTarget;
  std::chrono::nanoseconds max_stun = kDefaultMaxStun;
  // The whole migration's time budget (0: none): aborted within a round once
  // even the best case at the link's measured rate would end after it.
  std::chrono::nanoseconds max_total{0};
  uint32_t max_rounds = kDefaultMaxRounds;
  std::chrono::nanoseconds switchover_fixed_cost = 2ms;  // round trips and device stop/resume, assumed
  double bandwidth_limit_bytes_per_s = 0;            // 0: unlimited
  // Set: the cap follows what this holds (bytes/s, 0: unlimited), read before
  // every frame, so whoever paces this migration (the agent, for an evacuation's
  // controller) can change it while it runs. Borrowed.
  const std::atomic<double>* bandwidth_now = nullptr;
  uint32_t max_frame_payload_bytes = 1 << 20;
  // Threads that read the device, hash its pages and compress them (0:
  // DefaultSourceWorkers of this host's cores); frames are sealed by one
  // thread per data stream.
  uint32_t workers = 0;
  // Payload codec; `auto` samples each region and compresses only where it pays
  // on a link capped by bandwidth_limit_bytes_per_s (unlimited: no compression).
  CodecChoice codec;
  bool verify_full = false;                          // re-read the source at stop and compare (lengthens the stun)
  // When rounds stop shrinking and the stun would exceed max_stun: switch anyway
  // (true) or abort and recommend drain-and-replace (false).
  bool switch_when_not_converging = false;
  // Probe: pre-copy for real until the switchover decision, then abort cleanly
  // (the source never stops; the destination discards) and report the rounds.
  bool dry_run = false;
  // Liveness. With a destination that sends keepalives (every build since they
  // came), a wait on it ends only when it has made no progress for peer_timeout
  // (a slow destination that gets work done is never cut off), and the session
  // fails when nothing at all, not even a keepalive, has come for
  // peer_silence_timeout (a dead peer or link), or a control write has been
  // blocked that long. Without keepalives: peer_timeout for each reply.
  std::chrono::nanoseconds peer_timeout = 60s;
  std::chrono::nanoseconds peer_silence_timeout = 10s;
  std::chrono::nanoseconds keepalive_interval = 1s;  // ours; the peer is timed by its own
  uint64_t session_id = 0;                           // 0: pick a random one
  // Set (by the TLS transport, from its exporter): data frames are encrypted with
  // AES-256-GCM. Unset: integrity-only tags (in process, --insecure-no-tls).
  std::optional<std::array<std::byte, 32>> aes_key;
  const std::atomic<bool>* cancel = nullptr;         // set to abort (Ctrl-C); borrowed
  std::function<void(const Progress&)> on_progress;  // called from the session thread, rate-limited
  std::function<void(Phase, uint32_t round)> on_phase;
  // Asked after each page run of a pre-copy round (and after each round); true
  // cuts the round short and switches over at once, whatever the rule says (the
  // QEMU hook: QEMU paused the guest for the switchover by itself). Pages the cut
  // round did not send go in the final round. Must be cheap (it polls).
  std::function<bool()> switch_now;
  // Asked when the rule says switch over; false runs another pre-copy round
  // instead (not counted toward max_rounds): the QEMU hook holds the switchover
  // until QEMU has paused the guest. May wait a little (it paces those rounds).
  std::function<bool()> may_switch;
  Clock* clock = nullptr;                            // timeouts and measurements; nullptr: SystemClock(). Borrowed
  // Stop the device at once and copy everything during the stun (no pre-copy).
  bool stop_and_copy = false;
  SourceFate fate = SourceFate::kRelease;            // after a completed session
  // A released source's memory is zeroed after the migration (Device::Scrub);
  // false (--no-scrub) when the device is destroyed anyway.
  bool scrub = true;
  // Offer pages by SHA-256 to a destination with a content store (its Hello
  // lists `content-store`) in pre-copy rounds, sending the bytes only of those
  // it cannot fill; the offer backs off in regions where it does not fill.
  // false (--no-content-offer): every page is sent.
  bool content_offer = true;
  std::optional<SessionContinuation> continuation;
  // Called once every page is sent, just before Prepare, with the hash of each
  // page the destination now holds (per region, Regions() order): what a later
  // continuation starts from. An error aborts the session (rolled back).
  std::function<Status(const std::vector<std::vector<uint64_t>>& page_hashes)> before_prepare;
  // Resumable pre-copy. Set, and the destination's Hello lists `resume`: when the
  // connection breaks before the switchover (a reset, a silent link; not an
  // Abort, a device error or a cancel), the device keeps running and its
  // tracking going, `reconnect` joins a new connection within resume_window,
  // and pre-copy goes on with what the destination had not confirmed plus what
  // was dirtied since. At most max_resumes times; a device whose state is one
  // stream (VFIO) cannot resume. After STOP_COPY the rules above stand.
  Reconnect reconnect;
  std::chrono::nanoseconds resume_window = 60s;
  uint32_t max_resumes = 10;

  SwitchoverLimits Limits() const {
    return {downtime_target, max_stun, switchover_fixed_cost, max_rounds, switch_when_not_converging, max_total};
  }
};

struct DestinationOptions {
  // Liveness, as SourceOptions says, toward the source.
  std::chrono::nanoseconds peer_timeout = 60s;
  std::chrono::nanoseconds peer_silence_timeout = 10s;
  std::chrono::nanoseconds keepalive_interval = 1s;
  // Set: only AES-256-GCM frames under this key are accepted (a manifest asking
  // for anything weaker is refused). Unset: integrity-only frames.
  std::optional<std::array<std::byte, 32>> aes_key;
  const std::atomic<bool>* cancel = nullptr;
  std::function<void(Phase, uint32_t round)> on_phase;
  // The destination's progress, about 4 times a second while it waits for the
  // source: Progress::bytes_sent holds the bytes applied to the device so far.
  std::function<void(const Progress&)> on_progress;
  Clock* clock = nullptr;                            // nullptr: SystemClock(). Borrowed
  // Resumable pre-copy: set, and the source's Hello lists `resume`: when the
  // connection breaks before Prepare, the device stays RESUMING with what it
  // applied and `reaccept` waits resume_window for the source's new connection
  // (the transport checks it proves the same session) before discarding.
  Reconnect reaccept;
  std::chrono::nanoseconds resume_window = 60s;
  // A directory of files this destination's tenant already holds (weights,
  // region dumps): pages the source offers by SHA-256 are filled from it rather
  // than sent (gpumigrate/content/content_store.h). Empty: none; the source is not told
  // there is one and sends every page.
  std::string content_store_dir;
  // Threads that open, decode and write frames beside each data stream's
  // receiving thread (receive --threads). Unset: DefaultDestinationWorkers of
  // this host's cores and the session's streams; 0: each stream's thread does it all.
  std::optional<uint32_t> workers;
};

MigrationReport RunSource(Device& device, const SessionStreams& streams, const SourceOptions& options);
MigrationReport RunDestination(Device& device, const SessionStreams& streams, const DestinationOptions& options);

}  // namespace gpumigrate
