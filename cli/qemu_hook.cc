#include "cli/qemu_hook.h"

#include <fmt/format.h>

#include "cli/print.h"
#include "gpumigrate/common/units.h"

namespace gpumigrate::cli {

void AddQemuSourceFlags(CLI::App* c, QemuFlags& f) {
  c->add_option("--qemu", f.qmp,
                "Migrate the QEMU VM whose QMP socket this is together with its device memory (--device shm:PATH, "
                "the guest's memory-backend-file): one guest-visible stun");
  c->add_option("--qemu-converge-timeout", f.converge_timeout,
                "With --qemu: how long QEMU may take to pause the guest once the device memory has converged")
      ->capture_default_str();
}

void AddQemuDestinationFlags(CLI::App* c, QemuFlags& f) {
  c->add_option("--qemu", f.qmp,
                "The destination QEMU's QMP socket (started with -incoming defer -S and its own device-memory file)");
  c->add_option("--qemu-incoming", f.incoming,
                "With --qemu: where that QEMU listens for the guest's RAM (tcp:IP:PORT reachable from the source, or "
                "unix:PATH on one host); sent to the source");
}

Status CheckQemuUse(const QemuFlags& f, const std::string& device_spec, bool source) {
  const bool shm = device_spec.rfind("shm:", 0) == 0;
  if (shm && f.qmp.empty()) {
    return InvalidArgument(fmt::format("{} is a QEMU guest's device memory: give --qemu {}.qmp (only QEMU can stop "
                                       "the guest's writes for the switchover)",
                                       device_spec, source ? "SRC" : "DST"));
  }
  if (!f.qmp.empty() && !shm) {
    return InvalidArgument(fmt::format("--qemu moves a guest's device memory outside QEMU: use --device shm:PATH "
                                       "(not {})",
                                       device_spec));
  }
  if (!source && !f.qmp.empty() && f.incoming.empty()) {
    return InvalidArgument("--qemu needs --qemu-incoming tcp:IP:PORT (or unix:PATH): where the destination QEMU "
                           "listens for the guest's RAM");
  }
  if (!source && f.qmp.empty() && !f.incoming.empty()) return InvalidArgument("--qemu-incoming needs --qemu");
  return Status::Ok();
}

Status AttachQemu(const QemuFlags& f, OpenedDevice& opened, bool source, SourceOptions* options,
                  ProgressPrinter* progress, QemuGuest** guest) {
  *guest = nullptr;
  if (f.qmp.empty()) return Status::Ok();
  QemuHookOptions ho;
  ho.qmp_path = f.qmp;
  ho.incoming_uri = f.incoming;
  GM_ASSIGN_OR_RETURN(auto converge, ParseDuration(f.converge_timeout));
  ho.converge_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(converge);
  if (options != nullptr) {
    ho.downtime_target = std::chrono::duration_cast<std::chrono::milliseconds>(options->downtime_target);
    ho.max_bandwidth_bytes_per_s = options->bandwidth_limit_bytes_per_s;
  }
  ho.note = [progress](std::string_view line) {
    if (progress != nullptr) {
      progress->Note(std::string(line));
    } else {
      Print(stderr, "receive: {}\n", line);
    }
  };
  auto attached = source ? QemuGuest::AttachSource(std::move(opened.device), std::move(ho))
                         : QemuGuest::AttachDestination(std::move(opened.device), std::move(ho));
  if (!attached.ok()) return attached.status();
  *guest = attached->get();
  opened.device = std::move(attached).value();
  opened.shm = nullptr;  // owned by the guest now; reach it through the QemuGuest
  return Status::Ok();
}

void AddQemuToJson(QemuGuest& guest, nlohmann::ordered_json& j) {
  QemuFigures q = guest.Figures();
  auto qj = nlohmann::ordered_json::parse(q.ToJson());
  if (q.side == "source") {
    j["device_stun_ms"] = j["stun_ms"];
    j["stun_ms"] = q.guest_stun_ms >= 0 ? nlohmann::ordered_json(q.guest_stun_ms) : nlohmann::ordered_json(nullptr);
  }
  j["qemu"] = qj;
}

void PrintQemuLines(QemuGuest& guest, FILE* out) {
  QemuFigures q = guest.Figures();
  if (q.side != "source") {
    Print(out, "  qemu:       QEMU {} incoming migration {}, guest {}\n", q.qemu_version, q.migration_status, q.run_state);
    return;
  }
  Print(out, "  qemu:       QEMU {} migration {}, guest {}; RAM {} sent ({} guest RAM and ROMs)\n", q.qemu_version,
        q.migration_status, q.run_state, FormatBytes(static_cast<double>(q.ram_transferred_bytes)),
        FormatBytes(static_cast<double>(q.ram_total_bytes)));
  if (q.guest_stun_ms >= 0) {
    Print(out, "  guest stun: {:.1f} ms (QEMU STOP -> destination running; QEMU's own downtime {:.0f} ms)\n",
          q.guest_stun_ms, q.qemu_downtime_ms);
  }
  if (q.paused_on_its_own) {
    Print(out, "              QEMU paused the guest by itself {:.0f} ms before the device converged (all RAM sent; "
               "QEMU 7.2 cannot be held)\n",
          q.stopped_before_switchover_ms);
  } else {
    Print(out, "              QEMU paused the guest {:.0f} ms after the device converged\n", q.converge_wait_ms);
  }
  Print(out, "              {} of RAM left at the pause, sent beside the final round; QEMU completed {:.0f} ms after it\n",
        FormatBytes(static_cast<double>(q.ram_remaining_at_pause_bytes)), q.ram_finish_wait_ms);
  if (!q.rollback.empty()) Print(out, "  rollback:   {}\n", q.rollback);
}

}  // namespace gpumigrate::cli
