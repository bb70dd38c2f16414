// A fake VFIO migration v2 device behind the fake kernel: the device fd and its
// migration data fds, enforcing the uAPI rather than echoing success. Its
// "device memory" is a byte array a test thread may write while the device runs;
// the migration stream is a sequence of records (u64 offset, u32 length, u32
// magic, bytes) of dirty chunks, which a resuming fake applies to its memory.
//
// Rule enforced                                    | Where the kernel says so
// -------------------------------------------------+------------------------------------------------------------
// VFIO_DEVICE_FEATURE: unknown flag bits, GET+SET   | drivers/vfio/vfio_main.c vfio_ioctl_device_feature
//   together, argsz < header -> -EINVAL; unknown    |   (+ vfio_check_feature: ops not supported, no GET/SET
//   feature -> -ENOTTY; PROBE answers 0             |   without PROBE, payload argsz short -> -EINVAL)
// MIGRATION: GET only, flags as configured;         | include/uapi/linux/vfio.h VFIO_DEVICE_FEATURE_MIGRATION
//   a device without migration answers -ENOTTY      |   comment; vfio_ioctl_device_feature_migration
// MIG_DEVICE_STATE SET walks the arc table step by  | vfio_main.c vfio_mig_get_next_state: vfio_from_fsm_table
//   step (shortest path, saving-group states never  |   and state_flags_table, reproduced in kNextState below
//   interior except PRE_COPY_P2P as the kernel's    |
//   table has it); unsupported or ERROR target, or  |   "return (*next_fsm != ERROR) ? 0 : -EINVAL"
//   ERROR on the way (STOP_COPY -> PRE_COPY) -> -EINVAL|
// data_fd returned only on STOP->STOP_COPY,          | vfio.h "enum vfio_device_mig_state" arc list: these arcs
//   RUNNING->PRE_COPY, RUNNING_P2P->PRE_COPY_P2P,    |   "create a migration data fd"; -1 otherwise
//   STOP->RESUMING; -1 on every other SET            |
// leaving the saving group / RESUMING ends the fd:  | vfio.h: "STOP_COPY -> STOP ... the data FD ... ends";
//   later read/write -> -ENODEV                     |   mlx5 vfio_mig disable_fd (ENODEV)
// PRE_COPY read at the temporary end -> -ENOMSG;    | vfio.h VFIO_MIG_GET_PRECOPY_INFO comment; QEMU
//   STOP_COPY read at the end -> 0                  |   hw/vfio/migration.c vfio_save_block (errno == ENOMSG)
// VFIO_MIG_GET_PRECOPY_INFO: data fd only, PRE_COPY | vfio.h VFIO_MIG_GET_PRECOPY_INFO: "-EINVAL if not in
//   states only, argsz >= 24; else -EINVAL;         |   PRE_COPY"; on the device fd the number is
//   on the device fd -ENOTTY                        |   VFIO_EEH_PE_OP (another fd type)
// MIG_DATA_SIZE GET in any state                    | vfio.h VFIO_DEVICE_FEATURE_MIG_DATA_SIZE comment
// ERROR left only by VFIO_DEVICE_RESET (-> RUNNING,  | vfio.h: "ERROR ... the device must be reset"; reset
//   sessions end)                                   |   "returns the device to RUNNING"
// short reads: at most max_read_bytes per read()    | read(2) semantics; the uAPI makes no promise of full reads
// a resume stream that ends mid-record fails        | vfio.h RESUMING -> STOP: "the device ... load the
//   RESUMING -> STOP with -EINVAL (device ERROR)    |   migration state"; drivers reject a truncated stream
// a cdev answers only VFIO_DEVICE_BIND_IOMMUFD      | vfio/device_cdev.c vfio_df_ioctl_bind_iommufd (flags 0,
//   until bound (else -EINVAL); bind needs flags 0, |   argsz); vfio_main.c vfio_device_fops_unl_ioctl
//   argsz >= 16, an open iommufd (-EBADF), once    |   ("if (!df->access_granted) return -EINVAL")
// DMA logging features 6/7/8 -> -ENOTTY (wired at merge with the IOMMU work)
// devices on one FakeP2PBus: no arc may leave a   | vfio.h "enum vfio_device_mig_state": RUNNING_P2P / PRE_COPY_P2P
//   device initiating P2P DMA (RUNNING, PRE_COPY)   |   "quiesce" a device so that "all the devices ... can be
//   while a peer cannot answer it (STOP, STOP_COPY, |   stopped": every device must reach a _P2P state before any
//   RESUMING, ERROR): each such arc is recorded     |   is stopped, and answer P2P again before any runs
//   as a violation (the kernel cannot see it; the   |   (QEMU vfio_vmstate_change_prepare does the same)
//   hardware would lose the DMA)                    |
//
// Only documented, not enforced: data fd poll(), mmap of regions, the v1 (6.1
// deprecated) interface. A VFIO_DEVICE_RESET is not checked against the bus (a
// reset device has no DMA set up to initiate).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/devices/vfio/vfio_compat.h"
#include "tests/support/vfio/fake_dma_logging.h"
#include "tests/support/vfio/fake_kernel.h"

namespace gpumigrate::vfio::fake {

// The devices of one VM that may DMA to one another: records every arc that
// broke the P2P quiescing rule (see the table above).
class FakeP2PBus {
 public:
  // A device joins in `state`; its index names it in violations ("device 1").
  size_t Join(uint32_t state);
  // After each arc step of device `id` from `from` to `to`.
  void Arc(size_t id, uint32_t from, uint32_t to);
  // Unchecked: VFIO_DEVICE_RESET (RUNNING), a device that fell into ERROR.
  void Set(size_t id, uint32_t state);
  std::vector<std::string> Violations();

 private:
  std::mutex mu_;
  std::vector<uint32_t> states_;
  std::vector<std::string> violations_;
};

struct FakeVfioConfig {
  uint64_t migration_flags = VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_P2P | VFIO_MIGRATION_PRE_COPY;
  size_t memory_bytes = 1 << 20;
  size_t chunk_bytes = 4096;      // dirty granularity: one record per dirty chunk
  size_t max_read_bytes = 1000;   // short reads
  uint32_t initial_state = kStateRunning;
  // The device's own DMA log (VFIO_DEVICE_FEATURE_DMA_LOGGING_START/REPORT/STOP,
  // tests/support/vfio/fake_dma_logging.h); without one those features are ENOTTY.
  std::shared_ptr<FakeDmaLogging> dma_log;
  bool cdev = true;  // a /dev/vfio/devices cdev: only BIND_IOMMUFD until bound
  std::shared_ptr<FakeP2PBus> p2p_bus;  // shared by the devices of one VM; none: no P2P checks
};

// Fault knobs, set by a test before the operation they break.
struct FakeVfioFaults {
  std::atomic<int64_t> read_error_after_bytes{-1};  // a saving read fails with -EIO past this many bytes
  std::atomic<bool> lie_precopy_sizes{false};       // PRECOPY_INFO reports 0/0 while data is pending
  std::atomic<bool> refuse_resume_stream{false};    // resume write() -> -EINVAL
  std::atomic<bool> error_on_next_arc{false};       // the next arc step fails with -EIO, device -> ERROR
  std::atomic<bool> fail_next_arc{false};           // the next arc step fails with -EIO, device stays put
  // The next arc step into this state (-1: none) fails with -EIO: into ERROR, or staying put.
  std::atomic<int64_t> error_on_arc_into{-1};
  std::atomic<int64_t> fail_on_arc_into{-1};
  // A device that hands over its pre-copy data slowly: in PRE_COPY, -ENOMSG once
  // this many bytes were read since the last VFIO_MIG_GET_PRECOPY_INFO.
  std::atomic<int64_t> precopy_bytes_per_info{-1};
};

// Record header of the fake stream.
struct FakeRecord {
  uint64_t offset;
  uint32_t length;
  uint32_t magic;
};
inline constexpr uint32_t kFakeRecordMagic = 0x56464d52;  // "RMFV"

class FakeVfioDevice : public std::enable_shared_from_this<FakeVfioDevice> {
 public:
  static std::shared_ptr<FakeVfioDevice> Create(FakeVfioConfig cfg);
  // The factory for FakeKernel::Add (one open at a time, like a VFIO device).
  std::shared_ptr<File> OpenFile();

  // Test side. Writes succeed only while the device runs (RUNNING, RUNNING_P2P,
  // PRE_COPY, PRE_COPY_P2P); each marks its chunks pending again.
  bool WriteMemory(uint64_t offset, std::span<const std::byte> bytes);
  std::vector<std::byte> Memory();
  uint32_t state();
  std::vector<uint32_t> Steps();  // every arc step taken, in order (the target of each)
  FakeVfioFaults faults;

  // Called by the files.
  int FeatureIoctl(FakeKernel& k, vfio_device_feature* f);
  // VFIO_DEVICE_RESET: RUNNING in the reset state; the device's memory is wiped.
  int Reset();
  int resets() const { return resets_.load(); }
  bool cdev() const { return cfg_.cdev; }
  ssize_t SaveRead(uint64_t session, void* buf, size_t len);
  ssize_t ResumeWrite(uint64_t session, const void* buf, size_t len);
  int PrecopyInfo(uint64_t session, vfio_precopy_info* info);
  void Closed() { opened_ = false; }

 private:
  explicit FakeVfioDevice(FakeVfioConfig cfg);
  int SetState(FakeKernel& k, uint32_t target, int32_t* data_fd);
  int Step(FakeKernel& k, uint32_t next, int32_t* data_fd);
  bool Supported(uint32_t s) const;
  uint64_t PendingBytesLocked() const;
  bool NextRecordLocked();
  void ApplyLocked(std::span<const std::byte> in);

  FakeVfioConfig cfg_;
  std::mutex mu_;
  std::atomic<bool> opened_{false};
  uint32_t state_;
  std::vector<std::byte> memory_;
  std::atomic<int> resets_{0};
  std::vector<bool> dirty_;      // chunk pending in the saving stream
  std::vector<bool> sent_once_;  // chunk already sent once in this session (dirty, not initial)
  uint64_t session_ = 0;         // the live data session (0: none)
  bool saving_ = false;
  std::vector<std::byte> record_;  // the record being read, from record_pos_
  size_t record_pos_ = 0;
  bool record_initial_ = false;
  uint64_t bytes_read_ = 0;
  uint64_t read_since_info_ = 0;
  std::vector<std::byte> partial_;  // resume side: bytes of an incomplete record
  std::vector<uint32_t> steps_;
  size_t bus_id_ = 0;
};

}  // namespace gpumigrate::vfio::fake
