#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "engine/devices/proc/trackers.h"
#include "engine/devices/proc/uffd_compat.h"
#include "engine/devices/proc/uffd_probe.h"

namespace gpumigrate::proc {

KernelTracking ProbeKernelTracking() {
  KernelTracking k;
  const UffdProbe uffd = ProbeUffdFeatures();
  if (!uffd.ok()) {
    const bool at_open = std::string_view(uffd.failed_call) == "userfaultfd";
    k.detail = std::string(at_open ? "userfaultfd()" : "UFFDIO_API") + " failed: " + std::strerror(uffd.error) +
               (at_open && uffd.error == EPERM ? " (vm.unprivileged_userfaultfd=0 and no CAP_SYS_PTRACE?)" : "");
  } else {
    k.userfaultfd = true;
    k.uffd_features = uffd.features;
    k.wp_async = uffd.features & UFFD_FEATURE_WP_ASYNC;
    k.wp_unpopulated = uffd.features & UFFD_FEATURE_WP_UNPOPULATED;
    k.wp_shmem = uffd.features & UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
    if (!k.wp_async) k.detail = "the kernel's userfaultfd lacks UFFD_FEATURE_WP_ASYNC";
  }
  // PAGEMAP_SCAN: a one-page scan of our own memory, without write-protecting.
  int pm = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (pm >= 0) {
    long ps = sysconf(_SC_PAGESIZE);
    void* page = mmap(nullptr, static_cast<size_t>(ps), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page != MAP_FAILED) {
      page_region out[1];
      pm_scan_arg a{};
      a.size = sizeof(a);
      a.start = reinterpret_cast<uint64_t>(page);
      a.end = a.start + static_cast<uint64_t>(ps);
      a.vec = reinterpret_cast<uint64_t>(out);
      a.vec_len = 1;
      a.category_anyof_mask = PAGE_IS_PRESENT;
      a.return_mask = PAGE_IS_PRESENT;
      if (ioctl(pm, PAGEMAP_SCAN, &a) >= 0) {
        k.pagemap_scan = true;
      } else {
        std::string why = std::string("PAGEMAP_SCAN failed: ") + std::strerror(errno);
        k.detail = k.detail.empty() ? why : k.detail + "; " + why;
      }
      munmap(page, static_cast<size_t>(ps));
    }
    close(pm);
  }
  return k;
}

}  // namespace gpumigrate::proc
