#include <nlohmann/json.hpp>

#include "gpumigrate/qemu/qemu.h"

namespace gpumigrate {

void QemuGuest::WireInto(SourceOptions& options) {
  options.switch_now = [this] { return SwitchNow(); };
  options.may_switch = [this] { return MaySwitch(); };
  options.on_phase = [this, next = std::move(options.on_phase)](Phase phase, uint32_t round) {
    OnSourcePhase(phase, round);
    if (next) next(phase, round);
  };
}

std::string QemuFigures::ToJson() const {
  nlohmann::ordered_json j;
  j["side"] = side;
  j["qemu_version"] = qemu_version;
  j["migration_status"] = migration_status;
  j["run_state"] = run_state;
  j["ram_total_bytes"] = ram_total_bytes;
  j["ram_transferred_bytes"] = ram_transferred_bytes;
  if (side == "source") {
    j["ram_remaining_at_pause_bytes"] = ram_remaining_at_pause_bytes;
    j["paused_on_its_own"] = paused_on_its_own;
    j["converge_wait_ms"] = converge_wait_ms;
    j["stopped_before_switchover_ms"] = stopped_before_switchover_ms;
    j["ram_finish_wait_ms"] = ram_finish_wait_ms;
    j["guest_stun_ms"] = guest_stun_ms;
    j["stop_unix_s"] = stop_unix_s;
  }
  j["resume_unix_s"] = resume_unix_s;
  j["qemu_downtime_ms"] = qemu_downtime_ms;
  j["qemu_total_ms"] = qemu_total_ms;
  if (!rollback.empty()) j["rollback"] = rollback;
  return j.dump();
}

}  // namespace gpumigrate
