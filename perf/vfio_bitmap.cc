// Cost of the IOMMU dirty tracker's bitmap work for a large IO address space
// (default 1 TiB of IOVA), at 4 KiB and 2 MiB engine pages, before any hardware
// is used: one DirtyTracker::Sync of the iommufd tracker through the fake
// iommufd (the fake stands in for the kernel's page-table walk and is part of
// the figure), the tracker's own share alone (chunked calls, zeroing and
// folding into the engine's bitmap, with a "kernel" that only ORs in a prepared
// bitmap), and the floor: memcpy of the same bitmap bytes. At 0, 0.1 % and 1 %
// dirty pages; every report is checked to be exactly the pages written.
//   vfio_bitmap [IOVA=1TiB] [REPS=5]
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/devices/vfio/iova_bitmap.h"
#include "gpumigrate/devices/iommu_tracking.h"
#include "gpumigrate/common/stats.h"
#include "gpumigrate/common/units.h"
#include "tests/support/vfio/fake_iommufd.h"

using namespace gpumigrate;
using SteadyClock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kIova = uint64_t{1} << 40;  // where the space starts (1 TiB)

double Ms(SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

[[noreturn]] void Die(const Status& s) {
  fmt::print(stderr, "vfio_bitmap: {}\n", s.ToString());
  std::exit(1);
}

// A fake iommufd with [kIova, kIova + size) mapped and a dirty-tracking HWPT attached.
struct Setup {
  vfio::fake::FakeKernel k;
  std::shared_ptr<vfio::fake::FakeIommufd> iommu = std::make_shared<vfio::fake::FakeIommufd>(true);
  int fd = -1;
  uint32_t hwpt = 0;

  explicit Setup(uint64_t size) {
    fd = k.Install(iommu);
    uint32_t ioas = 0;
    if (int rc = vfio::fake::IoasAlloc(k, fd, &ioas); rc != 0) Die(Status::FromErrno(rc, "IOMMU_IOAS_ALLOC"));
    if (int rc = vfio::fake::IoasMapFixed(k, fd, ioas, kIova, size); rc != 0) {
      Die(Status::FromErrno(rc, "IOMMU_IOAS_MAP"));
    }
    auto h = AllocDirtyTrackingHwpt(k, fd, vfio::fake::FakeIommufd::kDevId, ioas);
    if (!h.ok()) Die(h.status());
    hwpt = *h;
    if (iommu->AttachDevice(hwpt) != 0) Die(Internal("attach"));
  }
};

// The engine's share alone: ReadRegionBitmap over a "kernel" that copies a
// prepared hardware bitmap (`bits`, one bit per hardware page of the region).
double EngineOnlyMs(const vfio::HwRegion& h, const std::vector<uint64_t>& bits, int reps) {
  std::vector<uint64_t> scratch;
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    DirtyBitmap out(h.r.pages());
    auto read = [&](uint64_t iova, uint64_t length, uint64_t page, uint64_t* data) {
      const uint64_t first = (iova - h.r.iova) / page, n = length / page;
      for (uint64_t w = 0; w < (n + 63) / 64; ++w) data[w] |= bits[first / 64 + w];  // the kernel ORs
      return Status::Ok();
    };
    auto t0 = SteadyClock::now();
    if (Status s = vfio::ReadRegionBitmap(h, read, scratch, out); !s.ok()) Die(s);
    ms.push_back(Ms(SteadyClock::now() - t0));
  }
  return UpperMedian(ms);
}

double MemcpyMs(uint64_t bytes, int reps) {
  std::vector<uint64_t> a((bytes + 7) / 8, 1), b((bytes + 7) / 8, 0);
  std::vector<double> ms;
  std::memcpy(b.data(), a.data(), a.size() * 8);  // warm: the first copy also faults the pages in
  for (int i = 0; i < reps; ++i) {
    auto t0 = SteadyClock::now();
    std::memcpy(b.data(), a.data(), a.size() * 8);
    ms.push_back(Ms(SteadyClock::now() - t0));
  }
  volatile uint64_t sink = b[b.size() / 2];  // the copy is used
  (void)sink;
  return UpperMedian(ms);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size = uint64_t{1} << 40;
  int reps = 5;
  if (argc > 1) {
    auto s = ParseSize(argv[1]);
    if (!s.ok()) Die(s.status());
    size = *s / (2 << 20) * (2 << 20);
  }
  if (argc > 2) reps = std::max(1, std::atoi(argv[2]));
  Setup setup(size);
  for (uint64_t page : {uint64_t{4} << 10, uint64_t{2} << 20}) {
    const IovaRegion r{0, kIova, size, page};
    auto prepared = vfio::PrepareRegions({r}, "vfio_bitmap");
    if (!prepared.ok()) Die(prepared.status());
    auto t = MakeIommufdTracker(setup.k, IommufdTarget{setup.fd, vfio::fake::FakeIommufd::kDevId, setup.hwpt}, {r});
    if (!t.ok()) Die(t.status());
    if (Status s = (*t)->Start(); !s.ok()) Die(s);
    const uint64_t bitmap_bytes = (r.pages() + 63) / 64 * 8;
    for (double frac : {0.0, 0.001, 0.01}) {
      const uint64_t n = static_cast<uint64_t>(static_cast<double>(r.pages()) * frac);
      const uint64_t stride = (r.pages() / std::max<uint64_t>(n, 1)) | 1;
      std::vector<uint64_t> prepared_bits(bitmap_bytes / 8, 0);
      std::vector<double> sync_ms;
      int exact = 0;
      for (int i = 0; i < reps; ++i) {
        std::fill(prepared_bits.begin(), prepared_bits.end(), 0);
        for (uint64_t k = 0; k < n; ++k) {
          const uint64_t p = (i + k * stride) % r.pages();
          setup.iommu->DmaWrite(kIova + p * page + 8, 1);
          prepared_bits[p / 64] |= uint64_t{1} << (p % 64);
        }
        DirtyBitmap bm(r.pages());
        auto t0 = SteadyClock::now();
        if (Status s = (*t)->Sync(0, bm); !s.ok()) Die(s);
        sync_ms.push_back(Ms(SteadyClock::now() - t0));
        bool ok = bm.Count() == n;
        for (uint64_t k = 0; k < n && ok; ++k) ok = bm.Test((i + k * stride) % r.pages());
        exact += ok ? 1 : 0;
      }
      nlohmann::ordered_json j;
      j["bench"] = "vfio_bitmap";
      j["tracker"] = (*t)->Name();
      j["iova_bytes"] = size;
      j["page_bytes"] = page;
      j["pages"] = r.pages();
      j["dirty_fraction"] = frac;
      j["dirty_pages"] = n;
      j["bitmap_bytes"] = bitmap_bytes;
      j["sync_through_fake_ms"] = UpperMedian(sync_ms);
      j["engine_share_ms"] = EngineOnlyMs((*prepared)[0], prepared_bits, reps);
      j["floor_memcpy_bitmap_ms"] = MemcpyMs(bitmap_bytes, reps);  // measured beside each row: the machine is shared
      j["exact_reports"] = fmt::format("{}/{}", exact, reps);
      fmt::print("{}\n", j.dump());
    }
    if (Status s = (*t)->Stop(); !s.ok()) Die(s);
  }
  return 0;
}
