#include "qemu-plugin/qemu_common.h"

#include <fstream>
#include <iterator>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace gpumigrate::qemu {

std::string VersionText(const QemuVersion& v) { return fmt::format("{}.{}.{}", v.major, v.minor, v.micro); }

Result<std::unique_ptr<QmpClient>> ConnectQemu(const QemuHookOptions& options, std::string_view side) {
  if (options.qmp_path.empty()) return InvalidArgument(fmt::format("{} QEMU: no QMP socket path given", side));
  QmpOptions qo;
  qo.connect_timeout = options.command_timeout;
  auto qmp = QmpClient::Connect(options.qmp_path, qo);
  if (!qmp.ok()) return qmp.status().WithContext(fmt::format("{} QEMU at {}", side, options.qmp_path));
  const QemuVersion& v = (*qmp)->version();
  if (v.major < 7) {
    return FailedPrecondition(fmt::format("{} QEMU at {} is {}: the hook needs QEMU 7.0 or newer", side,
                                          options.qmp_path, VersionText(v)));
  }
  return qmp;
}

Status SetHookCapabilities(QmpClient& qmp, bool source, std::chrono::milliseconds timeout) {
  std::vector<std::pair<std::string, bool>> caps = {{"events", true}, {"return-path", true}, {"x-ignore-shared", true}};
  if (source) caps.emplace_back("pause-before-switchover", true);
  Status s = qmp.SetMigrationCapabilities(caps, timeout);
  if (!s.ok()) {
    return s.WithContext(fmt::format("QEMU {} at {} cannot take the migration capabilities the hook needs "
                                     "(events, return-path, x-ignore-shared{})",
                                     VersionText(qmp.version()), qmp.socket_path(),
                                     source ? ", pause-before-switchover" : ""));
  }
  return Status::Ok();
}

Status CheckStartedPaused(QmpClient& qmp) {
  const int pid = qmp.peer_pid();
  if (pid <= 0) return FailedPrecondition(fmt::format("QEMU at {}: cannot tell which process serves it", qmp.socket_path()));
  std::ifstream in(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && all.empty()) {
    return FailedPrecondition(fmt::format("QEMU at {} (pid {}): cannot read its command line", qmp.socket_path(), pid));
  }
  size_t at = 0;
  while (at < all.size()) {
    const size_t end = all.find('\0', at);
    if (all.compare(at, end - at, "-S") == 0) return Status::Ok();
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return FailedPrecondition(fmt::format(
      "destination QEMU at {} (pid {}) was started without -S: it would run the guest as soon as its RAM arrived, "
      "before the device memory; start it with -incoming defer -S",
      qmp.socket_path(), pid));
}

Result<std::string> WaitMigrationStatus(QmpClient& qmp, std::initializer_list<std::string_view> statuses,
                                        std::chrono::milliseconds timeout, std::string_view what) {
  auto ev = qmp.WaitEvent(
      [&](const QmpEvent& e) {
        if (e.name != "MIGRATION" || !e.data.contains("status") || !e.data["status"].is_string()) return false;
        const std::string s = e.data["status"].get<std::string>();
        for (std::string_view want : statuses) {
          if (s == want) return true;
        }
        return false;
      },
      timeout, what);
  if (!ev.ok()) return ev.status();
  return ev->data["status"].get<std::string>();
}

std::string MigrationErrorDesc(QmpClient& qmp, std::chrono::milliseconds timeout) {
  auto q = qmp.QueryMigrate(timeout);
  if (!q.ok() || !q->is_object() || !q->contains("error-desc")) return "";
  return (*q)["error-desc"].is_string() ? (*q)["error-desc"].get<std::string>() : "";
}

void FillFromQuery(QmpClient& qmp, std::chrono::milliseconds timeout, QemuFigures& f) {
  f.qemu_version = VersionText(qmp.version());
  if (auto q = qmp.QueryMigrate(timeout); q.ok() && q->is_object()) {
    const auto& j = *q;
    if (j.contains("status")) f.migration_status = j["status"].get<std::string>();
    if (j.contains("downtime")) f.qemu_downtime_ms = j["downtime"].get<double>();
    if (j.contains("total-time")) f.qemu_total_ms = j["total-time"].get<double>();
    if (j.contains("ram")) {
      f.ram_total_bytes = j["ram"].value("total", uint64_t{0});
      f.ram_transferred_bytes = j["ram"].value("transferred", uint64_t{0});
    }
  }
  if (auto s = qmp.QueryStatus(timeout); s.ok()) f.run_state = s->status;
}

Result<MigrationSettings> SaveMigrationSettings(QmpClient& qmp, std::chrono::milliseconds timeout) {
  MigrationSettings m;
  GM_ASSIGN_OR_RETURN(nlohmann::json caps, qmp.Execute("query-migrate-capabilities", nullptr, timeout));
  for (const auto& c : caps) {
    const std::string name = c.value("capability", std::string());
    if (name == "events" || name == "return-path" || name == "x-ignore-shared" || name == "pause-before-switchover") {
      m.capabilities.emplace_back(name, c.value("state", false));
    }
  }
  GM_ASSIGN_OR_RETURN(nlohmann::json params, qmp.Execute("query-migrate-parameters", nullptr, timeout));
  for (const char* key : {"downtime-limit", "max-bandwidth"}) {
    if (params.contains(key)) m.parameters[key] = params[key];
  }
  m.saved = true;
  return m;
}

Status RestoreMigrationSettings(QmpClient& qmp, MigrationSettings& settings, std::chrono::milliseconds timeout) {
  if (!settings.saved || !qmp.connected()) return Status::Ok();
  Status caps = settings.capabilities.empty() ? Status::Ok() : qmp.SetMigrationCapabilities(settings.capabilities, timeout);
  Status params = settings.parameters.empty() ? Status::Ok() : qmp.SetMigrationParameters(settings.parameters, timeout);
  if (caps.ok() && params.ok()) settings.saved = false;  // restored once
  return !caps.ok() ? caps.WithContext("restoring QEMU's migration capabilities")
                    : params.WithContext("restoring QEMU's migration parameters");
}

}  // namespace gpumigrate::qemu
