// Mailbox: control messages read by a background thread, handed to the session
// thread with deadlines, plus the first failure of any helper thread (control
// reader, data receivers). A session waits on one place for "the next message,
// or the reason there will be none".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "gpumigrate/clock.h"
#include "gpumigrate/status.h"
#include "gpumigrate/stream.h"
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

  // Wakes waiters so they can re-check a condition of their own (e.g. frame counts).
  void Notify() {
    std::lock_guard lk(mu_);
    cv_.notify_all();
  }

  // Next message, or the recorded failure, or kDeadlineExceeded, or kAborted when
  // `cancel` becomes true.
  Result<wire::v1::Envelope> Next(Clock::TimePoint deadline, const std::atomic<bool>* cancel,
                                  const char* waiting_for) {
    std::unique_lock lk(mu_);
    while (true) {
      if (!queue_.empty()) {
        auto env = std::move(queue_.front());
        queue_.pop_front();
        return env;
      }
      GM_RETURN_IF_ERROR(Stopped(deadline, cancel, waiting_for));
      WaitALittle(lk, deadline);
    }
  }

  // Waits until pred() holds (checked under no lock of ours), a failure is
  // recorded, the deadline passes or `cancel` is set.
  Status WaitFor(const std::function<bool()>& pred, Clock::TimePoint deadline, const std::atomic<bool>* cancel,
                 const char* waiting_for) {
    std::unique_lock lk(mu_);
    while (!pred()) {
      GM_RETURN_IF_ERROR(Stopped(deadline, cancel, waiting_for));
      WaitALittle(lk, deadline);
    }
    return Status::Ok();
  }

  Clock& clock() { return clock_; }

 private:
  // Why a wait must end now (a failure, cancel, the deadline), or Ok. Under mu_.
  Status Stopped(Clock::TimePoint deadline, const std::atomic<bool>* cancel, const char* waiting_for) const {
    if (!failure_.ok()) return failure_;
    if (cancel && cancel->load()) return Aborted(std::string("cancelled while waiting for ") + waiting_for);
    if (clock_.Now() >= deadline) {
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
  std::deque<wire::v1::Envelope> queue_;
  Status failure_;
  bool reader_done_ = false;
};

// Reads envelopes from `control` into `box` until the stream fails. An Abort from
// the peer is queued like any message and also reported through on_abort (from
// the reader thread) so the session can stop sending at once.
class ControlReader {
 public:
  ControlReader(Stream* control, Mailbox* box, std::function<void(const wire::v1::Abort&)> on_abort)
      : thread_([this, control, box, on_abort = std::move(on_abort)] {
          while (!stop_.load()) {
            auto env = wire::RecvEnvelope(*control);
            if (!env.ok()) {
              if (!stop_.load()) box->Fail(env.status());
              box->ReaderDone();
              return;
            }
            if (env->has_abort() && on_abort) on_abort(env->abort());
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
