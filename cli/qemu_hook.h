// The QEMU hook's part of `gpumigrate migrate` / `receive` (--qemu): flags, the
// wrapping of the device in a QemuGuest, and the `qemu` object of the report.
#pragma once

#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/progress.h"
#include "gpumigrate/devices/open_device.h"
#include "gpumigrate/qemu/qemu.h"
#include "gpumigrate/session/report.h"
#include "gpumigrate/session/session.h"

namespace gpumigrate::cli {

struct QemuFlags {
  std::string qmp;       // --qemu PATH: the QEMU's QMP socket
  std::string incoming;  // --qemu-incoming URI (receive)
  std::string converge_timeout = "300s";
};

void AddQemuSourceFlags(CLI::App* c, QemuFlags& f);
void AddQemuDestinationFlags(CLI::App* c, QemuFlags& f);

// Refuses the combinations that cannot work (an shm device without --qemu:
// nothing would stop the guest's writes; --qemu with another device; a receiver
// without --qemu-incoming). OK when no QEMU is involved.
Status CheckQemuUse(const QemuFlags& f, const std::string& device_spec, bool source);

// With --qemu: moves the opened device into a QemuGuest attached to that QEMU
// (source: QEMU's downtime target and bandwidth from `options`); `guest` points
// at it; the caller wires it into the session (QemuGuest::WireInto). Without:
// leaves everything alone.
Status AttachQemu(const QemuFlags& f, OpenedDevice& opened, bool source, SourceOptions* options,
                  ProgressPrinter* progress, QemuGuest** guest);

// The report's JSON with the QEMU figures: `stun_ms` becomes the guest-visible
// stun (the engine's own is kept as `device_stun_ms`), `qemu` holds the rest.
void AddQemuToJson(QemuGuest& guest, nlohmann::ordered_json& j);
// The same as lines for the text report.
void PrintQemuLines(QemuGuest& guest, FILE* out);

}  // namespace gpumigrate::cli
