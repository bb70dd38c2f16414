// The `shm` backend: device memory that a QEMU guest maps from a shared file
// (`-object memory-backend-file,id=m1,share=on,mem-path=PATH,size=...`), kept out
// of QEMU's own migration stream by the `x-ignore-shared` capability. It is the
// stand-in for a vendor device whose memory the engine reads: the engine moves
// the file's bytes, QEMU moves the guest's RAM and device models.
//
// Source: the file is opened read-only and read with pread (a file truncated
// under us gives a short read and a named error, never a SIGBUS). Nothing outside
// QEMU can see which pages the guest wrote, so dirty pages come from hashing
// (XXH3 per page, every sync reads the whole file). The device cannot stop the
// guest's writes: STOP_COPY is only consistent once the guest's vCPUs are stopped,
// which the QEMU hook (qemu-plugin/) guarantees before it lets the session stop
// the device; the CLI refuses an shm device without --qemu.
//
// Destination: the destination QEMU's own file, written in place with pwrite
// (never truncated: QEMU has it mapped), its size must equal the source's. ERROR
// (a discarded migration) zeroes it, so no half-copied guest data stays behind.
//
// One region, id 0, named after the file; no device state beyond the memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "gpumigrate/devices/device.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate {

struct ShmSpec {
  std::string path;
  uint32_t page_size = 4096;  // the dirty-tracking granularity: a power of two, 4 KiB .. 2 MiB
  std::string ToString() const;
};

// "shm:PATH[,page=SIZE]". PATH may not contain ',' (the spec's separator).
Result<ShmSpec> ParseShmSpec(std::string_view text);

class ShmDevice : public Device {
 public:
  // Opens spec.path: a source starts RUNNING, a destination in STOP. The file
  // must exist, be a regular file and hold at least one page.
  static Result<std::unique_ptr<ShmDevice>> Open(const ShmSpec& spec, DeviceRole role);

  virtual const std::string& path() const = 0;
};

}  // namespace gpumigrate
