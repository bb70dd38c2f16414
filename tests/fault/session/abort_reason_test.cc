// Whose reason a failed migration reports. When the destination aborts (its
// device refused a write) it sends Abort and closes its streams; the source may
// meet the closed stream before it has read the Abort. Either way the report
// leads with the destination's reason: the broken stream is its echo, and
// "the destination closed the connection" would send the operator to look at
// the network instead of the device.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "gpumigrate/session/local_migration.h"
#include "tests/support/fake_device.h"

namespace gpumigrate {
namespace {

using testing::FakeDevice;
using namespace std::chrono_literals;

// Holds back each message read on the source's control channel once armed, so
// that the source's own broken data stream is what it sees first.
class LateReads final : public Stream {
 public:
  LateReads(std::unique_ptr<Stream> inner, std::atomic<bool>& armed) : inner_(std::move(inner)), armed_(armed) {}
  std::string Name() const override { return inner_->Name(); }
  Status WriteAll(std::span<const std::byte> data) override { return inner_->WriteAll(data); }
  Status ReadExact(std::span<std::byte> out) override {
    Status st = inner_->ReadExact(out);
    if (armed_.load()) std::this_thread::sleep_for(150ms);
    return st;
  }
  void Close() override { inner_->Close(); }

 private:
  std::unique_ptr<Stream> inner_;
  std::atomic<bool>& armed_;
};

std::vector<RegionInfo> Layout() { return {RegionInfo{0, "a", 8 << 20, 4096, RegionHint::kDynamic}}; }

TEST(AbortReason, ADestinationAbortMetAsABrokenStreamReportsTheDestinationsReason) {
  FakeDevice src{Layout(), DeviceState::kRunning};
  FakeDevice dst{Layout(), DeviceState::kStop};
  for (uint64_t p = 0; p < 2048; ++p) src.Touch(0, p, static_cast<uint8_t>(p + 1));
  dst.fail_writes = true;  // the first frame is refused: the destination aborts
  std::atomic<bool> armed{false};
  LocalMigrationOptions opt;
  opt.source.max_frame_payload_bytes = 4096;  // 2048 frames: still sending when the destination closes
  for (auto* o : {&opt.source.keepalive_interval, &opt.destination.keepalive_interval}) *o = 5s;
  for (auto* o : {&opt.source.peer_silence_timeout, &opt.destination.peer_silence_timeout}) *o = 20s;
  opt.source.on_phase = [&](Phase p, uint32_t) {
    if (p == Phase::kRoundStart) armed = true;
  };
  opt.wrap_source_end = [&](std::unique_ptr<Stream> s, int index) -> std::unique_ptr<Stream> {
    if (index != -1) return s;
    return std::make_unique<LateReads>(std::move(s), armed);
  };
  auto res = MigrateLocally(src, dst, opt);
  const std::string& why = res.source.status.message();
  EXPECT_EQ(res.source.outcome, Outcome::kAborted);
  EXPECT_EQ(res.source.status.code(), StatusCode::kAborted) << res.source.status.ToString();
  EXPECT_NE(why.find("destination aborted in phase"), std::string::npos) << why;
  EXPECT_NE(why.find("fake: write failed"), std::string::npos) << why;
  EXPECT_EQ(why.find("closed the connection"), std::string::npos) << why;
  EXPECT_EQ(src.State(), DeviceState::kRunning);
  EXPECT_EQ(res.destination.outcome, Outcome::kAborted);
}

}  // namespace
}  // namespace gpumigrate
