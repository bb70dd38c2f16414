// What both ends of the QEMU hook share: connecting to a QEMU and checking it,
// the migration capabilities, waiting for a MIGRATION status, and QEMU's figures.
#pragma once

#include <chrono>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpumigrate/qemu/qemu.h"
#include "gpumigrate/qemu/qmp.h"

namespace gpumigrate::qemu {

// Connects, names the side in any error ("source QEMU at PATH: ...").
Result<std::unique_ptr<QmpClient>> ConnectQemu(const QemuHookOptions& options, std::string_view side);

// events, return-path, x-ignore-shared (+ pause-before-switchover on the source):
// a QEMU without one of them is refused by name.
Status SetHookCapabilities(QmpClient& qmp, bool source, std::chrono::milliseconds timeout);

// The command line of the process at the other end of the QMP socket has `-S`
// (the destination must not start the guest before the device memory is there).
Status CheckStartedPaused(QmpClient& qmp);

// Waits for a MIGRATION event whose status is one of `statuses`; returns it.
// `what` names the wait in the error. Statuses already seen in the queue count.
Result<std::string> WaitMigrationStatus(QmpClient& qmp, std::initializer_list<std::string_view> statuses,
                                        std::chrono::milliseconds timeout, std::string_view what);

// QEMU's error-desc (query-migrate), or "" when none; never fails.
std::string MigrationErrorDesc(QmpClient& qmp, std::chrono::milliseconds timeout);

// Fills QEMU's RAM figures and status from query-migrate / query-status (best
// effort: a QEMU that went away leaves them as they were).
void FillFromQuery(QmpClient& qmp, std::chrono::milliseconds timeout, QemuFigures& f);

std::string VersionText(const QemuVersion& v);

// The migration capabilities and parameters the hook changes, as they were
// before, so that a QEMU the hook gives back migrates as its owner configured it
// (a leftover x-ignore-shared would silently skip the device memory).
struct MigrationSettings {
  std::vector<std::pair<std::string, bool>> capabilities;
  nlohmann::json parameters = nlohmann::json::object();  // downtime-limit, max-bandwidth
  bool saved = false;
};
Result<MigrationSettings> SaveMigrationSettings(QmpClient& qmp, std::chrono::milliseconds timeout);
// Best effort, never while QEMU migrates (it refuses); says what failed.
Status RestoreMigrationSettings(QmpClient& qmp, MigrationSettings& settings, std::chrono::milliseconds timeout);

}  // namespace gpumigrate::qemu
