// The thin helpers over Execute() that the QEMU migration hook uses. Argument
// shapes as in QEMU 7.2's schema (docs/qemu-facts.md §1-2).
#include <fmt/format.h>

#include "gpumigrate/qemu/qmp.h"

namespace gpumigrate {

using json = nlohmann::json;

namespace {

Status Done(const Result<json>& r) { return r.ok() ? Status::Ok() : r.status(); }

}  // namespace

Status QmpClient::SetMigrationCapabilities(const std::vector<std::pair<std::string, bool>>& capabilities,
                                           std::chrono::milliseconds timeout) {
  json list = json::array();
  for (const auto& [name, on] : capabilities) list.push_back({{"capability", name}, {"state", on}});
  return Done(Execute("migrate-set-capabilities", {{"capabilities", list}}, timeout));
}

Status QmpClient::SetMigrationParameters(const json& parameters, std::chrono::milliseconds timeout) {
  return Done(Execute("migrate-set-parameters", parameters, timeout));
}

Result<json> QmpClient::QueryMigrate(std::chrono::milliseconds timeout) {
  return Execute("query-migrate", nullptr, timeout);
}

Result<QmpRunState> QmpClient::QueryStatus(std::chrono::milliseconds timeout) {
  GM_ASSIGN_OR_RETURN(json r, Execute("query-status", nullptr, timeout));
  auto status = r.is_object() ? r.find("status") : r.end();
  auto running = r.is_object() ? r.find("running") : r.end();
  if (status == r.end() || !status->is_string() || running == r.end() || !running->is_boolean()) {
    return Corrupt(fmt::format("qmp: query-status failed: reply has no string status and boolean running: {}",
                               r.dump().substr(0, 200)));
  }
  return QmpRunState{status->get<std::string>(), running->get<bool>()};
}

Status QmpClient::MigrateIncoming(std::string_view uri, std::chrono::milliseconds timeout) {
  return Done(Execute("migrate-incoming", {{"uri", uri}}, timeout));
}

Status QmpClient::Migrate(std::string_view uri, std::chrono::milliseconds timeout) {
  return Done(Execute("migrate", {{"uri", uri}}, timeout));
}

Status QmpClient::MigrateContinue(std::string_view state, std::chrono::milliseconds timeout) {
  return Done(Execute("migrate-continue", {{"state", state}}, timeout));
}

Status QmpClient::MigrateCancel(std::chrono::milliseconds timeout) {
  return Done(Execute("migrate_cancel", nullptr, timeout));
}

Status QmpClient::Cont(std::chrono::milliseconds timeout) { return Done(Execute("cont", nullptr, timeout)); }

Result<std::string> QmpClient::HumanMonitorCommand(std::string_view command_line, std::chrono::milliseconds timeout) {
  GM_ASSIGN_OR_RETURN(json r, Execute("human-monitor-command", {{"command-line", command_line}}, timeout));
  if (!r.is_string()) {
    return Corrupt(
        fmt::format("qmp: human-monitor-command failed: reply is not a string: {}", r.dump().substr(0, 200)));
  }
  return r.get<std::string>();
}

}  // namespace gpumigrate
