// Checks shared by fault tests: after an aborted migration the source is
// RUNNING, its workload still makes progress and its memory is intact (the
// workload's own self-check passes and the static weights are unchanged).
#pragma once

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include <xxhash.h>

#include "gpumigrate/devices/sim.h"

namespace gpumigrate::testing {

inline uint64_t WeightsHash(SimDevice& dev) {
  const RegionInfo& w = dev.Regions()[0];
  std::vector<std::byte> buf(w.size_bytes);
  EXPECT_TRUE(dev.Read(w.id, 0, buf).ok());
  return XXH3_64bits(buf.data(), buf.size());
}

inline void ExpectSourceRunningAndIntact(SimDevice& src, uint64_t weights_hash_before) {
  ASSERT_EQ(src.State(), DeviceState::kRunning);
  uint64_t k = src.KernelsRun();
  for (int i = 0; i < 200 && src.KernelsRun() == k; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GT(src.KernelsRun(), k) << "the source workload must keep running";
  EXPECT_EQ(WeightsHash(src), weights_hash_before);
  ASSERT_TRUE(src.SetState(DeviceState::kStop).ok());
  auto check = src.SelfCheck();
  EXPECT_TRUE(check.ok()) << check.status().ToString();
  ASSERT_TRUE(src.SetState(DeviceState::kRunning).ok());
}

}  // namespace gpumigrate::testing
