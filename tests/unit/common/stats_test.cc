#include "gpumigrate/common/stats.h"

#include <cmath>

#include <gtest/gtest.h>

namespace gpumigrate {
namespace {

TEST(Stats, MedianOfAnOddCountIsTheMiddleValue) {
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(UpperMedian({3, 1, 2}), 2);
  EXPECT_EQ(Median({7}), 7);
  EXPECT_EQ(UpperMedian({7}), 7);
}

TEST(Stats, MedianOfAnEvenCountAveragesTheMiddlePairUpperMedianTakesItsUpperValue) {
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(UpperMedian({4, 1, 3, 2}), 3);
  EXPECT_EQ(Median({10, 0}), 5);
  EXPECT_EQ(UpperMedian({10, 0}), 10);
}

TEST(Stats, NoValuesGiveNaN) {
  EXPECT_TRUE(std::isnan(Median({})));
  EXPECT_TRUE(std::isnan(UpperMedian({})));
}

}  // namespace
}  // namespace gpumigrate
