// Mailbox: control messages read by a background thread, handed to the session
// thread with deadlines, plus the first failure of any helper thread (control
// reader, data receivers, the liveness watchdog). A session waits on one place
// for "the next message, or the reason there will be none".
//
// Deadlines: without liveness (a peer that sends no keepalives) a wait ends at
// the deadline its caller gives. With liveness (EnableLiveness, once the peer's
// Hello listed `keepalive`) the peer is not timed per reply but by its progress:
// a wait ends only once the peer has reported no progress for the progress
// timeout (and not before the caller's deadline), so a slow peer that gets work
// done is never cut off. Silence (no keepalive at all) is the watchdog's to
// catch (engine/session/liveness.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "gpumigrate/common/clock.h"
#include "gpumigrate/common/status.h"
#include "gpumigrate/common/stream.h"
#include "transport/wire/control_channel.h"

namespace gpumigrate {

class Mailbox {
 public:
  // Deadlines are on `clock` (borrowed; outlives the mailbox).
  explicit Mailbox(Clock& clock) : clock_(clock) {}

  void Post(wire::v1::Envelope env) {
    std::lock_guard lk(mu_);
    queue_.push_back(std::move(env));
    cv_.notify_all();
  }

  // Records a failure; the first one wins. Messages already queued are still delivered.
  void Fail(Status s) {
    std::lock_guard lk(mu_);
    if (failure_.ok()) failure_ = std::move(s);
    cv_.notify_all();
  }

  Status failure() const {
    std::lock_guard lk(mu_);
    return failure_;
  }

  // The peer sends keepalives from now on: hold it to its progress (see above).
  // `peer` names it in errors ("the destination").
  void EnableLiveness(Clock::Duration progress_timeout, std::string peer) {
    std::lock_guard lk(mu_);
    progress_timeout_ = progress_timeout;
    peer_ = std::move(peer);
    last_heard_ = last_progress_ = clock_.Now();
    cv_.notify_all();
  }

  // From the control reader, for every envelope: the peer is alive. A protocol
  // message is progress; a Keepalive is when its count moved, and says what the
  // peer is doing.
  void Heard(const wire::v1::Envelope& env) {
    std::lock_guard lk(mu_);
    last_heard_ = clock_.Now();
    if (!env.has_keepalive()) {
      last_progress_ = last_heard_;
      return;
    }
    if (!heard_keepalive_ || env.keepalive().progress() != peer_progress_) last_progress_ = last_heard_;
    heard_keepalive_ = true;
    peer_progress_ = env.keepalive().progress();
    peer_activity_ = env.keepalive().activity().substr(0, 200);
  }

  // The peer's data arrived and was applied: it is alive and its work shows.
  void PeerProgressed() {
    std::lock_guard lk(mu_);
    last_heard_ = last_progress_ = clock_.Now();
  }

  // Time since anything was heard from the peer; nullopt before EnableLiveness.
  std::optional<Clock::Duration> SilentFor() const {
    std::lock_guard lk(mu_);
    if (!progress_timeout_) return std::nullopt;
    return clock_.Now() - last_heard_;
  }

  // The control reader has stopped: no further message will come.
  void ReaderDone() {
    std::lock_guard lk(mu_);
    reader_done_ = true;
    cv_.notify_all();
  }

  // After a local failure: the peer's Abort if one is queued or arrives before
  // the reader stops or `deadline` passes. A peer that aborts sends Abort before
  // it closes its streams, so a broken stream is often only the echo of it.
  std::optional<wire::v1::Abort> PeerAbort(Clock::TimePoint deadline) {
    std::unique_lock lk(mu_);
    while (true) {
      for (const auto& env : queue_) {
        if (env.has_abort()) return env.abort();
      }
      if (reader_done_ || clock_.Now() >= deadline) return std::nullopt;
      WaitALittle(lk, deadline);
    }
  }

  // Wakes a WaitFor so it can re-check its condition (e.g. frame counts). Called
  // for every frame received: it wakes nobody unless a WaitFor waits (a wake-up
  // per frame of a session thread waiting for its next message cost a futex
  // call and a context switch per page on small frames).
  void Notify() {
    std::lock_guard lk(mu_);
    if (pred_waiters_ > 0) cv_.notify_all();
  }

  // Next message, or the recorded failure, or kDeadlineExceeded, or kAborted when
  // `cancel` becomes true. `hard_deadline`: the deadline holds even with liveness
  // (a wait that is not on the peer's work, e.g. for it to close).
  // `while_waiting` (borrowed; may be null) is called after each wake-up of the
  // wait (a poll, every kPollInterval, or a notification), under no lock of the
  // mailbox's: an error from it ends the wait and is returned. It throttles
  // itself.
  Result<wire::v1::Envelope> Next(Clock::TimePoint deadline, const std::atomic<bool>* cancel,
                                  const char* waiting_for, bool hard_deadline = false,
                                  const std::function<Status()>* while_waiting = nullptr) {
    std::unique_lock lk(mu_);
    while (true) {
      if (!queue_.empty()) {
        auto env = std::move(queue_.front());
        queue_.pop_front();
        return env;
      }
      GM_RETURN_IF_ERROR(Stopped(deadline, cancel, waiting_for, hard_deadline));
      WaitALittle(lk, deadline);
      if (while_waiting != nullptr && *while_waiting && queue_.empty()) {
        lk.unlock();
        Status st = (*while_waiting)();
        lk.lock();
        GM_RETURN_IF_ERROR(st);
      }
    }
  }

  // Waits until pred() holds (checked under no lock of ours), a failure is
  // recorded, the deadline passes or `cancel` is set.
  Status WaitFor(const std::function<bool()>& pred, Clock::TimePoint deadline, const std::atomic<bool>* cancel,
                 const char* waiting_for) {
    std::unique_lock lk(mu_);
    ++pred_waiters_;
    struct Done {
      int& n;
      ~Done() { --n; }  // mu_ is held whenever this runs
    } done{pred_waiters_};
    while (!pred()) {
      GM_RETURN_IF_ERROR(Stopped(deadline, cancel, waiting_for));
      WaitALittle(lk, deadline);
    }
    return Status::Ok();
  }

  Clock& clock() { return clock_; }

 private:
  // Why a wait must end now (a failure, cancel, the deadline), or Ok. Under mu_.
  Status Stopped(Clock::TimePoint deadline, const std::atomic<bool>* cancel, const char* waiting_for,
                 bool hard_deadline = false) const {
    if (!failure_.ok()) return failure_;
    if (cancel && cancel->load()) return Aborted(std::string("cancelled while waiting for ") + waiting_for);
    const auto now = clock_.Now();
    if (progress_timeout_ && !hard_deadline) {
      if (now < deadline || now < last_progress_ + *progress_timeout_) return Status::Ok();
      const double limit_s = std::chrono::duration<double>(*progress_timeout_).count();
      if (now - last_heard_ >= *progress_timeout_) {
        return Status(StatusCode::kDeadlineExceeded,
                      fmt::format("timed out waiting for {}: nothing came from {} for {:.1f} s (peer timeout {:.0f} s)",
                                  waiting_for, peer_, std::chrono::duration<double>(now - last_heard_).count(),
                                  limit_s));
      }
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("timed out waiting for {}: {} is alive but made no progress for {:.1f} s (peer "
                                "timeout {:.0f} s; its last keepalive said: {})",
                                waiting_for, peer_, std::chrono::duration<double>(now - last_progress_).count(),
                                limit_s, peer_activity_.empty() ? "nothing" : peer_activity_));
    }
    if (now >= deadline) {
      return Status(StatusCode::kDeadlineExceeded, std::string("timed out waiting for ") + waiting_for);
    }
    return Status::Ok();
  }
  // Sleeps until notified, the deadline, or kPollInterval of real time: the
  // clock may be a fake one that another thread moves.
  void WaitALittle(std::unique_lock<std::mutex>& lk, Clock::TimePoint deadline) {
    auto left = deadline - clock_.Now();
    cv_.wait_for(lk, std::min<Clock::Duration>(std::max<Clock::Duration>(left, Clock::Duration(0)), kPollInterval));
  }

  Clock& clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int pred_waiters_ = 0;  // under mu_: threads in WaitFor (what Notify wakes)
  std::deque<wire::v1::Envelope> queue_;
  Status failure_;
  bool reader_done_ = false;
  // Liveness (unset: off).
  std::optional<Clock::Duration> progress_timeout_;
  std::string peer_;
  Clock::TimePoint last_heard_{}, last_progress_{};
  bool heard_keepalive_ = false;
  uint64_t peer_progress_ = 0;
  std::string peer_activity_;
};

// Reads envelopes from `control` into `box` until the stream fails. Keepalives
// only tell the mailbox the peer lives (Heard). An Abort from the peer is queued
// like any message and also reported through on_abort (from
// the reader thread) so the session can stop sending at once.
class ControlReader {
 public:
  // `consume`, when set, sees every message first (on this thread) and returns
  // true for one it has handled (it is then not queued); an error it returns
  // fails the mailbox.
  using Consume = std::function<Result<bool>(const wire::v1::Envelope&)>;
  ControlReader(Stream* control, Mailbox* box, std::function<void(const wire::v1::Abort&)> on_abort,
                Consume consume = nullptr)
      : thread_([this, control, box, on_abort = std::move(on_abort), consume = std::move(consume)] {
          while (!stop_.load()) {
            auto env = wire::RecvEnvelope(*control);
            if (!env.ok()) {
              if (!stop_.load()) box->Fail(env.status());
              box->ReaderDone();
              return;
            }
            box->Heard(*env);
            if (env->has_keepalive()) continue;  // liveness only: never queued
            if (env->has_abort() && on_abort) on_abort(env->abort());
            if (consume) {
              Result<bool> used = consume(*env);
              if (!used.ok()) {
                box->Fail(used.status());
                box->ReaderDone();
                return;
              }
              if (*used) continue;
            }
            box->Post(std::move(env).value());
          }
          box->ReaderDone();  // stopped before (or between) reads: no message will come either
        }) {}
  // The owner must close the control stream before destroying the reader.
  ~ControlReader() {
    stop_ = true;
    thread_.join();
  }
  void StopQuietly() { stop_ = true; }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gpumigrate
