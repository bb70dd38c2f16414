/* gpumigrate shim: lets gpumigrate migrate the memory of this process while it runs.
 *
 * Link libgpumigrate_shim.so (or load it with LD_PRELOAD and resolve these symbols
 * with dlsym). A workload:
 *   1. puts the memory that should move in regions: gm_shim_alloc() gives memfd-
 *      backed memory (gpumigrate maps the memfd itself: fastest), gm_shim_register()
 *      exposes memory the program already has (anonymous, transparent huge pages),
 *      read and written remotely with process_vm_readv/writev;
 *   2. says how to save its other state (gm_shim_set_state): a blob that travels
 *      with the memory, taken while the workload is paused;
 *   3. calls gm_shim_start(): a thread serves gpumigrate on the Unix socket
 *      gm_shim_socket_path(getpid()) (directory $GPUMIGRATE_SHIM_DIR, else /tmp;
 *      mode 0600; only root or this process's user may connect);
 *   4. brackets every burst of writes to its regions with gm_shim_enter() /
 *      gm_shim_leave(): the switchover pauses the workload between bursts.
 *
 * On the source, gpumigrate asks the shim for a userfaultfd registered in
 * write-protect mode (asynchronous where the kernel has it) over the regions, and
 * tracks dirty pages through /proc/PID/pagemap; the process keeps running.
 * Safety: if gpumigrate goes away (killed, connection lost) while the workload is
 * paused but before the switchover passed STOP, the shim resumes the workload and
 * drops the write protection; after that point it keeps it paused ("in doubt")
 * until a gpumigrate says resume or release. gm_shim_released() turns 1 when the
 * workload has moved: the program should then exit without touching its regions.
 *
 * CUDA device memory: gm_shim_register_cuda() exposes a device allocation
 * (cuMemAlloc / cudaMalloc). The shim loads the driver API itself (the library
 * the application loaded: $GPUMIGRATE_LIBCUDA, else libcuda.so.1) and works in
 * the context that is current on the thread of the first gm_shim_register_cuda
 * call (the primary context of device 0 when none is). gpumigrate (`cuda:PID`)
 * finds changed pages by hashing them on the GPU (the embedded gm_hash_pages
 * kernel; on the host from staged pages when no kernel can be loaded) and copies
 * pages through pinned staging memory; at the switchover the shim pauses the
 * workload at gm_shim_leave and waits for its queued GPU work (cuCtxSynchronize),
 * so kernels that write the regions must be launched inside gm_shim_enter/leave.
 * Call gm_shim_shutdown() before destroying the context.
 *
 * A destination process creates the same regions, calls gm_shim_start_adopt() and
 * waits in gm_shim_wait_adopt(): gpumigrate fills the regions, then hands over the
 * state blob and lets it run.
 *
 * Functions return 0 (or a pointer) on success and a negative errno (or NULL) on
 * failure; gm_shim_last_error() then says what, in words. Thread-safe.
 */
#ifndef GPUMIGRATE_SHIM_H
#define GPUMIGRATE_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Region hints (the engine pre-copies static regions first). */
#define GM_SHIM_HINT_UNKNOWN 0u
#define GM_SHIM_HINT_STATIC 1u
#define GM_SHIM_HINT_DYNAMIC 2u

/* Region flags. */
/* Also written where page tables do not see it (device DMA into pinned memory,
 * another mapping of the same memfd, pwrite): tracked by page hashing, or by the
 * IOMMU's dirty bits or the device's DMA log when gm_shim_dma_iommufd /
 * gm_shim_dma_logging says how the device reaches it. */
#define GM_SHIM_DMA_WRITTEN (1u << 0)
/* gm_shim_alloc: ask for transparent huge pages (MADV_HUGEPAGE). */
#define GM_SHIM_HUGEPAGE (1u << 1)

/* Allocates `size` bytes (rounded up to the page size) of zeroed, memfd-backed
 * shared memory and registers it as a region. Returns its address or NULL. */
void* gm_shim_alloc(const char* name, size_t size, uint32_t hint, uint32_t flags);

/* Registers memory the program mapped itself (private anonymous; page aligned).
 * The mapping must outlive the shim. */
int gm_shim_register(const char* name, void* addr, size_t size, uint32_t hint, uint32_t flags);

/* A region flagged GM_SHIM_DMA_WRITTEN that a device writes through an iommufd
 * IO address space (a process driving its device through VFIO cdev + iommufd):
 * gpumigrate then reads the IOMMU's dirty bits for it (IOMMU_HWPT_GET_DIRTY_BITMAP)
 * instead of hashing the region at every sync. `iommufd`: this process's
 * /dev/iommu; `dev_id`: the device's id in it (VFIO_DEVICE_BIND_IOMMUFD's
 * out_devid); `hwpt_id`: the HWPT the device is attached to, which must have
 * been allocated with IOMMU_HWPT_ALLOC_DIRTY_TRACKING; `iova`: where the region
 * starts in that IO address space (4 KiB aligned; the whole region mapped).
 * gpumigrate switches the HWPT's dirty tracking on for a migration and off after
 * it. The shim keeps a duplicate of the descriptor. Call before gm_shim_start.
 * Where the IOMMU keeps no dirty bits, gpumigrate hashes the region and says why. */
int gm_shim_dma_iommufd(const char* region, int iommufd, uint32_t dev_id, uint32_t hwpt_id, uint64_t iova);

/* The same through the device's own DMA log (VFIO DMA logging, e.g. mlx5):
 * `vfio_device_fd` is the device's VFIO fd; the region lies at `iova` in the
 * device's IO address space. gpumigrate starts and stops the log. */
int gm_shim_dma_logging(const char* region, int vfio_device_fd, uint64_t iova);

/* Registers `size` bytes of CUDA device memory at device pointer `dptr` (256-byte
 * aligned; size a multiple of 2 KiB) as a region. Call it with the application's
 * context current; the allocation must outlive the shim. Fails (-ENODEV) when the
 * driver cannot be loaded, -EFAULT when the context cannot read the range. */
int gm_shim_register_cuda(const char* name, unsigned long long dptr, size_t size, uint32_t hint, uint32_t flags);

/* Called (from the shim's thread, with the workload paused) to save the
 * application's non-memory state: returns a malloc()ed blob in *blob and its
 * length, or a negative errno. `size_hint` is what the blob is expected to weigh
 * (used to predict the stun). The callback runs under the shim's lock: it must
 * not call gm_shim_* functions. */
typedef long (*gm_shim_save_fn)(void* ctx, void** blob);
int gm_shim_set_state(gm_shim_save_fn save, void* ctx, size_t size_hint);

/* Starts serving gpumigrate as a running workload (a migration source). */
int gm_shim_start(void);
/* Starts serving as a destination: the regions wait to be filled. */
int gm_shim_start_adopt(void);

/* Destination: blocks until gpumigrate has filled the regions and committed the
 * migration, then returns 0 with the source's state blob (malloc()ed; the caller
 * frees it) and length. -ETIMEDOUT after timeout_ms (< 0: wait forever). */
int gm_shim_wait_adopt(void** state, size_t* len, int timeout_ms);

/* Bracket writes to the regions. gm_shim_enter blocks while the workload is
 * paused and returns 0, or -ESHUTDOWN once the workload was released (migrated
 * away): then the caller must not write, and must not call gm_shim_leave. */
int gm_shim_enter(void);
void gm_shim_leave(void);

/* 1 once the workload was migrated away (and this copy must not run on). */
int gm_shim_released(void);
/* Blocks until released (returns 0) or timeout_ms passes (-ETIMEDOUT). */
int gm_shim_wait_released(int timeout_ms);

/* The socket path for a process id; returns the length written, or -ENAMETOOLONG. */
int gm_shim_socket_path(int pid, char* buf, size_t len);

/* The last error of this thread, in words. */
const char* gm_shim_last_error(void);

/* Stops serving, removes the socket, unregisters and unmaps regions it allocated. */
void gm_shim_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* GPUMIGRATE_SHIM_H */
