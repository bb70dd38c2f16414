#include "engine/session/liveness.h"

#include <fmt/format.h>

namespace gpumigrate {
namespace {

double Seconds(Clock::Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

Status ControlWriter::Send(const wire::v1::Envelope& env) {
  std::lock_guard send(send_mu_);
  {
    std::lock_guard lk(state_mu_);
    since_ = clock_.Now();
    sending_ = wire::EnvelopeKind(env);
  }
  Status st = wire::SendEnvelope(*control_, env);
  std::lock_guard lk(state_mu_);
  sending_.clear();
  return st;
}

Clock::Duration ControlWriter::Blocked(std::string* what) const {
  std::lock_guard lk(state_mu_);
  if (sending_.empty()) return Clock::Duration(0);
  if (what) *what = sending_;
  return clock_.Now() - since_;
}

Liveness::Liveness(ControlWriter& writer, Mailbox& box, Clock& clock, Options opt, std::function<uint64_t()> work_done,
                   std::function<void()> on_dead)
    : writer_(writer), box_(box), clock_(clock), opt_(std::move(opt)), work_done_(std::move(work_done)),
      on_dead_(std::move(on_dead)) {
  watchdog_ = std::thread([this] { Watch(); });
}

Liveness::~Liveness() {
  StopQuietly();
  Join();
}

void Liveness::PeerSpeaksKeepalive() {
  if (enabled_.exchange(true)) return;
  box_.EnableLiveness(opt_.progress, opt_.peer);
  std::lock_guard lk(mu_);
  if (!stop_) keepalive_ = std::thread([this] { Beat(); });
}

void Liveness::Doing(std::string activity) {
  steps_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(mu_);
  activity_ = std::move(activity);
}

void Liveness::StopQuietly() {
  std::lock_guard lk(mu_);
  stop_ = true;
  cv_.notify_all();
}

void Liveness::Join() {
  if (watchdog_.joinable()) watchdog_.join();
  std::thread k;
  {
    std::lock_guard lk(mu_);
    k = std::move(keepalive_);
  }
  if (k.joinable()) k.join();
}

bool Liveness::Sleep(std::chrono::milliseconds d) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, d, [this] { return stop_; });
  return !stop_;
}

void Liveness::Beat() {
  auto next = clock_.Now();
  while (true) {
    if (clock_.Now() >= next) {
      wire::v1::Envelope env;
      auto* k = env.mutable_keepalive();
      k->set_progress(work_done_() + steps_.load(std::memory_order_relaxed));
      {
        std::lock_guard lk(mu_);
        if (stop_) return;
        k->set_activity(activity_);
      }
      // A failed write means the stream is broken: the session sees that itself.
      if (!writer_.Send(env).ok()) return;
      next = clock_.Now() + opt_.interval;
    }
    if (!Sleep(kPollInterval)) return;
  }
}

void Liveness::Watch() {
  if (opt_.silence <= Clock::Duration(0)) return;  // off
  while (Sleep(kPollInterval)) {
    Status dead;
    std::string what;
    if (auto silent = box_.SilentFor(); silent && *silent >= opt_.silence) {
      dead = Status(StatusCode::kDeadlineExceeded,
                    fmt::format("{} has been silent for {:.1f} s, not even a keepalive (peer silence timeout {:.0f} "
                                "s): it, or the link to it, is down",
                                opt_.peer, Seconds(*silent), Seconds(opt_.silence)));
    } else if (auto blocked = writer_.Blocked(&what); blocked >= opt_.silence) {
      dead = Status(StatusCode::kDeadlineExceeded,
                    fmt::format("control channel: sending {} has been blocked for {:.1f} s (peer silence timeout {:.0f} "
                                "s): {} is not reading, or the link to it is down",
                                what, Seconds(blocked), Seconds(opt_.silence), opt_.peer));
    }
    if (!dead.ok()) {
      box_.Fail(dead);
      if (on_dead_) on_dead_();
      return;
    }
  }
}

std::unique_ptr<Liveness> SessionLiveness(ControlWriter& writer, Mailbox& box, Clock& clock,
                                          const SessionStreams& streams, Liveness::Options opt,
                                          std::function<uint64_t()> work_done) {
  return std::make_unique<Liveness>(writer, box, clock, std::move(opt), std::move(work_done), [streams] {
    streams.control->Close();
    for (Stream* s : streams.data) s->Close();
  });
}

}  // namespace gpumigrate
