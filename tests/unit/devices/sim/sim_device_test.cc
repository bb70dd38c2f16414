#include "gpumigrate/devices/sim.h"

#include <algorithm>
#include <array>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpumigrate/devices/dirty_tracker.h"

namespace gpumigrate {
namespace {

std::unique_ptr<SimDevice> Make(const std::string& text, SimRole role) {
  auto spec = ParseSimSpec(text);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto dev = SimDevice::Create(*spec, role);
  EXPECT_TRUE(dev.ok()) << dev.status().ToString();
  return std::move(dev).value();
}

bool AllZero(const std::vector<std::byte>& v) {
  return std::all_of(v.begin(), v.end(), [](std::byte b) { return b == std::byte{0}; });
}

TEST(SimSpec, DefaultsAndKeys) {
  auto llm = ParseSimSpec("sim:llm");
  ASSERT_TRUE(llm.ok());
  EXPECT_EQ(llm->size_bytes, 4ull << 30);
  auto s = ParseSimSpec("sim:size=256MiB,static=0.7,kv_rate=10MiB/s,hot=8MiB,seed=9,page=4KiB,step=5ms,layers=8");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->size_bytes, 256ull << 20);
  EXPECT_DOUBLE_EQ(s->static_fraction, 0.7);
  EXPECT_DOUBLE_EQ(s->kv_fraction, 0.3);  // unset keys keep the sim:llm values
  EXPECT_EQ(s->hot_bytes, 8ull << 20);
  EXPECT_EQ(s->seed, 9u);
  EXPECT_EQ(s->page_size, 4096u);
  EXPECT_EQ(s->layers, 8u);
  auto round_trip = ParseSimSpec(s->ToString());
  ASSERT_TRUE(round_trip.ok()) << round_trip.status().ToString() << " for " << s->ToString();
  EXPECT_EQ(round_trip->ToString(), s->ToString());
}

// data=noise: the weights and KV cache hold random bytes, what no codec can
// shrink (the throughput benchmark's incompressible case); the spec round-trips.
TEST(SimSpec, NoiseDataIsRandomBytesAndRoundTrips) {
  auto s = ParseSimSpec("sim:size=64MiB,static=0.5,kv_rate=0,hot=4MiB,data=noise");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(s->noise);
  EXPECT_NE(s->ToString().find(",data=noise"), std::string::npos);
  EXPECT_TRUE(ParseSimSpec(s->ToString())->noise);
  EXPECT_EQ(ParseSimSpec("sim:size=64MiB,hot=4MiB")->ToString().find("data="), std::string::npos);  // bf16: as before
  auto bad = ParseSimSpec("sim:data=zeros");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("data=zeros must be bf16"), std::string::npos) << bad.status().message();

  auto noise = Make("sim:size=64MiB,static=0.5,kv_rate=0,hot=4MiB,data=noise", SimRole::kSource);
  auto bf16 = Make("sim:size=64MiB,static=0.5,kv_rate=0,hot=4MiB", SimRole::kSource);
  std::vector<std::byte> a(1 << 20), b(1 << 20);
  ASSERT_TRUE(noise->Read(0, 0, a).ok());
  ASSERT_TRUE(bf16->Read(0, 0, b).ok());
  // bf16 weights near 0: the high byte of each value takes few values; random bytes take all 256.
  std::array<int, 256> hi_noise{}, hi_bf16{};
  for (size_t i = 1; i < a.size(); i += 2) {
    ++hi_noise[std::to_integer<uint8_t>(a[i])];
    ++hi_bf16[std::to_integer<uint8_t>(b[i])];
  }
  auto used = [](const std::array<int, 256>& c) { return std::count_if(c.begin(), c.end(), [](int n) { return n > 0; }); };
  EXPECT_EQ(used(hi_noise), 256);
  EXPECT_LT(used(hi_bf16), 64);
  std::vector<std::byte> again(1 << 20);
  ASSERT_TRUE(noise->Read(0, 0, again).ok());
  EXPECT_EQ(a, again);  // deterministic: the destination's check can recompute it
}

TEST(SimSpec, ErrorsNameTheProblem) {
  auto bad_key = ParseSimSpec("sim:size=1GiB,colour=blue");
  ASSERT_FALSE(bad_key.ok());
  EXPECT_NE(bad_key.status().message().find("unknown key 'colour'"), std::string::npos);
  EXPECT_FALSE(ParseSimSpec("sim:static=1.5").ok());
  EXPECT_FALSE(ParseSimSpec("sim:page=3000").ok());
  EXPECT_FALSE(ParseSimSpec("sim:size=lots").ok());
  EXPECT_FALSE(ParseSimSpec("sim:size=64KiB").ok());  // smaller than four pages
  EXPECT_FALSE(ParseSimSpec("proc:123").ok());
  EXPECT_FALSE(ParseSimSpec("sim:static=0.99,hot=100MiB,size=100MiB").ok());
}

TEST(SimDevice, LayoutAndInitialContents) {
  auto dev = Make("sim:size=64MiB,static=0.5,kv=0.25,kv_fill=0.5,kv_rate=0,hot=4MiB,page=64KiB", SimRole::kSource);
  const auto& regions = dev->Regions();
  ASSERT_EQ(regions.size(), 4u);
  EXPECT_EQ(regions[0].name, "weights");
  EXPECT_EQ(regions[0].hint, RegionHint::kStatic);
  EXPECT_EQ(regions[0].size_bytes, 32ull << 20);
  EXPECT_EQ(regions[1].size_bytes, 16ull << 20);
  EXPECT_EQ(regions[2].size_bytes, 4ull << 20);
  EXPECT_EQ(regions[3].size_bytes, 12ull << 20);
  std::vector<std::byte> page(64 << 10);
  ASSERT_TRUE(dev->Read(0, 0, page).ok());
  EXPECT_FALSE(AllZero(page));
  ASSERT_TRUE(dev->Read(3, 0, page).ok());
  EXPECT_TRUE(AllZero(page));  // free pool
  ASSERT_TRUE(dev->Read(1, (16ull << 20) - page.size(), page).ok());
  EXPECT_TRUE(AllZero(page));  // KV cache beyond the fill is still empty
  // Unaligned reads agree with aligned ones.
  std::vector<std::byte> whole(3 * page.size()), part(100000);
  ASSERT_TRUE(dev->Read(0, 0, whole).ok());
  ASSERT_TRUE(dev->Read(0, 1234, part).ok());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + 1234));
  EXPECT_FALSE(dev->Read(0, (32ull << 20) - 10, page).ok());  // past the region's end
  EXPECT_FALSE(dev->Read(7, 0, page).ok());
}

TEST(SimDevice, TrackerReportsWorkloadWritesButNeverWeights) {
  const std::string spec = "sim:size=32MiB,hot=2MiB,kv_rate=64MiB/s,page=16KiB,step=2ms";
  auto dev = Make(spec, SimRole::kSource);
  DirtyTracker* t = dev->Tracker();
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Start().ok());
  // Two whole steps after Start (every layer's kernel ran at least once since),
  // however slowly a loaded machine schedules the workload: a fixed sleep was
  // flaky under load.
  const uint64_t until = dev->KernelsRun() + 2 * ParseSimSpec(spec)->layers;
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  for (int i = 0; i < 10000 && dev->KernelsRun() < until; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GE(dev->KernelsRun(), until) << "the workload ran no steps in 10 s";
  std::vector<DirtyBitmap> maps;
  for (const auto& r : dev->Regions()) {
    maps.emplace_back(r.pages());
    ASSERT_TRUE(t->Sync(r.id, maps.back()).ok());
  }
  EXPECT_EQ(maps[0].Count(), 0u) << "weights are never written";
  EXPECT_GT(maps[1].Count(), 0u) << "the KV cache grows";
  EXPECT_EQ(maps[2].Count(), maps[2].pages()) << "every activation page is rewritten each step";
  EXPECT_EQ(maps[3].Count(), 0u);
  DirtyBitmap wrong(3);
  EXPECT_FALSE(t->Sync(0, wrong).ok());
}

// A released source reads as zeros afterwards; a running one is refused.
TEST(SimDevice, ScrubZeroesAStoppedSourceAndRefusesARunningOne) {
  auto dev = Make("sim:size=16MiB,hot=1MiB,page=16KiB,step=1ms,layers=4", SimRole::kSource);
  Status running = dev->Scrub();
  ASSERT_FALSE(running.ok());
  EXPECT_NE(running.message().find("its workload runs"), std::string::npos) << running.message();
  ASSERT_TRUE(dev->SetState(DeviceState::kPreCopy).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStopCopy).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStop).ok());
  std::vector<std::byte> page(64 << 10);
  ASSERT_TRUE(dev->Read(0, 0, page).ok());
  ASSERT_FALSE(AllZero(page)) << "weights before the scrub";
  ASSERT_TRUE(dev->Scrub().ok());
  for (const auto& r : dev->Regions()) {
    std::vector<std::byte> all(r.size_bytes);
    ASSERT_TRUE(dev->Read(r.id, 0, all).ok());
    EXPECT_TRUE(AllZero(all)) << r.name << " still holds data";
  }
}

TEST(SimDevice, SourceLifecyclePausesAndResumesTheWorkload) {
  auto dev = Make("sim:size=16MiB,hot=1MiB,page=16KiB,step=1ms,layers=4", SimRole::kSource);
  EXPECT_EQ(dev->State(), DeviceState::kRunning);
  EXPECT_FALSE(dev->SetState(DeviceState::kResuming).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kPreCopy).ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kStopCopy).ok());
  uint64_t k = dev->KernelsRun();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dev->KernelsRun(), k) << "STOP_COPY must quiesce the workload";
  auto blob = dev->SaveState();
  ASSERT_TRUE(blob.ok());
  ASSERT_TRUE(dev->SetState(DeviceState::kRunning).ok());  // rollback arc
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(dev->KernelsRun(), k);
  EXPECT_FALSE(dev->SaveState().ok()) << "device state is saved only in STOP_COPY";
  std::vector<std::byte> data(16);
  EXPECT_EQ(dev->Write(0, 0, data).code(), StatusCode::kFailedPrecondition);
}

TEST(SimDevice, DestinationAcceptsWritesOnlyWhileResumingAndWithinBounds) {
  auto dst = Make("sim:size=16MiB,hot=1MiB,page=16KiB", SimRole::kDestination);
  EXPECT_EQ(dst->State(), DeviceState::kStop);
  std::vector<std::byte> data(16384, std::byte{0x5a});
  EXPECT_FALSE(dst->Write(0, 0, data).ok());
  ASSERT_TRUE(dst->SetState(DeviceState::kResuming).ok());
  ASSERT_TRUE(dst->Write(0, 16384, data).ok());
  const uint64_t weights = dst->Regions()[0].size_bytes;
  EXPECT_FALSE(dst->Write(0, weights - 100, data).ok());
  EXPECT_FALSE(dst->Write(0, ~uint64_t{0} - 5, data).ok());  // offset + length overflows
  std::vector<std::byte> back(16384);
  ASSERT_TRUE(dst->Read(0, 16384, back).ok());
  EXPECT_EQ(back, data);
  EXPECT_FALSE(dst->SetState(DeviceState::kStop).ok()) << "no device state loaded yet";
  // Discard: ERROR forgets everything received.
  ASSERT_TRUE(dst->SetState(DeviceState::kError).ok());
  ASSERT_TRUE(dst->Read(0, 16384, back).ok());
  EXPECT_TRUE(AllZero(back));
}

TEST(SimDevice, DeviceStateRoundTripsAndRejectsOtherGeometry) {
  const std::string spec = "sim:size=16MiB,hot=1MiB,page=16KiB,step=1ms,layers=4";
  auto src = Make(spec, SimRole::kSource);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(src->SetState(DeviceState::kStopCopy).ok());
  auto blob = src->SaveState();
  ASSERT_TRUE(blob.ok());

  auto dst = Make(spec, SimRole::kDestination);
  ASSERT_TRUE(dst->SetState(DeviceState::kResuming).ok());
  std::vector<std::byte> truncated(blob->begin(), blob->end() - 1);
  EXPECT_EQ(dst->LoadState(truncated).code(), StatusCode::kCorrupt);
  std::vector<std::byte> bad_magic = *blob;
  bad_magic[0] = std::byte{'X'};
  EXPECT_EQ(dst->LoadState(bad_magic).code(), StatusCode::kCorrupt);
  ASSERT_TRUE(dst->LoadState(*blob).ok());
  EXPECT_EQ(dst->Position().step, src->Position().step);
  EXPECT_EQ(dst->Position().layer, src->Position().layer);

  auto other = Make("sim:size=32MiB,hot=1MiB,page=16KiB,step=1ms,layers=4", SimRole::kDestination);
  ASSERT_TRUE(other->SetState(DeviceState::kResuming).ok());
  Status mismatch = other->LoadState(*blob);
  EXPECT_EQ(mismatch.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("does not match"), std::string::npos);
}

// The self-check a resumed workload runs must catch one stale activation page.
TEST(SimDevice, SelfCheckCatchesAStalePage) {
  const std::string spec = "sim:size=16MiB,hot=1MiB,page=16KiB,step=1ms,layers=8";
  auto src = Make(spec, SimRole::kSource);
  std::this_thread::sleep_for(std::chrono::milliseconds(15));
  ASSERT_TRUE(src->SetState(DeviceState::kStopCopy).ok());
  auto dst = Make(spec, SimRole::kDestination);
  ASSERT_TRUE(dst->SetState(DeviceState::kResuming).ok());
  const RegionInfo& act = src->Regions()[2];
  std::vector<std::byte> buf(act.size_bytes);
  ASSERT_TRUE(src->Read(act.id, 0, buf).ok());
  ASSERT_TRUE(dst->Write(act.id, 0, buf).ok());
  ASSERT_TRUE(dst->LoadState(*src->SaveState()).ok());
  ASSERT_TRUE(dst->SetState(DeviceState::kStop).ok());
  auto ok = dst->SelfCheck();
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, act.pages());

  // Now make page 5 hold the previous step's contents, as a lost dirty page would.
  ASSERT_TRUE(dst->SetState(DeviceState::kError).ok());
  ASSERT_TRUE(dst->SetState(DeviceState::kStop).ok());
  ASSERT_TRUE(dst->SetState(DeviceState::kResuming).ok());
  ASSERT_TRUE(dst->Write(act.id, 0, buf).ok());
  std::vector<std::byte> stale(act.page_size);
  ASSERT_TRUE(src->Read(act.id, 6 * act.page_size, stale).ok());  // another page's bytes
  ASSERT_TRUE(dst->Write(act.id, 5 * act.page_size, stale).ok());
  ASSERT_TRUE(dst->LoadState(*src->SaveState()).ok());
  ASSERT_TRUE(dst->SetState(DeviceState::kStop).ok());
  auto bad = dst->SelfCheck();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("activation page 5"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace gpumigrate
