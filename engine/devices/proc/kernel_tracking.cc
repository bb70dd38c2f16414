#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "engine/devices/proc/trackers.h"
#include "engine/devices/proc/uffd_compat.h"

namespace gpumigrate::proc {

KernelTracking ProbeKernelTracking() {
  KernelTracking k;
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
  if (fd < 0) {
    k.detail = std::string("userfaultfd() failed: ") + std::strerror(errno) +
               (errno == EPERM ? " (vm.unprivileged_userfaultfd=0 and no CAP_SYS_PTRACE?)" : "");
  } else {
    uffdio_api api{};
    api.api = UFFD_API;
    if (ioctl(fd, UFFDIO_API, &api) == 0) {
      k.userfaultfd = true;
      k.uffd_features = api.features;
      k.wp_async = api.features & UFFD_FEATURE_WP_ASYNC;
      k.wp_unpopulated = api.features & UFFD_FEATURE_WP_UNPOPULATED;
      k.wp_shmem = api.features & UFFD_FEATURE_WP_HUGETLBFS_SHMEM;
      if (!k.wp_async) k.detail = "the kernel's userfaultfd lacks UFFD_FEATURE_WP_ASYNC";
    } else {
      k.detail = std::string("UFFDIO_API failed: ") + std::strerror(errno);
    }
    close(fd);
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
