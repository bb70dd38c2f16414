// Device: the seam between the migration engine and whatever holds GPU state.
//
// A device exposes memory regions (id, size, page size, hint) that the engine
// reads on the source and writes on the destination, a lifecycle state machine
// named exactly as the VFIO migration v2 uAPI names it, an opaque device-state
// blob saved in STOP_COPY and loaded in RESUMING, a pending-bytes query (cheap
// estimate, exact count) and the migration hooks the session calls around it.
//
// Source arcs:      RUNNING -> PRE_COPY -> STOP_COPY -> STOP
//                   PRE_COPY/STOP_COPY -> RUNNING      (rollback: recovery state)
//                   STOP -> RUNNING                    (resume an in-doubt source)
// Destination arcs: STOP -> RESUMING -> STOP -> RUNNING (-> STOP), RESUMING -> ERROR -> STOP
// A transition that fails leaves the device in a recovery state (RUNNING on the
// source) or ERROR, never silently somewhere else.
//
// Thread safety: Read() may be called from several engine threads at once and
// concurrently with the device's own workload; SetState() is called by one
// engine thread. Implementations document anything stricter.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpumigrate/devices/outcome.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

class DirtyTracker;

// Values match enum vfio_device_mig_state.
enum class DeviceState : uint32_t {
  kError = 0,
  kStop = 1,
  kRunning = 2,
  kStopCopy = 3,
  kResuming = 4,
  kRunningP2P = 5,
  kPreCopy = 6,
  kPreCopyP2P = 7,
};
std::string_view DeviceStateName(DeviceState s);

// Which end of a migration a device serves. A source starts RUNNING and is
// read; a destination starts in STOP and is written while RESUMING.
enum class DeviceRole { kSource, kDestination };
std::string_view DeviceRoleName(DeviceRole r);  // "source", "destination"

enum class RegionHint : uint32_t {
  kUnspecified = 0,
  kStatic = 1,   // written once (model weights): pre-copied first
  kDynamic = 2,  // written continuously (KV cache, activations)
  kUnknown = 3,
};
std::string_view RegionHintName(RegionHint h);

struct RegionInfo {
  uint32_t id = 0;
  std::string name;
  uint64_t size_bytes = 0;
  uint32_t page_size = 4096;  // a power of two; dirty-bitmap granularity
  RegionHint hint = RegionHint::kUnknown;
  uint64_t pages() const { return (size_bytes + page_size - 1) / page_size; }
};

// What the device's own (non-memory) state will add to the stun: the VFIO
// stop-copy size (VFIO_DEVICE_FEATURE_MIG_DATA_SIZE), for sim and proc the state
// blob. When a backend cannot know, it answers pessimistically so a downtime
// limit is never broken. Memory regions are counted by the session itself.
struct PendingBytes {
  uint64_t stop_copy_bytes = 0;  // would be sent during the stun
  // A streaming device in PRE_COPY: state it can hand over now, before the stun
  // (VFIO_MIG_GET_PRECOPY_INFO initial + dirty bytes). 0 for sim and proc.
  uint64_t precopy_bytes = 0;
  // Of precopy_bytes, the device's initial data (VFIO's initial_bytes): the
  // switchover waits until it has been sent, as QEMU's switchover-ack does.
  uint64_t precopy_initial_bytes = 0;
};
class Device {
 public:
  virtual ~Device() = default;

  // "sim:size=4GiB,..."-style description for reports.
  virtual std::string Describe() const = 0;
  virtual const std::vector<RegionInfo>& Regions() const = 0;

  virtual DeviceState State() const = 0;
  virtual Status SetState(DeviceState next) = 0;

  // Copies region bytes [offset, offset + out.size()) into `out`; must not cross
  // the region's end. Offsets and sizes need not be page aligned.
  virtual Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out) = 0;
  // Whether Read may be called from several threads at once (on any ranges):
  // the source's workers then read in parallel, else one at a time.
  virtual bool ConcurrentReads() const { return false; }
  // Destination side (RESUMING): stores bytes. Bounds are checked, never trusted.
  virtual Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) = 0;
  // Stores a zero page range (cheaper than Write of zeros on most backends).
  virtual Status WriteZeros(uint32_t region, uint64_t offset, uint64_t length) = 0;

  // Opaque non-memory state (registers, queues, workload position): saved only in
  // STOP_COPY, loaded only in RESUMING.
  virtual Result<std::vector<std::byte>> SaveState() = 0;
  virtual Status LoadState(std::span<const std::byte> blob) = 0;

  // What is left to move, two ways (QEMU's state_pending_estimate/_exact): a
  // cheap estimate the session asks every round, and an exact count it asks only
  // when the estimate says the switchover is near. The exact one may cost (a
  // query to the device); by default it is the estimate.
  virtual PendingBytes PendingEstimate() const = 0;
  virtual Result<PendingBytes> PendingExact() { return PendingEstimate(); }

  // --- Migration hooks (QEMU's SaveVMHandlers), called by the session only. ---
  // The defaults do nothing; a backend overrides what it needs.
  //
  // Source: SaveSetup() once the destination accepted the manifest, before the
  // device enters PRE_COPY. SaveCleanup(outcome) once the migration has ended,
  // outside the stun, with what must become of the source:
  //   kCompleted  the destination runs the workload: this copy must never run on
  //               (the device stays in STOP; proc tells the process it moved)
  //   kAborted    the session has returned the device to RUNNING: drop what the
  //               pre-copy needed, the workload runs on here
  //   kInDoubt    the device stays in STOP with its state intact, to be resumed or
  //               released by an operator: release nothing
  virtual Status SaveSetup() { return Status::Ok(); }
  virtual Status SaveCleanup(Outcome outcome) {
    (void)outcome;
    return Status::Ok();
  }
  // Destination: LoadSetup() before the device enters RESUMING, LoadCleanup()
  // once the migration has ended (kCompleted: RUNNING here; kAborted: the
  // device discarded what it received; kInDoubt: it holds the verified state, stopped).
  virtual Status LoadSetup() { return Status::Ok(); }
  // Words the destination device hands the source device through the session
  // (asked once LoadSetup has run, carried in Ready, given to the source's
  // SetPeerSetupNote just before SaveSetup): the QEMU hook sends QEMU's incoming
  // migration URI this way. Empty by default; at most 4 KiB.
  virtual std::string SetupNote() const { return {}; }
  virtual Status SetPeerSetupNote(std::string_view note) {
    (void)note;
    return Status::Ok();
  }
  virtual Status LoadCleanup(Outcome outcome) {
    (void)outcome;
    return Status::Ok();
  }

  // --- Streaming device state (a VFIO migration data fd). ---
  // A device whose state is a stream rather than a blob says so; the session
  // then never calls SaveState/LoadState but moves the stream in chunks, never
  // holding it whole. Source: ReadStateChunk fills `out` with the next bytes and
  // returns how many; in PRE_COPY 0 means "nothing more for now", in STOP_COPY
  // the end of the stream. Destination (RESUMING): WriteStateChunk appends `in`.
  virtual bool StreamsState() const { return false; }
  virtual Result<size_t> ReadStateChunk(std::span<std::byte> out) {
    (void)out;
    return Unimplemented(Describe() + ": the device state is not a stream");
  }
  virtual Status WriteStateChunk(std::span<const std::byte> in) {
    (void)in;
    return Unimplemented(Describe() + ": the device state is not a stream");
  }

  // Zeroes the device's memory so that the next tenant of that memory cannot
  // read what this workload left there (GPU memory has leaked across tenants:
  // LeftoverLocals). The session calls it on a source whose migration completed
  // and which is released (SourceFate::kRelease), outside the stun, before
  // SaveCleanup; SourceOptions::scrub = false (--no-scrub) skips it. A
  // destination zeroes what it received when it discards a migration, as part
  // of SetState(kError). A backend that cannot zero its memory says why
  // (kUnimplemented by default) and the report says it was not scrubbed.
  virtual Status Scrub() { return Unimplemented(Describe() + ": this device cannot zero its memory"); }

  // Non-empty once a recovery during this migration had to throw away the
  // device's own state (a VFIO device reset out of ERROR): what was lost. The
  // session then says so instead of "memory intact" (source) or "holds the
  // verified state" (destination).
  virtual std::string LostState() const { return {}; }

  // The device's own dirty tracker, or nullptr when the engine must bring one.
  // Borrowed: valid for the device's lifetime.
  virtual DirtyTracker* Tracker() = 0;
};

// Ok when `cur -> next` is one of the arcs above for a device of `role`, else
// FailedPrecondition naming the backend and both states. Backends check with
// this, then act.
Status CheckTransition(std::string_view backend, DeviceRole role, DeviceState cur, DeviceState next);

// Finds a region by id, or nullptr.
const RegionInfo* FindRegion(const std::vector<RegionInfo>& regions, uint32_t id);

// Ok when region `region` is among `regions` and [offset, offset + length) lies
// inside it; else InvalidArgument "<backend>: <action> failed: ..." naming the
// region and the range. Backends check every Read, Write and WriteZeros with
// this: offsets come off the wire and are never trusted.
Status CheckRange(std::string_view backend, std::string_view action, const std::vector<RegionInfo>& regions,
                  uint32_t region, uint64_t offset, uint64_t length);

}  // namespace gpumigrate
