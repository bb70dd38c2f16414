// The `proc` backend: the memory of a live, separate process that links the
// gpumigrate shim (gpumigrate/shim.h) and keeps writing while it is copied.
//
// Source: the device connects to the shim's Unix socket, receives the region
// layout, the memfds (mapped here and read directly) and a userfaultfd registered
// in write-protect mode; anonymous regions are read with process_vm_readv. Dirty
// pages come from one of three trackers, chosen at run time from what the kernel
// reports (TrackerName/TrackerReason say which and why):
//   pagemap-scan  asynchronous userfaultfd write-protect + PAGEMAP_SCAN (primary)
//   sync-wp       synchronous userfaultfd write-protect (kernels without WP_ASYNC)
//   hash          XXH3 per page (regions flagged as written by DMA, or forced)
// STOP_COPY pauses the workload at its next gm_shim_leave; RUNNING resumes it.
// STOP (all data read) tells the shim to hold the workload paused even if this
// process dies; before STOP, a lost gpumigrate lets the workload resume on its own.
//
// Destination: a process started in adopt mode (gm_shim_start_adopt) with the same
// regions; writes go into its memfds (or process_vm_writev), the state blob is
// handed over, and RUNNING lets it adopt the memory and continue. ERROR discards
// (the regions are zeroed; the process keeps waiting).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "gpumigrate/devices/cuda.h"
#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

enum class ProcTracking { kAuto, kPagemapScan, kSyncWp, kHash };
std::string_view ProcTrackingName(ProcTracking t);

struct ProcSpec {
  int pid = 0;
  ProcTracking tracker = ProcTracking::kAuto;
  uint32_t page_size = 0;  // 0: the system page size; else a multiple of it
  // CUDA regions (gm_shim_register_cuda; see gpumigrate/devices/cuda.h).
  bool cuda = false;  // opened as cuda:PID: the process must have CUDA regions
  uint32_t cuda_page_size = kCudaDefaultPageSize;
  CudaHash cuda_hash = CudaHash::kAuto;
  std::string ToString() const;
};

// The proc device behind a cuda:PID spec.
ProcSpec ProcSpecForCuda(const CudaSpec& c);

// "proc:PID[,tracker=auto|pagemap-scan|sync-wp|hash][,page=SIZE]".
Result<ProcSpec> ParseProcSpec(std::string_view text);
// Where a process linked with libgpumigrate_shim serves its shim:
// $GPUMIGRATE_SHIM_DIR (default /tmp)/gpumigrate-shim.PID.sock.
std::string ProcShimSocket(int pid);

using ProcRole = DeviceRole;  // the name proc callers use

namespace vfio {
class Kernel;
}

class ProcDevice : public Device {
 public:
  // Connects to the shim of spec.pid. A source device starts RUNNING (the
  // workload runs on); a destination device starts in STOP.
  // `dma_kernel`: the kernel the IOMMU dirty trackers of DMA-written regions
  // call (gm_shim_dma_iommufd / gm_shim_dma_logging); nullptr: the real one
  // (tests pass a fake).
  static Result<std::unique_ptr<ProcDevice>> Connect(const ProcSpec& spec, ProcRole role,
                                                     std::chrono::milliseconds timeout = std::chrono::seconds(10),
                                                     vfio::Kernel* dma_kernel = nullptr);

  virtual int pid() const = 0;
  // The tracker in use ("pagemap-scan", "sync-wp", "hash", "gpu-hash",
  // "host-hash", or a '+'-joined mix)
  // and why it was chosen, in words. Empty on a destination.
  virtual std::string TrackerName() const = 0;
  virtual std::string TrackerReason() const = 0;
  // Source, after a completed migration: the workload now runs on the
  // destination; the shim tells the application (gm_shim_released) to exit.
  virtual Status Release() = 0;
};

}  // namespace gpumigrate
