// Liveness: what bounds every wait of a session on its peer.
//
// ControlWriter serializes the control-stream writes of a session (its own
// thread and the keepalive thread) and records when a write began, so a write
// that blocks (a peer that stopped reading, a link that swallows packets) is
// seen while it blocks.
//
// Liveness runs two threads for one side of a session:
//  - keepalive: once the peer's Hello listed `keepalive`, sends a Keepalive
//    every `interval` carrying this side's progress (a count that grows while
//    work gets done) and the step it is in;
//  - watchdog: fails the session (Mailbox::Fail, then on_dead, which closes the
//    streams so every blocked read and write returns) when the peer has been
//    silent for `silence` (with keepalives: nothing heard, not even a
//    keepalive), or when one control write has been blocked for `silence`.
//
// The rule that results, with a peer that sends keepalives:
//   dead peer or dead link   detected within silence + interval
//   live but stuck peer      detected within the progress timeout (Mailbox)
//   slow but live peer       never cut off while its progress moves
// Without keepalives (a peer from before them) waits keep their per-reply
// deadlines, and a blocked control write is still bounded.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "engine/session/mailbox.h"
#include "gpumigrate/common/clock.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate {

class ControlWriter {
 public:
  ControlWriter(Stream* control, Clock& clock) : control_(control), clock_(clock) {}
  // Sends one envelope; waits for a write in progress on another thread first.
  Status Send(const wire::v1::Envelope& env);
  // How long the write in progress has been blocked (0 when none), and what it sends.
  Clock::Duration Blocked(std::string* what) const;

 private:
  Stream* control_;
  Clock& clock_;
  std::mutex send_mu_;            // one write at a time
  mutable std::mutex state_mu_;   // guards the two below
  Clock::TimePoint since_{};
  std::string sending_;           // empty: no write in progress
};

class Liveness {
 public:
  struct Options {
    Clock::Duration interval = std::chrono::seconds(1);
    Clock::Duration silence = std::chrono::seconds(10);
    Clock::Duration progress = std::chrono::seconds(60);  // the peer timeout (Mailbox::EnableLiveness)
    std::string peer = "the peer";                        // in errors: "the destination"
  };
  // `work_done` is read from the keepalive thread: it must be thread-safe and
  // only grow. `on_dead` runs on the watchdog thread, once.
  Liveness(ControlWriter& writer, Mailbox& box, Clock& clock, Options opt, std::function<uint64_t()> work_done,
           std::function<void()> on_dead);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // The peer's Hello listed `keepalive`: start sending ours and hold it to its own.
  void PeerSpeaksKeepalive();
  bool peer_speaks_keepalive() const { return enabled_.load(); }
  // This side entered a step: progress, and what keepalives say it is doing.
  void Doing(std::string activity);
  // Work done that the byte count does not show (pages read, hashed).
  void Worked(uint64_t amount) { steps_.fetch_add(amount, std::memory_order_relaxed); }
  // Stops both threads. A keepalive write blocked on a stream returns once the
  // owner closes it: close the streams between StopQuietly() and Join().
  void StopQuietly();
  void Join();

 private:
  void Beat();
  void Watch();
  // Sleeps up to `d` of real time or until stopped; false when stopped.
  bool Sleep(std::chrono::milliseconds d);

  ControlWriter& writer_;
  Mailbox& box_;
  Clock& clock_;
  const Options opt_;
  std::function<uint64_t()> work_done_;
  std::function<void()> on_dead_;
  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> steps_{0};  // steps entered and Worked() amounts
  std::mutex mu_;  // guards activity_, stop_
  std::condition_variable cv_;
  std::string activity_;
  bool stop_ = false;
  std::thread watchdog_, keepalive_;
};

// The limits of SourceOptions or DestinationOptions; `peer` names the other side.
template <typename SessionOptions>
Liveness::Options LivenessOf(const SessionOptions& o, std::string peer) {
  return {.interval = o.keepalive_interval, .silence = o.peer_silence_timeout, .progress = o.peer_timeout,
          .peer = std::move(peer)};
}

// One side's liveness in a session: a dead peer closes every stream of it, which
// ends every blocked read and write; the session thread then fails with the
// watchdog's reason (the mailbox's first failure).
std::unique_ptr<Liveness> SessionLiveness(ControlWriter& writer, Mailbox& box, Clock& clock,
                                          const SessionStreams& streams, Liveness::Options opt,
                                          std::function<uint64_t()> work_done);

}  // namespace gpumigrate
