// The destination half of the QEMU hook (gpumigrate/qemu/qemu.h): QEMU waits for the
// guest's RAM on the incoming URI, paused (-S); the guest runs only once the
// engine has committed the device memory.
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "qemu-plugin/forwarding_device.h"
#include "qemu-plugin/qemu_common.h"

namespace gpumigrate {
namespace {

using Ms = std::chrono::milliseconds;

class QemuDestination final : public qemu::Forwarding<QemuGuest> {
 public:
  QemuDestination(std::unique_ptr<Device> device, QemuHookOptions options, std::unique_ptr<QmpClient> qmp)
      : Forwarding(std::move(device)), opt_(std::move(options)), qmp_(std::move(qmp)) {
    fig_.side = "destination";
  }

  Status Prepare() {
    if (opt_.incoming_uri.empty()) {
      return InvalidArgument("destination QEMU: no incoming URI (--qemu-incoming tcp:IP:PORT or unix:PATH)");
    }
    GM_ASSIGN_OR_RETURN(QmpRunState rs, qmp_->QueryStatus(opt_.command_timeout));
    if (rs.status != "inmigrate") {
      return FailedPrecondition(fmt::format("destination QEMU at {} is {}, expected inmigrate: start it with "
                                            "-incoming defer -S",
                                            opt_.qmp_path, rs.status));
    }
    if (opt_.require_paused_start) GM_RETURN_IF_ERROR(qemu::CheckStartedPaused(*qmp_));
    GM_ASSIGN_OR_RETURN(saved_, qemu::SaveMigrationSettings(*qmp_, opt_.command_timeout));
    return qemu::SetHookCapabilities(*qmp_, false, opt_.command_timeout);
  }

  Status LoadSetup() override {
    GM_RETURN_IF_ERROR(inner().LoadSetup());
    Status s = qmp_->MigrateIncoming(opt_.incoming_uri, opt_.command_timeout);
    if (!s.ok()) return s.WithContext(fmt::format("destination QEMU: migrate-incoming {}", opt_.incoming_uri));
    listening_ = true;
    if (opt_.note) opt_.note(fmt::format("qemu: destination QEMU {} waits for the guest's RAM on {}",
                                         qemu::VersionText(qmp_->version()), opt_.incoming_uri));
    return Status::Ok();
  }

  std::string SetupNote() const override { return opt_.incoming_uri; }

  Status SetState(DeviceState next) override {
    const DeviceState cur = inner().State();
    if (next == DeviceState::kRunning && cur == DeviceState::kStop) return Run();
    if (next == DeviceState::kError) {
      Status dev = inner().SetState(next);
      Discard();
      return dev;
    }
    return inner().SetState(next);
  }

  QemuFigures Figures() override {
    if (qmp_->connected()) qemu::FillFromQuery(*qmp_, opt_.command_timeout, fig_);
    return fig_;
  }

 private:
  // Commit: QEMU's RAM has arrived (the source saw "completed" before Prepare);
  // the device runs, then the guest.
  Status Run() {
    auto st = qemu::WaitMigrationStatus(*qmp_, {"completed", "failed", "cancelled"}, opt_.complete_timeout,
                                        "the guest's RAM arriving");
    if (!st.ok()) return st.status().WithContext("destination QEMU");
    if (*st != "completed") return Aborted(fmt::format("destination QEMU's incoming migration {}", *st));
    GM_RETURN_IF_ERROR(inner().SetState(DeviceState::kRunning));
    GM_RETURN_IF_ERROR(qmp_->Cont(opt_.command_timeout).WithContext("destination QEMU: cont"));
    auto resume = qmp_->WaitEvent("RESUME", opt_.command_timeout);
    if (resume.ok()) {
      fig_.resume_unix_s = static_cast<double>(resume->qemu_time.count()) / 1e6;
    } else if (auto rs = qmp_->QueryStatus(opt_.command_timeout); !rs.ok() || !rs->running) {
      // Only a guest known not to run may be reported as not running.
      return resume.status().WithContext("destination QEMU: waiting for RESUME after cont");
    }
    // The guest runs here: the settings were for this incoming migration only.
    (void)qemu::RestoreMigrationSettings(*qmp_, saved_, opt_.command_timeout);
    return Status::Ok();
  }

  // The migration was thrown away: this QEMU may hold a complete, paused copy of
  // the guest that must never run beside the source. It is stopped for good.
  void Discard() {
    if (!listening_ || !qmp_->connected()) return;
    auto q = qmp_->Execute("quit", nullptr, opt_.command_timeout);
    fig_.rollback = q.ok() || !qmp_->connected() ? "quit" : "quit failed: " + q.status().message();
    if (opt_.note) opt_.note("qemu: destination QEMU told to quit (the migration was discarded)");
  }

  QemuHookOptions opt_;
  std::unique_ptr<QmpClient> qmp_;
  bool listening_ = false;
  qemu::MigrationSettings saved_;
  QemuFigures fig_;
};

}  // namespace

Result<std::unique_ptr<QemuGuest>> QemuGuest::AttachDestination(std::unique_ptr<Device> device, QemuHookOptions options) {
  GM_ASSIGN_OR_RETURN(auto qmp, qemu::ConnectQemu(options, "destination"));
  return AttachDestination(std::move(device), std::move(options), std::move(qmp));
}

Result<std::unique_ptr<QemuGuest>> QemuGuest::AttachDestination(std::unique_ptr<Device> device, QemuHookOptions options,
                                                   std::unique_ptr<QmpClient> qmp) {
  auto guest = std::make_unique<QemuDestination>(std::move(device), std::move(options), std::move(qmp));
  GM_RETURN_IF_ERROR(guest->Prepare());
  return std::unique_ptr<QemuGuest>(std::move(guest));
}

}  // namespace gpumigrate
