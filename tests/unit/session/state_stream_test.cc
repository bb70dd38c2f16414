// StateStreamReceiver with a streaming (vfio:) device: frames go straight to
// the device in order; one off the running offset, or a total the source did
// not count, is refused.
#include "engine/session/state_stream.h"

#include <cstring>

#include <gtest/gtest.h>

#include "engine/devices/vfio/vfio_device.h"
#include "tests/support/vfio/vfio_test_util.h"

namespace gpumigrate {
namespace {

std::vector<std::byte> Record(uint64_t offset, uint32_t length) {
  vfio::fake::FakeRecord h{offset, length, vfio::fake::kFakeRecordMagic};
  std::vector<std::byte> v(sizeof(h) + length, std::byte{0x42});
  std::memcpy(v.data(), &h, sizeof(h));
  return v;
}

wire::FrameHeader At(uint64_t offset, size_t n) {
  wire::FrameHeader h;
  h.type = wire::FrameType::kDeviceState;
  h.region = wire::kDeviceStateRegion;
  h.offset = offset;
  h.raw_length = h.payload_length = static_cast<uint32_t>(n);
  return h;
}

TEST(StateStreamReceiver, WritesAStreamInOrderAndRefusesGapsAndWrongTotals) {
  vfio::fake::FakeVfioConfig cfg;
  cfg.memory_bytes = 64 << 10;
  vfio::fake::FakeHost host(cfg);
  auto dev = vfio::VfioDevice::Open({host.path}, DeviceRole::kDestination, host.kernel);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  ASSERT_TRUE((*dev)->SetState(DeviceState::kResuming).ok());
  StateStreamReceiver rx(**dev);
  auto rec = Record(4096, 100);
  auto first = std::span<const std::byte>(rec).first(50), rest = std::span<const std::byte>(rec).subspan(50);
  ASSERT_TRUE(rx.Apply(At(0, first.size()), first).ok());
  Status gap = rx.Apply(At(60, rest.size()), rest);
  EXPECT_EQ(gap.code(), StatusCode::kCorrupt) << gap.ToString();
  Status again = rx.Apply(At(0, first.size()), first);
  EXPECT_EQ(again.code(), StatusCode::kCorrupt) << "a stream is never restarted: " << again.ToString();
  ASSERT_TRUE(rx.Apply(At(50, rest.size()), rest).ok());
  EXPECT_EQ(rx.Finish(rec.size() + 1).code(), StatusCode::kCorrupt);
  EXPECT_TRUE(rx.Finish(rec.size()).ok());
  ASSERT_TRUE((*dev)->SetState(DeviceState::kStop).ok());
  EXPECT_EQ(host.dev->Memory()[4096], std::byte{0x42}) << "the record reached the device";
}

}  // namespace
}  // namespace gpumigrate
