// The engine's end of the shim's CUDA staging (shim_protocol.h, CudaInfo ...
// CudaHash): moves the bytes of a workload's CUDA regions through the staging
// memfd the shim shares, and asks the shim for page digests.
//
// The staging is cut into slots; each transfer takes a free slot for one
// request and the copy into or out of it, so several engine threads overlap
// their copies with each other's requests. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "transport/wire/shim_protocol.h"
#include "gpumigrate/common/status.h"

namespace gpumigrate::proc {

// Sends one request to the shim and returns its reply (fds, when asked for, in *fds).
using ShimCall =
    std::function<Result<std::vector<std::byte>>(shimwire::Msg type, std::span<const std::byte> payload,
                                                  std::vector<int>* fds)>;

class CudaStaging {
 public:
  // Asks the shim for its staging (CudaInfo) and maps it. `call` must outlive this.
  static Result<std::unique_ptr<CudaStaging>> Open(ShimCall call, shimwire::CudaHashMode mode);
  ~CudaStaging();
  CudaStaging(const CudaStaging&) = delete;
  CudaStaging& operator=(const CudaStaging&) = delete;

  bool gpu_hash() const { return info_.gpu_hash != 0; }
  std::string note() const { return info_.note; }
  uint64_t slot_bytes() const { return info_.slot_bytes; }

  Status Read(uint32_t region, uint64_t offset, std::span<std::byte> out);
  Status Write(uint32_t region, uint64_t offset, std::span<const std::byte> in);
  Status Zero(uint32_t region, uint64_t offset, uint64_t length);
  // Digests of out.size() pages (at most shimwire::kMaxHashPages) from first_page.
  Status Digests(uint32_t region, uint32_t page_bytes, uint64_t first_page, std::span<uint64_t> out);

 private:
  CudaStaging(ShimCall call, shimwire::CudaInfoReply info, std::byte* map, int fd);
  uint32_t TakeSlot();
  void GiveSlot(uint32_t slot);
  Status Xfer(shimwire::Msg type, uint32_t region, uint64_t offset, uint64_t len, uint32_t slot);

  ShimCall call_;
  shimwire::CudaInfoReply info_;
  std::byte* map_;
  int fd_;
  std::mutex mu_;
  std::condition_variable freed_;
  std::vector<uint32_t> free_;
};

}  // namespace gpumigrate::proc
