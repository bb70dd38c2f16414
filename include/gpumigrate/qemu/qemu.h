// The QEMU migration hook: a QEMU VM whose device memory lives outside QEMU's
// own migration stream (an shm device, `x-ignore-shared`) moves with one
// guest-visible stun. QEMU pre-copies the guest's RAM while the engine pre-copies
// the device memory; neither switches over alone (docs/qemu-facts.md, docs/design.md "QEMU
// integration").
//
// Both ends wrap the engine's device in a QemuGuest that drives one QEMU over QMP
// from inside the device's lifecycle, so the session runs unchanged:
//
//   source QemuGuest                           destination QemuGuest
//   Attach: QEMU running; caps events,          Attach: QEMU inmigrate, started with
//     return-path, x-ignore-shared,               -incoming defer -S (checked through
//     pause-before-switchover; downtime-limit     the socket's peer); the same caps
//     0 (QEMU may not switch on its own)        LoadSetup: migrate-incoming URI; the
//   SetPeerSetupNote: the URI, from Ready         URI is the SetupNote sent in Ready
//   end of the device's round 0: migrate URI
//     (QEMU's RAM pre-copy runs beside the
//     device's dirty rounds)
//   switch_now(): QEMU paused by itself (its
//     RAM all sent)? cut the round, switch
//   may_switch() (the rule says go):
//     downtime-limit = target; hold the
//     switchover, a round at a time, until
//     QEMU reports pre-switchover (vCPUs stopped)
//   STOP_COPY: device STOP_COPY, then
//     migrate-continue (the rest of RAM
//     overlaps the device's final round)
//   SaveState: wait for QEMU's "completed"
//     (return-path: the destination loaded it)
//                                              RUNNING (Commit): QEMU completed, the
//                                                device runs, `cont`, RESUME event
//   rollback (RUNNING from PRE_COPY/STOP_COPY): ERROR (discard): the device
//     migrate_cancel, or `cont` once QEMU had    discards, then `quit` (that QEMU
//     completed: the source guest runs on        holds a copy that must never run)
//
// The guest-visible stun runs from the source QEMU's STOP event to the moment
// the source learns the destination resumed (MarkResumed, at the session's
// kCompleted): an upper bound by one control message. QEMU's own `downtime`
// includes the pre-switchover pause and is reported beside it.
//
// Only QEMU 7.2's mechanisms are used (no switchover-ack, added in 8.1): QEMU can
// still reach pre-switchover by itself when the guest's RAM is fully sent (the
// guest idle since the last dirty sync); then switch_now() cuts the round and
// the session switches over at once. That is why QEMU starts only after the
// device's round 0: a QEMU done first would stop the guest for the device's
// whole bulk copy. Under libvirt, libvirt owns the pause: use
// scripts/libvirt/qemu instead.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/session/session.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

class QmpClient;

struct QemuHookOptions {
  std::string qmp_path;                                     // QEMU's -qmp unix socket
  std::string incoming_uri;                                 // destination: QEMU listens here (tcp:IP:PORT, unix:PATH)
  std::chrono::milliseconds command_timeout{10000};         // each QMP command
  std::chrono::milliseconds converge_timeout{300000};       // QEMU reaching pre-switchover once released
  std::chrono::milliseconds complete_timeout{60000};        // QEMU finishing its RAM after migrate-continue
  std::chrono::milliseconds downtime_target{300};           // QEMU's downtime-limit once the engine says go
  double max_bandwidth_bytes_per_s = 0;                     // QEMU's max-bandwidth; 0: uncapped (its default is 128 MiB/s)
  bool require_paused_start = true;                         // destination: refuse a QEMU started without -S
  std::function<void(std::string_view)> note;               // progress lines (stderr in the CLI)
};

// What QEMU reported, for the migration report's `qemu` object.
struct QemuFigures {
  std::string side;             // "source" or "destination"
  std::string qemu_version;
  std::string migration_status; // QEMU's last MIGRATION status
  std::string run_state;        // query-status at the end
  uint64_t ram_total_bytes = 0;
  uint64_t ram_transferred_bytes = 0;
  uint64_t ram_remaining_at_pause_bytes = 0;  // sent after migrate-continue, beside the final round
  double qemu_downtime_ms = -1;   // QEMU's own figure (includes the pre-switchover pause)
  double qemu_total_ms = -1;
  bool paused_on_its_own = false; // QEMU reached pre-switchover before the engine asked
  double converge_wait_ms = 0;    // engine asked -> QEMU paused (guest running meanwhile, unless paused_on_its_own)
  double stopped_before_switchover_ms = 0;  // paused_on_its_own: the guest's vCPUs stopped this long before the engine asked
  double ram_finish_wait_ms = 0;  // after the final round: waiting for QEMU's "completed"
  double stop_unix_s = 0;         // source: QEMU's STOP event (its wall clock)
  double resume_unix_s = 0;       // destination: QEMU's RESUME event; source: when it learned the destination runs
  double guest_stun_ms = -1;      // source: stop -> resumed
  std::string rollback;           // what the hook did to give the guest back, when it did
  std::string ToJson() const;
};

class QemuGuest : public Device {
 public:
  // Connects to the QEMU at options.qmp_path and checks it can take its part.
  // The device (the guest's device memory, e.g. shm:PATH) is owned from here on.
  static Result<std::unique_ptr<QemuGuest>> AttachSource(std::unique_ptr<Device> device, QemuHookOptions options);
  static Result<std::unique_ptr<QemuGuest>> AttachDestination(std::unique_ptr<Device> device,
                                                              QemuHookOptions options);
  // The same over a QMP client already connected (options.qmp_path is then only
  // a name in messages): tests drive the hook with a scripted QEMU this way.
  static Result<std::unique_ptr<QemuGuest>> AttachSource(std::unique_ptr<Device> device, QemuHookOptions options,
                                                         std::unique_ptr<QmpClient> qmp);
  static Result<std::unique_ptr<QemuGuest>> AttachDestination(std::unique_ptr<Device> device,
                                                              QemuHookOptions options,
                                                              std::unique_ptr<QmpClient> qmp);

  // Source: SourceOptions::switch_now: QEMU paused the guest for the
  // switchover by itself, or its migration failed.
  virtual bool SwitchNow() { return false; }
  // Source: SourceOptions::may_switch: releases QEMU (downtime-limit = target)
  // and says whether QEMU has paused the guest yet (waits up to 100 ms).
  virtual bool MaySwitch() { return true; }
  // Source: SourceOptions::on_phase: QEMU's RAM migration starts at the end of
  // the device's first round; kCompleted marks the guest resumed.
  virtual void OnSourcePhase(Phase phase, uint32_t round) {
    (void)phase;
    (void)round;
  }
  // Sets switch_now and may_switch, and chains on_phase, of a source's options.
  void WireInto(SourceOptions& options);
  // Source: the destination confirmed it runs (the session's kCompleted).
  virtual void MarkResumed() {}
  virtual QemuFigures Figures() = 0;
};

// `gpumigrate estimate --qemu`: what QEMU's own migration would move beside the
// device memory, measured over QMP without migrating (the guest keeps running).
//
//   RAM   query-memory-size-summary (base + plugged) minus the share=on backends
//         (query-memdev) when they are part of that memory (NUMA nodes: the
//         backends add up to it); x-ignore-shared leaves every share=on block out
//         of QEMU's stream. ROM blocks (about 0.5 MiB) are not counted.
//   dirty calc-dirty-rate {"mode":"page-sampling"} (the only mode that does not
//         crash QEMU 7.2 under TCG, docs/qemu-facts.md §5), then query-dirty-rate until
//         "measured". QEMU hashes sampled pages of every RAM block, the shared
//         ones included, and reports whole MiB/s: the caller subtracts what it
//         measured itself in the shared blocks over the same window.
struct QemuRamProfile {
  std::string qemu_version;
  uint64_t machine_bytes = 0;       // base + plugged memory
  uint64_t shared_bytes = 0;        // share=on memory backends
  bool shared_in_machine = false;   // ... counted in machine_bytes (NUMA nodes)
  uint64_t ram_bytes = 0;           // what QEMU's stream carries
  uint64_t page_bytes = 4096;
  double vm_dirty_bytes_per_s = 0;  // QEMU's estimate over every RAM block (shared ones too)
  double sample_s = 0;              // calc-time
  uint32_t sample_pages_per_gib = 0;
};

// Checks the QEMU runs and is not migrating, reads its memory layout and starts
// calc-dirty-rate for `sample` (whole seconds, 1 to 60). Returns at once: QEMU
// samples in its own thread while the caller measures the device.
Result<QemuRamProfile> StartQemuRamProfile(QmpClient& qmp, std::chrono::seconds sample,
                                           std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
// Polls query-dirty-rate until "measured" (at most `wait`) and fills the dirty rate.
Status FinishQemuRamProfile(QmpClient& qmp, QemuRamProfile& profile, std::chrono::milliseconds wait,
                            std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
// Both, for a caller with nothing to measure meanwhile.
Result<QemuRamProfile> MeasureQemuRam(QmpClient& qmp, std::chrono::seconds sample);

}  // namespace gpumigrate
