#include "engine/devices/proc/uffd_probe.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "engine/devices/proc/uffd_compat.h"

namespace gpumigrate::proc {

UffdProbe ProbeUffdFeatures() {
  UffdProbe p;
  // User-mode only: unprivileged processes may open it where
  // vm.unprivileged_userfaultfd=0 forbids kernel-mode faults.
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
  if (fd < 0) {
    p.error = errno;
    p.failed_call = "userfaultfd";
    return p;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = 0;
  if (ioctl(fd, UFFDIO_API, &api) == 0) {
    p.features = api.features;
  } else {
    p.error = errno;
    p.failed_call = "UFFDIO_API";
  }
  close(fd);
  return p;
}

}  // namespace gpumigrate::proc
