// The engine's end of the shim's CUDA staging, against a scripted shim: the
// requests it makes (slots, offsets, lengths), and what it does with replies
// that are malformed.
#include "engine/devices/proc/cuda_staging.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <gtest/gtest.h>

namespace gpumigrate::proc {
namespace {

namespace w = shimwire;

// A shim in this process: a staging memfd of `slots` x `slot_bytes`, "device
// memory" in a vector; records every request.
struct ScriptedShim {
  uint32_t slots = 2;
  uint64_t slot_bytes = 4096;
  std::vector<std::byte> device = std::vector<std::byte>(64 * 1024);
  std::vector<w::CudaXfer> xfers;
  int fd = -1;
  std::byte* map = nullptr;
  bool send_fd = true;
  size_t digest_reply_bytes = SIZE_MAX;  // SIZE_MAX: 8 per page asked

  ~ScriptedShim() {
    if (map != nullptr) munmap(map, slots * slot_bytes);
    if (fd >= 0) close(fd);
  }

  ShimCall Call() {
    return [this](w::Msg type, std::span<const std::byte> p,
                  std::vector<int>* fds) -> Result<std::vector<std::byte>> {
      if (type == w::Msg::kCudaInfo) {
        fd = memfd_create("staging-test", MFD_CLOEXEC);
        if (ftruncate(fd, static_cast<off_t>(slots * slot_bytes)) != 0) return Internal("ftruncate");
        map = static_cast<std::byte*>(mmap(nullptr, slots * slot_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
        w::CudaInfoReply r;
        r.slots = slots;
        r.slot_bytes = slot_bytes;
        r.staging_bytes = slots * slot_bytes;
        r.gpu_hash = 1;
        std::snprintf(r.note, sizeof(r.note), "scripted");
        if (send_fd) fds->push_back(dup(fd));
        auto b = std::as_bytes(std::span(&r, 1));
        return std::vector<std::byte>(b.begin(), b.end());
      }
      if (type == w::Msg::kCudaHash) {
        w::CudaHashReq q;
        std::memcpy(&q, p.data(), sizeof(q));
        return std::vector<std::byte>(digest_reply_bytes == SIZE_MAX ? q.pages * 8 : digest_reply_bytes);
      }
      w::CudaXfer x;
      std::memcpy(&x, p.data(), sizeof(x));
      xfers.push_back(x);
      std::byte* slot = map + x.slot * slot_bytes;
      if (type == w::Msg::kCudaRead) std::memcpy(slot, device.data() + x.offset, x.len);
      if (type == w::Msg::kCudaWrite) std::memcpy(device.data() + x.offset, slot, x.len);
      return std::vector<std::byte>();
    };
  }
};

TEST(CudaStaging, ReadsAndWritesInSlotSizedRequests) {
  ScriptedShim shim;
  for (size_t i = 0; i < shim.device.size(); ++i) shim.device[i] = static_cast<std::byte>(i * 7);
  auto st = CudaStaging::Open(shim.Call(), w::CudaHashMode::kAuto);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_TRUE((*st)->gpu_hash());
  EXPECT_EQ((*st)->note(), "scripted");
  std::vector<std::byte> out(10000);
  ASSERT_TRUE((*st)->Read(3, 100, out).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), shim.device.data() + 100, out.size()));
  ASSERT_EQ(shim.xfers.size(), 3u);  // 4096 + 4096 + 1808
  EXPECT_EQ(shim.xfers[0].region, 3u);
  EXPECT_EQ(shim.xfers[0].offset, 100u);
  EXPECT_EQ(shim.xfers[1].offset, 4196u);
  EXPECT_EQ(shim.xfers[2].len, 1808u);
  shim.xfers.clear();
  std::vector<std::byte> in(5000, std::byte{0x42});
  ASSERT_TRUE((*st)->Write(0, 20000, in).ok());
  EXPECT_EQ(shim.xfers.size(), 2u);
  EXPECT_EQ(shim.device[20000], std::byte{0x42});
  EXPECT_EQ(shim.device[24999], std::byte{0x42});
  EXPECT_NE(shim.device[25000], std::byte{0x42});
}

TEST(CudaStaging, RefusesMalformedReplies) {
  ScriptedShim no_fd;
  no_fd.send_fd = false;
  auto st = CudaStaging::Open(no_fd.Call(), w::CudaHashMode::kAuto);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("malformed CUDA info"), std::string::npos) << st.status().message();

  ScriptedShim bad_geometry;
  bad_geometry.slots = 0;
  st = CudaStaging::Open(bad_geometry.Call(), w::CudaHashMode::kAuto);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("inconsistent"), std::string::npos) << st.status().message();

  ScriptedShim short_digests;
  short_digests.digest_reply_bytes = 24;
  st = CudaStaging::Open(short_digests.Call(), w::CudaHashMode::kAuto);
  ASSERT_TRUE(st.ok());
  std::vector<uint64_t> d(4);
  Status s = (*st)->Digests(0, 65536, 0, d);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("24 bytes of digests for 4 pages"), std::string::npos) << s.message();
  EXPECT_FALSE((*st)->Digests(0, 65536, 0, std::span<uint64_t>()).ok());
}

}  // namespace
}  // namespace gpumigrate::proc
