// The dirty tracker of CUDA regions: a digest per page (page_hash.h), computed
// where the memory is (the shim's GPU kernel, or host hashing of staged pages)
// and compared here with the digest of the previous sync. Only digests cross
// the PCIe bus and the shim's socket, 8 bytes a page.
//
// A page written while its digest is taken shows in this sync or the next: the
// stored digest is of whatever the kernel read, so any later change differs.
// Pure logic over a DigestSource: tested with a host-memory source.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpumigrate/devices/dirty_tracker.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::cuda {

struct DigestRegion {
  uint32_t id = 0;
  uint64_t size = 0;
  uint32_t page_size = 0;  // the engine's page; the last page may be shorter
  uint64_t pages() const { return (size + page_size - 1) / page_size; }
};

// Fills out[k] with the digest of page first_page + k of `region` (pages of
// `page_bytes`), out.size() pages at a time.
using DigestSource =
    std::function<Status(uint32_t region, uint32_t page_bytes, uint64_t first_page, std::span<uint64_t> out)>;

// `name`: what Name() answers ("gpu-hash", "host-hash"). The source is asked for
// at most `max_pages_per_call` pages at a time.
std::unique_ptr<DirtyTracker> MakeDigestTracker(std::string name, DigestSource source,
                                                std::vector<DigestRegion> regions, uint64_t max_pages_per_call);

}  // namespace gpumigrate::cuda
