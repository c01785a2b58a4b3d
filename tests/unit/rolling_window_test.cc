#include <gtest/gtest.h>

#include <cmath>

#include "omni/stats.h"

namespace omni {
namespace {

TEST(RollingWindow, SummarizesKnownValues) {
  RollingWindow w(10);
  for (int v : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) w.Add(v);
  const Summary s = w.Summarize();
  EXPECT_EQ(s.count, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_NEAR(s.stddev, std::sqrt(8.25), 1e-12);
  EXPECT_DOUBLE_EQ(s.p50, 5.5);
  EXPECT_NEAR(s.p95, 9.55, 1e-12);  // linear interpolation between ranks
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(w.mean(), 5.5);
  EXPECT_NEAR(w.stddev(), std::sqrt(8.25), 1e-9);
}

TEST(RollingWindow, KeepsOnlyTheLastCapacityValues) {
  RollingWindow w(3);
  for (int v : {100, 200, 1, 2, 3}) w.Add(v);
  EXPECT_EQ(w.size(), 3);
  EXPECT_DOUBLE_EQ(w.mean(), 2);
  EXPECT_EQ(w.Values(), (std::vector<double>{1, 2, 3}));
  EXPECT_DOUBLE_EQ(w.Summarize().max, 3);
}

TEST(RollingWindow, RunningMomentsStayExactOverManyTurns) {
  RollingWindow w(7);
  for (int i = 0; i < 100000; ++i) w.Add(1e8 + (i % 7) * 1e3);
  const Summary s = w.Summarize();
  EXPECT_NEAR(w.mean(), s.mean, 1e-3);
  EXPECT_NEAR(w.stddev(), s.stddev, 1e-3);
}

TEST(RollingWindow, EmptyWindowSummarizesToZeros) {
  RollingWindow w(5);
  EXPECT_TRUE(w.empty());
  EXPECT_EQ(w.Summarize().count, 0);
  EXPECT_EQ(w.stddev(), 0);
}

}  // namespace
}  // namespace omni
