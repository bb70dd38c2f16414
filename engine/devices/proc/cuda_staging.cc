#include "engine/devices/proc/cuda_staging.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace gpumigrate::proc {

namespace w = shimwire;

Result<std::unique_ptr<CudaStaging>> CudaStaging::Open(ShimCall call, w::CudaHashMode mode) {
  w::CudaInfoReq req;
  req.hash_mode = static_cast<uint32_t>(mode);
  std::vector<int> fds;
  GM_ASSIGN_OR_RETURN(auto reply, call(w::Msg::kCudaInfo, std::as_bytes(std::span(&req, 1)), &fds));
  auto close_fds = [&] {
    for (int fd : fds) close(fd);
  };
  w::CudaInfoReply info;
  if (reply.size() != sizeof(info) || fds.size() != 1) {
    close_fds();
    return Corrupt("cuda staging: malformed CUDA info from the shim");
  }
  std::memcpy(&info, reply.data(), sizeof(info));
  info.note[sizeof(info.note) - 1] = '\0';
  if (info.slots == 0 || info.slot_bytes == 0 || info.staging_bytes != info.slot_bytes * info.slots) {
    close_fds();
    return Corrupt("cuda staging: the shim's staging geometry is inconsistent");
  }
  void* m = mmap(nullptr, info.staging_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fds[0], 0);
  if (m == MAP_FAILED) {
    const int e = errno;
    close_fds();
    return Internal(fmt::format("cuda staging: mapping the staging memfd ({} bytes) failed: {}", info.staging_bytes,
                                std::strerror(e)));
  }
  return std::unique_ptr<CudaStaging>(new CudaStaging(std::move(call), info, static_cast<std::byte*>(m), fds[0]));
}

CudaStaging::CudaStaging(ShimCall call, w::CudaInfoReply info, std::byte* map, int fd)
    : call_(std::move(call)), info_(info), map_(map), fd_(fd) {
  for (uint32_t s = 0; s < info_.slots; ++s) free_.push_back(s);
}

CudaStaging::~CudaStaging() {
  munmap(map_, info_.staging_bytes);
  close(fd_);
}

uint32_t CudaStaging::TakeSlot() {
  std::unique_lock lk(mu_);
  freed_.wait(lk, [&] { return !free_.empty(); });
  const uint32_t s = free_.back();
  free_.pop_back();
  return s;
}

void CudaStaging::GiveSlot(uint32_t slot) {
  {
    std::lock_guard lk(mu_);
    free_.push_back(slot);
  }
  freed_.notify_one();
}

Status CudaStaging::Xfer(w::Msg type, uint32_t region, uint64_t offset, uint64_t len, uint32_t slot) {
  w::CudaXfer x;
  x.region = region;
  x.slot = slot;
  x.offset = offset;
  x.len = len;
  return call_(type, std::as_bytes(std::span(&x, 1)), nullptr).status();
}

Status CudaStaging::Read(uint32_t region, uint64_t offset, std::span<std::byte> out) {
  for (uint64_t done = 0; done < out.size();) {
    const uint64_t n = std::min<uint64_t>(info_.slot_bytes, out.size() - done);
    const uint32_t slot = TakeSlot();
    Status st = Xfer(w::Msg::kCudaRead, region, offset + done, n, slot);
    if (st.ok()) std::memcpy(out.data() + done, map_ + uint64_t{slot} * info_.slot_bytes, n);
    GiveSlot(slot);
    GM_RETURN_IF_ERROR(st.WithContext(fmt::format("cuda staging: read of region {} at {}", region, offset + done)));
    done += n;
  }
  return Status::Ok();
}

Status CudaStaging::Write(uint32_t region, uint64_t offset, std::span<const std::byte> in) {
  for (uint64_t done = 0; done < in.size();) {
    const uint64_t n = std::min<uint64_t>(info_.slot_bytes, in.size() - done);
    const uint32_t slot = TakeSlot();
    std::memcpy(map_ + uint64_t{slot} * info_.slot_bytes, in.data() + done, n);
    Status st = Xfer(w::Msg::kCudaWrite, region, offset + done, n, slot);
    GiveSlot(slot);
    GM_RETURN_IF_ERROR(st.WithContext(fmt::format("cuda staging: write of region {} at {}", region, offset + done)));
    done += n;
  }
  return Status::Ok();
}

Status CudaStaging::Zero(uint32_t region, uint64_t offset, uint64_t length) {
  return Xfer(w::Msg::kCudaZero, region, offset, length, 0)
      .WithContext(fmt::format("cuda staging: zeroing region {} at {}", region, offset));
}

Status CudaStaging::Digests(uint32_t region, uint32_t page_bytes, uint64_t first_page, std::span<uint64_t> out) {
  if (out.empty() || out.size() > w::kMaxHashPages) {
    return InvalidArgument(fmt::format("cuda staging: {} pages per hash request (1 to {})", out.size(),
                                       w::kMaxHashPages));
  }
  w::CudaHashReq q;
  q.region = region;
  q.page_bytes = page_bytes;
  q.first_page = first_page;
  q.pages = out.size();
  GM_ASSIGN_OR_RETURN(auto reply, call_(w::Msg::kCudaHash, std::as_bytes(std::span(&q, 1)), nullptr));
  if (reply.size() != out.size_bytes()) {
    return Corrupt(fmt::format("cuda staging: the shim sent {} bytes of digests for {} pages", reply.size(),
                               out.size()));
  }
  std::memcpy(out.data(), reply.data(), reply.size());
  return Status::Ok();
}

}  // namespace gpumigrate::proc
