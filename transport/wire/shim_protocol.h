// The wire between gpumigrate and the shim inside a workload process: a Unix
// stream socket at ShimSocketPath(pid), one request and one reply at a time.
// Every message is a 16-byte header and `len` payload bytes; file descriptors
// (memfds, the userfaultfd) ride on the reply header as SCM_RIGHTS. Both ends are
// built from this one file, so the layout is not versioned beyond kShimAbi.
//
// CUDA regions (gm_shim_register_cuda) live in device memory the engine cannot
// map; the shim moves their bytes through a staging memfd it shares with the
// engine (pinned with cuMemHostRegister inside the workload):
//
//   engine                                   shim (workload's CUDA context)
//   Hello ──────────────────────────────────▶ layout (CUDA regions flagged)
//   CudaInfo ───────────────────────────────▶ CudaInfoReply + staging memfd
//   CudaHash(region, pages) ────────────────▶ gm_hash_pages kernel (or host
//                         ◀──────────────── digests   hashing of staged pages)
//   CudaRead(region, off, len, slot) ───────▶ cuMemcpyDtoH into slot
//                         ◀──────────────── ok: bytes are in the slot
//   CudaWrite(region, off, len, slot) ──────▶ cuMemcpyHtoD from slot (destination)
//   CudaZero(region, off, len) ─────────────▶ cuMemsetD32 / HtoD of zeros (destination)
//   Pause ──────────────────────────────────▶ workload out of its write section,
//                                             then cuCtxSynchronize
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace gpumigrate::shimwire {

inline constexpr uint32_t kMagic = 0x48534d47;  // "GMSH"
inline constexpr uint32_t kShimAbi = 3;
inline constexpr uint32_t kMaxPayload = 1u << 30;
inline constexpr int kMaxFds = 64;

enum class Msg : uint16_t {
  kHello = 1,     // engine: HelloReq            shim: Layout + fds
  kPause = 2,     // wait until no workload thread is inside a write section
  kResume = 3,    // let the workload run again
  kHold = 4,      // stay paused even if the engine goes away (switchover past STOP)
  kSaveState = 5, // shim: the application's state blob
  kRelease = 6,   // the workload now runs elsewhere: tell the application
  kLoadState = 7, // destination: the state blob to hand over on Start
  kStart = 8,     // destination: the regions are filled; adopt and run
  kDiscard = 9,   // destination: zero the regions, keep waiting
  kBye = 10,
  kCudaInfo = 11,   // engine: CudaInfoReq   shim: CudaInfoReply + the staging memfd
  kCudaRead = 12,   // engine: CudaXfer      shim: device bytes now in the slot
  kCudaWrite = 13,  // engine: CudaXfer      shim: the slot's bytes now on the device (destination)
  kCudaZero = 14,   // engine: CudaXfer      shim: the range zeroed (destination; slot unused)
  kCudaHash = 15,   // engine: CudaHashReq   shim: uint64 digest per page (page_hash.h)
  kScrub = 16,      // source, paused after a completed migration: zero every region (host and CUDA)
};

enum class Role : uint32_t { kSource = 1, kDestination = 2 };
enum class WpMode : uint32_t { kNone = 0, kAsync = 1, kSync = 2 };

struct Header {
  uint32_t magic = kMagic;
  uint16_t type = 0;
  uint16_t reserved = 0;
  uint32_t error = 0;  // 0, or an errno with the message text as payload
  uint32_t len = 0;
};
static_assert(sizeof(Header) == 16);

struct HelloReq {
  uint32_t abi = kShimAbi;
  uint32_t role = 0;
  uint32_t wp_mode = 0;
  uint32_t reserved = 0;
};

// How a device reaches a region it writes by DMA (gm_shim_dma_iommufd / _logging).
enum class DmaKind : uint32_t { kNone = 0, kIommufd = 1, kDmaLogging = 2 };

inline constexpr uint32_t kRegionDmaWritten = 1u << 0;  // GM_SHIM_DMA_WRITTEN (checked in shim/registration.cc)
inline constexpr uint32_t kRegionMemfd = 1u << 16;  // shim-internal: fd_index is valid
inline constexpr uint32_t kRegionCuda = 1u << 17;   // device memory: addr is a CUdeviceptr

struct RegionDesc {
  char name[48] = {};
  uint64_t addr = 0;       // in the workload's address space
  uint64_t size = 0;
  uint32_t page_size = 0;
  uint32_t hint = 0;
  uint32_t flags = 0;      // GM_SHIM_* flags | kRegionMemfd
  int32_t fd_index = -1;   // index into the fds passed with the reply, or -1
  uint32_t registered = 0; // 1: registered with the session's userfaultfd
  uint32_t dma_kind = 0;     // DmaKind (source Hello only)
  int32_t dma_fd_index = -1; // the iommufd or VFIO device fd among the reply's fds, or -1
  uint32_t dma_dev_id = 0;   // iommufd: the device's id in it
  uint32_t dma_hwpt_id = 0;  // iommufd: the HWPT the device is attached to (DIRTY_TRACKING)
  uint32_t reserved = 0;
  uint64_t dma_iova = 0;     // where the region starts in the device's IO address space
};
static_assert(sizeof(RegionDesc) == 112);

struct LayoutHead {
  uint32_t abi = kShimAbi;
  uint32_t pid = 0;
  uint32_t regions = 0;
  int32_t uffd_index = -1;      // index of the userfaultfd among the fds, or -1
  uint64_t uffd_features = 0;   // the features the shim's UFFDIO_API granted
  uint64_t state_size_hint = 0; // what the application expects its state blob to weigh
  uint32_t paused = 0;          // the workload is paused (a previous session's switchover)
  uint32_t held = 0;            // ... and held past STOP: in doubt until resumed or released
};

enum class CudaHashMode : uint32_t { kAuto = 0, kGpu = 1, kHost = 2 };

struct CudaInfoReq {
  uint32_t hash_mode = 0;  // CudaHashMode: kGpu fails the reply when no kernel can be loaded
  uint32_t reserved = 0;
};

struct CudaInfoReply {
  uint64_t staging_bytes = 0;  // size of the staging memfd sent with the reply
  uint64_t slot_bytes = 0;     // staging_bytes / slots: the most one CudaRead/CudaWrite moves
  uint32_t slots = 0;
  uint32_t gpu_hash = 0;       // 1: CudaHash runs the gm_hash_pages kernel; 0: host hashing
  uint32_t pinned = 0;         // 1: the staging memory is registered with cuMemHostRegister
  int32_t driver_version = 0;  // cuDriverGetVersion
  char note[208] = {};         // why the kernel is not used, or how hashing runs, in words
};
static_assert(sizeof(CudaInfoReply) == 240);

struct CudaXfer {
  uint32_t region = 0;  // index in the layout
  uint32_t slot = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
};

struct CudaHashReq {
  uint32_t region = 0;
  uint32_t reserved = 0;
  uint64_t page_bytes = 0;  // a multiple of kHashMinPage; the last page may be shorter
  uint64_t first_page = 0;
  uint64_t pages = 0;       // at most kMaxHashPages
};
inline constexpr uint64_t kMaxHashPages = 1u << 16;

// "$GPUMIGRATE_SHIM_DIR/gpumigrate-shim.PID.sock" (default dir /tmp).
std::string ShimSocketPath(int pid);

// Blocking helpers; return 0 or -errno. Recv with timeout_ms < 0 waits forever.
int SendMsg(int sock, Msg type, uint32_t error, std::span<const std::byte> payload, std::span<const int> fds = {});
int RecvMsg(int sock, Header& h, std::vector<std::byte>& payload, std::vector<int>& fds, int timeout_ms);

}  // namespace gpumigrate::shimwire
