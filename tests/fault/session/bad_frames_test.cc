// Damaged frames on a data stream: each is rejected with an error that names the
// stream, the frame and the reason; the source keeps running, intact.
#include <gtest/gtest.h>

#include <thread>

#include "gpumigrate/session/local_migration.h"
#include "gpumigrate/devices/sim.h"
#include "tests/fault/support_source_intact.h"
#include "transport/net/fault_stream.h"

namespace gpumigrate {
namespace {

using testing::ExpectSourceRunningAndIntact;
using testing::WeightsHash;

struct FlipCase {
  const char* name;
  uint64_t byte;           // offset in the data stream (frame 0 starts at 0)
  const char* expect;      // in the destination's error
};

void PrintTo(const FlipCase& c, std::ostream* os) { *os << c.name << " at byte " << c.byte; }

class BadFrames : public ::testing::TestWithParam<FlipCase> {};

TEST_P(BadFrames, RejectedWithStreamFrameAndReason) {
  const FlipCase& c = GetParam();
  SimSpec spec = *ParseSimSpec("sim:size=8MiB,hot=512KiB,page=16KiB,step=2ms");
  auto src = *SimDevice::Create(spec, SimRole::kSource);
  auto dst = *SimDevice::Create(spec, SimRole::kDestination);
  uint64_t weights = WeightsHash(*src);
  LocalMigrationOptions opt;
  opt.source.max_frame_payload_bytes = 64 << 10;
  opt.wrap_source_end = [&](std::unique_ptr<Stream> s, int index) -> std::unique_ptr<Stream> {
    if (index != 0) return s;
    return std::make_unique<FaultStream>(std::move(s), FaultPlan{.flip_at_byte = c.byte});
  };
  auto res = MigrateLocally(*src, *dst, opt);
  ASSERT_EQ(res.source.outcome, Outcome::kAborted);
  const std::string& dmsg = res.destination.status.message();
  EXPECT_NE(dmsg.find("data stream 0, frame 0"), std::string::npos) << dmsg;
  EXPECT_NE(dmsg.find(c.expect), std::string::npos) << dmsg;
  // The source reports the destination's reason, not just a broken pipe.
  EXPECT_NE(res.source.status.message().find(c.expect), std::string::npos) << res.source.status.message();
  EXPECT_EQ(dst->State(), DeviceState::kError);
  ExpectSourceRunningAndIntact(*src, weights);
}

INSTANTIATE_TEST_SUITE_P(
    Flips, BadFrames,
    ::testing::Values(FlipCase{"magic", 1, "bad frame magic"},
                      FlipCase{"version", 4, "frame format version"},
                      FlipCase{"type", 6, "unknown frame type"},
                      FlipCase{"stream", 8, "claims stream"},
                      FlipCase{"sequence", 16, "sequence 1 where 0 was expected"},
                      FlipCase{"offset_high", 39, "outside region"},
                      FlipCase{"payload_length_high", 47, "exceeds the negotiated"},
                      FlipCase{"payload", 48 + 4000, "tag mismatch"},
                      FlipCase{"tag", 48 + 65536 + 3, "tag mismatch"},
                      FlipCase{"round", 24, "tag mismatch"}),
    [](const ::testing::TestParamInfo<FlipCase>& p) { return std::string(p.param.name); });

}  // namespace
}  // namespace gpumigrate
