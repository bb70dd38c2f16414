// The source half of the QEMU hook (gpumigrate/qemu/qemu.h): QEMU migrates the
// guest's RAM beside the engine's device pre-copy and pauses at pre-switchover
// only when the engine's switchover rule says go.
#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "qemu-plugin/forwarding_device.h"
#include "qemu-plugin/qemu_common.h"

namespace gpumigrate {
namespace {

using Ms = std::chrono::milliseconds;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class QemuSource final : public qemu::Forwarding<QemuGuest> {
 public:
  QemuSource(std::unique_ptr<Device> device, QemuHookOptions options, std::unique_ptr<QmpClient> qmp)
      : Forwarding(std::move(device)), opt_(std::move(options)), qmp_(std::move(qmp)) {
    fig_.side = "source";
  }
  // Whatever the outcome, QEMU keeps its owner's migration settings afterwards
  // (refused by QEMU, harmlessly, while a migration it could not cancel runs).
  ~QemuSource() override { (void)qemu::RestoreMigrationSettings(*qmp_, saved_, opt_.command_timeout); }

  Status Prepare() {
    GM_ASSIGN_OR_RETURN(QmpRunState rs, qmp_->QueryStatus(opt_.command_timeout));
    if (!rs.running) {
      return FailedPrecondition(fmt::format("source QEMU at {} is {}, expected running", opt_.qmp_path, rs.status));
    }
    GM_ASSIGN_OR_RETURN(nlohmann::json mig, qmp_->QueryMigrate(opt_.command_timeout));
    const std::string status = mig.value("status", std::string("none"));
    if (status != "none" && status != "completed" && status != "cancelled" && status != "failed") {
      return FailedPrecondition(fmt::format("source QEMU at {} is already migrating ({})", opt_.qmp_path, status));
    }
    GM_ASSIGN_OR_RETURN(saved_, qemu::SaveMigrationSettings(*qmp_, opt_.command_timeout));
    GM_RETURN_IF_ERROR(qemu::SetHookCapabilities(*qmp_, true, opt_.command_timeout));
    // Held at 0 ms: QEMU pauses for the switchover only once its RAM is fully sent,
    // until the engine raises it (SetState(STOP_COPY)).
    nlohmann::json params = {{"downtime-limit", 0}};
    const double bw = opt_.max_bandwidth_bytes_per_s > 0 ? opt_.max_bandwidth_bytes_per_s : 1e12;
    params["max-bandwidth"] = static_cast<uint64_t>(bw);
    return qmp_->SetMigrationParameters(params, opt_.command_timeout);
  }

  Status SetPeerSetupNote(std::string_view note) override {
    if (note.empty()) {
      return FailedPrecondition("the receiver did not send a QEMU incoming URI: start it with `gpumigrate receive --qemu "
                                "DST.qmp --qemu-incoming tcp:IP:PORT ...`");
    }
    uri_ = std::string(note);
    return Status::Ok();
  }

  // QEMU's RAM migration starts after the device's first round (OnSourcePhase):
  // QEMU 7.2 cannot be held once its RAM is sent, and a QEMU that finished first
  // would stop the guest for the rest of the device's bulk copy.
  void OnSourcePhase(Phase phase, uint32_t round) override {
    (void)round;
    if (phase == Phase::kRoundEnd && !started_ && !failed_) (void)StartRam();  // a failure: start_error_
    if (phase == Phase::kCompleted) MarkResumed();
  }

  bool SwitchNow() override {
    if (!started_ || failed_ || !pause_status_.empty()) return failed_ || !pause_status_.empty();
    (void)qmp_->ReadEvents(Ms(0));
    for (const QmpEvent& e : qmp_->queued_events()) {
      if (e.name != "MIGRATION") continue;
      const std::string s = e.data.value("status", std::string());
      if (s == "pre-switchover") {
        if (!released_) {
          fig_.paused_on_its_own = true;
          Note("qemu: QEMU sent all of the guest's RAM and paused it by itself: switching over now");
        }
        return true;
      }
      if (s == "failed" || s == "cancelled") return failed_ = true;
    }
    return false;
  }

  // The engine's rule says go: release QEMU (downtime-limit = target) and hold
  // the switchover, a round at a time, until QEMU has paused the guest.
  bool MaySwitch() override {
    if (!started_ && !failed_) (void)StartRam();
    if (failed_) return true;  // STOP_COPY reports it and rolls back
    if (!released_) {
      Status s = Release();
      if (!s.ok()) {
        start_error_ = s;
        return failed_ = true;
      }
    }
    if (SwitchNow()) return true;
    if (std::chrono::steady_clock::now() >= converge_deadline_) return true;  // STOP_COPY times out by name
    // Returns as soon as QEMU pauses: every millisecond here is stun.
    auto st = qemu::WaitMigrationStatus(*qmp_, {"pre-switchover", "failed", "cancelled"}, kHoldStep,
                                        "QEMU pausing the guest at pre-switchover");
    if (st.ok()) {
      pause_status_ = *st;
      return true;
    }
    if (st.status().code() != StatusCode::kDeadlineExceeded) {
      start_error_ = st.status().WithContext("source QEMU");
      return failed_ = true;
    }
    auto now = std::chrono::steady_clock::now();
    if (now - last_hold_note_ >= std::chrono::seconds(1)) {
      last_hold_note_ = now;
      if (auto q = qmp_->QueryMigrate(opt_.command_timeout); q.ok() && q->contains("ram")) {
        Note(fmt::format("qemu: device memory converged; QEMU still sending the guest's RAM ({} MiB remaining)",
                         (*q)["ram"].value("remaining", uint64_t{0}) >> 20));
      }
    }
    return false;
  }

  Status SetState(DeviceState next) override {
    const DeviceState cur = inner().State();
    if (next == DeviceState::kStopCopy && cur == DeviceState::kPreCopy) return EnterStopCopy();
    if (next == DeviceState::kRunning && (cur == DeviceState::kPreCopy || cur == DeviceState::kStopCopy)) {
      return RollBack();
    }
    if (next == DeviceState::kRunning && cur == DeviceState::kStop) {
      GM_RETURN_IF_ERROR(inner().SetState(next));
      return GiveGuestBack();
    }
    return inner().SetState(next);
  }

  // The final round's data is all read: QEMU's remaining RAM must have arrived
  // (return-path: "completed" means the destination loaded it) before Prepare.
  Result<std::vector<std::byte>> SaveState() override {
    const auto t0 = std::chrono::steady_clock::now();
    auto st = qemu::WaitMigrationStatus(*qmp_, {"completed", "failed", "cancelled"}, opt_.complete_timeout,
                                        "QEMU finishing the guest's RAM after migrate-continue");
    fig_.ram_finish_wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) return st.status().WithContext("source QEMU");
    if (*st != "completed") {
      return Aborted(fmt::format("source QEMU's migration {}: {}", *st, qemu::MigrationErrorDesc(*qmp_, opt_.command_timeout)));
    }
    return inner().SaveState();
  }

  void MarkResumed() override {
    fig_.resume_unix_s = UnixNow();
    if (fig_.stop_unix_s > 0) fig_.guest_stun_ms = (fig_.resume_unix_s - fig_.stop_unix_s) * 1e3;
  }

  QemuFigures Figures() override {
    qemu::FillFromQuery(*qmp_, opt_.command_timeout, fig_);
    return fig_;
  }

 private:
  void Note(std::string_view line) {
    if (opt_.note) opt_.note(line);
  }

  // The engine's rule said go: let QEMU converge to pre-switchover (vCPUs
  // stopped), then stop the device and let QEMU send the rest of its RAM.
  Status EnterStopCopy() {
    const double asked_unix_s = UnixNow();
    if (!start_error_.ok()) return start_error_;
    if (!started_) GM_RETURN_IF_ERROR(StartRam());
    if (!released_ && fig_.paused_on_its_own) {
      released_at_ = std::chrono::steady_clock::now();
      converge_deadline_ = released_at_ + opt_.converge_timeout;
    } else if (!released_) {
      GM_RETURN_IF_ERROR(Release());
    }
    const auto left = std::chrono::duration_cast<Ms>(converge_deadline_ - std::chrono::steady_clock::now());
    Result<std::string> st = pause_status_;
    if (pause_status_.empty()) {
      st = qemu::WaitMigrationStatus(*qmp_, {"pre-switchover", "failed", "cancelled"}, std::max(left, Ms(1)),
                                     "QEMU pausing the guest at pre-switchover");
    }
    fig_.converge_wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - released_at_).count();
    if (!st.ok() && st.status().code() == StatusCode::kDeadlineExceeded) {
      uint64_t remaining = 0;
      if (auto q = qmp_->QueryMigrate(opt_.command_timeout); q.ok() && q->contains("ram")) {
        remaining = (*q)["ram"].value("remaining", uint64_t{0});
      }
      return Status(StatusCode::kDeadlineExceeded,
                    fmt::format("source QEMU did not pause the guest for the switchover within "
                                "--qemu-converge-timeout ({} s): {} MiB of the guest's RAM still to send",
                                opt_.converge_timeout.count() / 1000, remaining >> 20));
    }
    if (!st.ok()) return st.status().WithContext("source QEMU");
    if (*st != "pre-switchover") {
      return Aborted(fmt::format("source QEMU's migration {} before the switchover: {}", *st,
                                 qemu::MigrationErrorDesc(*qmp_, opt_.command_timeout)));
    }
    paused_ = true;
    for (const QmpEvent& e : qmp_->event_log()) {
      if (e.name == "STOP") fig_.stop_unix_s = static_cast<double>(e.qemu_time.count()) / 1e6;
    }
    // QEMU 7.2 cannot be held once the guest's RAM is fully sent: it may have
    // stopped the vCPUs before the engine asked, and the guest saw that too.
    if (fig_.stop_unix_s > 0 && fig_.stop_unix_s < asked_unix_s) {
      fig_.paused_on_its_own = true;
      fig_.stopped_before_switchover_ms = (asked_unix_s - fig_.stop_unix_s) * 1e3;
    }
    if (auto q = qmp_->QueryMigrate(opt_.command_timeout); q.ok() && q->contains("ram")) {
      fig_.ram_remaining_at_pause_bytes = (*q)["ram"].value("remaining", uint64_t{0});
    }
    GM_RETURN_IF_ERROR(inner().SetState(DeviceState::kStopCopy));
    return qmp_->MigrateContinue("pre-switchover", opt_.command_timeout).WithContext("source QEMU");
  }

  Status StartRam() {
    attempted_ = true;  // a timed-out reply may still have started it: roll back either way
    Status s = qmp_->Migrate(uri_, opt_.command_timeout);
    if (!s.ok()) {
      failed_ = true;
      start_error_ = s.WithContext(fmt::format("source QEMU: migrate to {}", uri_));
      return start_error_;
    }
    started_ = true;
    Note(fmt::format("qemu: source QEMU {} migrating the guest's RAM to {}", qemu::VersionText(qmp_->version()), uri_));
    return Status::Ok();
  }

  Status Release() {
    GM_RETURN_IF_ERROR(qmp_->SetMigrationParameters({{"downtime-limit", opt_.downtime_target.count()}},
                                                    opt_.command_timeout)
                           .WithContext("source QEMU"));
    released_ = true;
    released_at_ = std::chrono::steady_clock::now();
    converge_deadline_ = released_at_ + opt_.converge_timeout;
    Note(fmt::format("qemu: device memory converged; QEMU may pause the guest (downtime-limit {} ms)",
                     opt_.downtime_target.count()));
    return Status::Ok();
  }

  // Before Prepared: the guest must run on here. QEMU still migrating: cancel
  // (it resumes the guest); QEMU done (the final round failed after it): `cont`.
  Status RollBack() {
    Status dev = inner().SetState(DeviceState::kRunning);
    Status guest = attempted_ ? GiveGuestBack() : Status::Ok();
    if (!dev.ok()) return dev;
    return guest;
  }

  Status GiveGuestBack() {
    auto mig = qmp_->QueryMigrate(opt_.command_timeout);
    std::string status = mig.ok() ? mig->value("status", std::string("none")) : "unknown";
    if (status != "completed" && status != "failed" && status != "cancelled" && status != "none") {
      GM_RETURN_IF_ERROR(qmp_->MigrateCancel(opt_.command_timeout).WithContext("source QEMU: migrate_cancel"));
      auto end = qemu::WaitMigrationStatus(*qmp_, {"cancelled", "failed", "completed"}, opt_.command_timeout,
                                           "QEMU cancelling its migration");
      if (!end.ok()) return end.status().WithContext("source QEMU");
      status = *end;
      fig_.rollback = "migrate_cancel";
    }
    GM_ASSIGN_OR_RETURN(QmpRunState rs, qmp_->QueryStatus(opt_.command_timeout));
    if (!rs.running) {
      GM_RETURN_IF_ERROR(qmp_->Cont(opt_.command_timeout).WithContext("source QEMU: cont"));
      fig_.rollback += fig_.rollback.empty() ? "cont" : " + cont";
    }
    Note(fmt::format("qemu: the source guest runs on (QEMU's migration {}{})", status,
                     fig_.rollback.empty() ? "" : ", " + fig_.rollback));
    return Status::Ok();
  }

  QemuHookOptions opt_;
  std::unique_ptr<QmpClient> qmp_;
  static constexpr Ms kHoldStep{100};  // how long MaySwitch waits for QEMU each held round
  std::string uri_;
  bool attempted_ = false, started_ = false, released_ = false, paused_ = false, failed_ = false;
  qemu::MigrationSettings saved_;
  Status start_error_;
  std::string pause_status_;  // QEMU's MIGRATION status that ended MaySwitch's wait (consumed there)
  std::chrono::steady_clock::time_point released_at_{}, converge_deadline_{}, last_hold_note_{};
  QemuFigures fig_;
};

}  // namespace

Result<std::unique_ptr<QemuGuest>> QemuGuest::AttachSource(std::unique_ptr<Device> device, QemuHookOptions options) {
  GM_ASSIGN_OR_RETURN(auto qmp, qemu::ConnectQemu(options, "source"));
  return AttachSource(std::move(device), std::move(options), std::move(qmp));
}

Result<std::unique_ptr<QemuGuest>> QemuGuest::AttachSource(std::unique_ptr<Device> device, QemuHookOptions options,
                                                   std::unique_ptr<QmpClient> qmp) {
  auto guest = std::make_unique<QemuSource>(std::move(device), std::move(options), std::move(qmp));
  GM_RETURN_IF_ERROR(guest->Prepare());
  return std::unique_ptr<QemuGuest>(std::move(guest));
}

}  // namespace gpumigrate
