// gpumigrate-workload's --burst timing (tools/workload/bursts.h): writes only
// in the ON part of each cycle, paced on the ON time alone.
#include "tools/workload/bursts.h"

#include <gtest/gtest.h>

namespace gpumigrate::workload {
namespace {

TEST(WorkloadBursts, WritesOnlyInTheOnPartOfEachCycle) {
  EXPECT_TRUE(Writing(0.0, 0.3, 0.7));
  EXPECT_TRUE(Writing(0.29, 0.3, 0.7));
  EXPECT_FALSE(Writing(0.31, 0.3, 0.7));
  EXPECT_FALSE(Writing(0.99, 0.3, 0.7));
  EXPECT_TRUE(Writing(1.05, 0.3, 0.7));
  EXPECT_TRUE(Writing(12.5, 0, 0)) << "no --burst: always writing";
}

TEST(WorkloadBursts, PacingCountsTheOnTimeAlone) {
  EXPECT_DOUBLE_EQ(OnSeconds(0.2, 0.3, 0.7), 0.2);
  EXPECT_DOUBLE_EQ(OnSeconds(0.5, 0.3, 0.7), 0.3);   // paused: no more ON time
  EXPECT_DOUBLE_EQ(OnSeconds(1.1, 0.3, 0.7), 0.4);
  EXPECT_NEAR(OnSeconds(10.0, 0.3, 0.7), 3.0, 1e-9);  // ten cycles of 0.3 s ON
  EXPECT_DOUBLE_EQ(OnSeconds(2.5, 0, 0), 2.5);
}

}  // namespace
}  // namespace gpumigrate::workload
