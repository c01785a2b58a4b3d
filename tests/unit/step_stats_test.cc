#include <gtest/gtest.h>

#include "omni/stats.h"
#include "test_util.h"

namespace omni {
namespace {

using testing::kMs;
using testing::MakeStep;

StepRecord Normal(int64_t step, int64_t start_ms, int64_t dur_ms) {
  const int64_t dw = dur_ms / 5;
  return MakeStep(step, start_ms, dur_ms,
                  {{phase::kDataWait, 0, dw},
                   {phase::kCompute, dw, dur_ms - 5},
                   {phase::kOptimizer, dur_ms - 5, dur_ms}});
}

StepStatsOptions NoWarmup() {
  StepStatsOptions o;
  o.warmup.max_steps = 0;
  o.warmup.min_steps = 0;
  return o;
}

TEST(StepStats, LeavesWarmupOutUntilStepTimeIsStationary) {
  auto stats = StepStats::Create(StepStatsOptions{});
  ASSERT_TRUE(stats.ok());
  int64_t t = 0, step = 0;
  for (int64_t d : {500, 400, 300, 200, 100, 100, 100, 100, 100, 100, 100, 100}) {
    ASSERT_TRUE(stats->Add(Normal(step++, t, d)).ok());
    t += d;
  }
  // The last 10 steps are [300, 200, 100 x 8]: both halves have median 100.
  EXPECT_FALSE(stats->warming_up());
  EXPECT_EQ(stats->warmup_steps(), 12);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(stats->Add(Normal(step++, t, 100)).ok());
    t += 100;
  }
  const Summary s = stats->steps(StepKind::kNormal).Summarize();
  EXPECT_EQ(s.count, 20);
  EXPECT_DOUBLE_EQ(s.max, 100.0 * kMs);
  EXPECT_DOUBLE_EQ(s.mean, 100.0 * kMs);
}

TEST(StepStats, WarmupEndsAtMaxStepsEvenIfNeverStationary) {
  StepStatsOptions o;
  o.warmup.max_steps = 30;
  auto stats = StepStats::Create(o);
  int64_t t = 0;
  for (int i = 0; i < 40; ++i) {
    const int64_t d = 100 + i * 50;  // drifting
    ASSERT_TRUE(stats->Add(Normal(i, t, d)).ok());
    t += d;
  }
  EXPECT_FALSE(stats->warming_up());
  EXPECT_EQ(stats->warmup_steps(), 30);
  EXPECT_EQ(stats->steps(StepKind::kNormal).size(), 10);
}

TEST(StepStats, CheckpointStepIsAttributedToCheckpointNotToStepTime) {
  auto stats = StepStats::Create(NoWarmup());
  int64_t t = 0;
  for (int i = 0; i < 5; ++i, t += 100) ASSERT_TRUE(stats->Add(Normal(i, t, 100)).ok());
  ASSERT_TRUE(stats
                  ->Add(MakeStep(5, t, 500,
                                 {{phase::kDataWait, 0, 20},
                                  {phase::kCompute, 20, 95},
                                  {phase::kOptimizer, 95, 100},
                                  {phase::kCheckpoint, 100, 500}}))
                  .ok());
  EXPECT_EQ(stats->steps(StepKind::kNormal).size(), 5);
  EXPECT_DOUBLE_EQ(stats->steps(StepKind::kNormal).Summarize().max, 100.0 * kMs);
  EXPECT_EQ(stats->steps(StepKind::kCheckpoint).size(), 1);
  EXPECT_DOUBLE_EQ(stats->steps(StepKind::kCheckpoint).mean(), 500.0 * kMs);
  EXPECT_DOUBLE_EQ(stats->phase_total(phase::kCheckpoint).mean(), 400.0 * kMs);
}

TEST(StepStats, WorkNestedInEvalDoesNotInflateComputeStatistics) {
  auto stats = StepStats::Create(NoWarmup());
  ASSERT_TRUE(stats->Add(MakeStep(0, 0, 100, {{phase::kCompute, 0, 60}})).ok());
  ASSERT_TRUE(
      stats
          ->Add(MakeStep(
              1, 100, 300,
              {{phase::kCompute, 0, 60}, {phase::kEval, 100, 300}, {phase::kCompute, 100, 200, 1}}))
          .ok());
  EXPECT_EQ(stats->phase_total(phase::kCompute).size(), 2);
  EXPECT_DOUBLE_EQ(stats->phase_total(phase::kCompute).Summarize().max, 60.0 * kMs);
  // The eval's own idle time is what remains after its nested busy compute.
  EXPECT_DOUBLE_EQ(stats->segment_idle(phase::kEval).mean(), 100.0 * kMs);
  EXPECT_DOUBLE_EQ(stats->uncovered().Summarize().max, 40.0 * kMs);
}

TEST(StepStats, RejectsInvalidOptionsNamingTheField) {
  StepStatsOptions o;
  o.window = 0;
  auto s = StepStats::Create(o);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("window"), absl::string_view::npos);
  o.window = -5;
  EXPECT_FALSE(StepStats::Create(o).ok());
  o = StepStatsOptions{};
  o.warmup.max_drift = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(StepStats::Create(o).status().message().find("max_drift"), absl::string_view::npos);
}

TEST(StepStats, RejectsOutOfOrderOrMalformedStepsAndKeepsState) {
  auto stats = StepStats::Create(NoWarmup());
  ASSERT_TRUE(stats->Add(Normal(5, 0, 100)).ok());
  EXPECT_FALSE(stats->Add(Normal(5, 100, 100)).ok());
  auto bad = Normal(6, 100, 100);
  bad.spans[0].end_ns = bad.end_ns + 1;
  EXPECT_FALSE(stats->Add(bad).ok());
  EXPECT_EQ(stats->steps_seen(), 1);
  EXPECT_EQ(stats->last_step(), 5);
}

TEST(StatsSnapshot, ReportsRowsInMillisecondsAsJsonAndTable) {
  auto stats = StepStats::Create(NoWarmup());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(stats->Add(Normal(i, i * 100, 100)).ok());
  const StatsSnapshot snap = SnapshotOf(*stats, 200);
  ASSERT_FALSE(snap.rows.empty());
  EXPECT_EQ(snap.rows[0].name, "step");
  const std::string json = snap.ToJson();
  EXPECT_NE(json.find("\"schema\":\"omni.stats\""), std::string::npos);
  EXPECT_NE(json.find("\"mean_ms\":100.0"), std::string::npos);
  EXPECT_NE(snap.ToTable().find("data_wait"), std::string::npos);
}

}  // namespace
}  // namespace omni
