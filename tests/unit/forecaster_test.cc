#include <gtest/gtest.h>

#include <cmath>

#include "omni/forecast.h"
#include "test_util.h"

namespace omni {
namespace {

using testing::kMs;
using testing::MakeStep;

StepStats Stats() {
  StepStatsOptions o;
  o.warmup.max_steps = 0;
  o.warmup.min_steps = 0;
  return *StepStats::Create(o);
}

// data_wait [0, dw), compute [dw, dw+50), optimizer 10 ms.
StepRecord Step(int64_t step, int64_t start_ms, int64_t dw) {
  return MakeStep(step, start_ms, dw + 60,
                  {{phase::kDataWait, 0, dw},
                   {phase::kCompute, dw, dw + 50},
                   {phase::kOptimizer, dw + 50, dw + 60}});
}

ForecastOptions Opts(int64_t horizon_ms, double k = 2.0) {
  ForecastOptions o;
  o.horizon_ns = horizon_ms * kMs;
  o.k = k;
  return o;
}

TEST(Forecaster, DeterministicStepsGiveExactDataStallWindows) {
  StepStats stats = Stats();
  int64_t t = 0;
  for (int i = 0; i < 20; ++i, t += 80) ASSERT_TRUE(stats.Add(Step(i, t, 20)).ok());
  auto f = Forecaster::Create(Opts(800))->Predict(stats, t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->windows.size(), 10u);
  for (int j = 0; j < 10; ++j) {
    EXPECT_EQ(f->windows[j].start_ns, (t + 80 * j) * kMs);
    EXPECT_EQ(f->windows[j].duration_ns, 20 * kMs);
    EXPECT_EQ(f->windows[j].kind, IdleKind::kDataStall);
    EXPECT_EQ(f->windows[j].step, 20 + j);
    EXPECT_NEAR(f->windows[j].confidence, 0.9545, 1e-4);
  }
  EXPECT_EQ(f->devices_needed_at_ns, (t + 20) * kMs);
  EXPECT_EQ(f->last_step, 19);
}

TEST(Forecaster, UncertaintyShrinksWindowsByKSigmaAndAccumulates) {
  StepStats stats = Stats();
  int64_t t = 0;
  // data_wait alternates 30 / 50 ms: mean 40, sd 10; step 90 / 110: sd 10.
  for (int i = 0; i < 20; ++i) {
    const int64_t dw = i % 2 ? 50 : 30;
    ASSERT_TRUE(stats.Add(Step(i, t, dw)).ok());
    t += dw + 60;
  }
  auto f = Forecaster::Create(Opts(10'000))->Predict(stats, t * kMs);
  ASSERT_TRUE(f.ok());
  // First window: [t + 0, t + 40 - 2*10]. The next step's start is already
  // uncertain by sd 10 and its end by sqrt(200): 150 - 28.3 < 110 + 20, so no
  // more windows.
  ASSERT_EQ(f->windows.size(), 1u);
  EXPECT_EQ(f->windows[0].start_ns, t * kMs);
  EXPECT_EQ(f->windows[0].duration_ns, 20 * kMs);
  // Devices needed at the earliest plausible end of the data wait: 40 - 2*10.
  EXPECT_EQ(f->devices_needed_at_ns, (t + 20) * kMs);
  // k = 0: windows are the means.
  auto f0 = Forecaster::Create(Opts(1000, 0.0))->Predict(stats, t * kMs);
  ASSERT_TRUE(f0.ok());
  EXPECT_EQ(f0->windows[0].duration_ns, 40 * kMs);
  EXPECT_EQ(f0->windows[0].confidence, 0.0);
}

TEST(Forecaster, FollowsADriftingStepTimeWithTheRecentLevel) {
  StepStats stats = Stats();
  int64_t t = 0;
  for (int i = 0; i < 150; ++i) {
    const int64_t dw = i < 100 ? 40 : 20;  // steps of 100 ms, then of 80 ms
    ASSERT_TRUE(stats.Add(Step(i, t, dw)).ok());
    t += dw + 60;
  }
  // The whole window (200) averages 93.3 ms; the newest 50 steps are 80 ms.
  auto f = Forecaster::Create(Opts(1000, 0.0))->Predict(stats, t * kMs);
  ASSERT_TRUE(f.ok());
  ASSERT_GE(f->windows.size(), 3u);
  EXPECT_EQ(f->windows[1].start_ns - f->windows[0].start_ns, 80 * kMs);
  EXPECT_EQ(f->windows[2].start_ns - f->windows[1].start_ns, 80 * kMs);
  // With k = 2 the drift (13.3 ms per step) counts as level uncertainty that
  // grows linearly: the next step's 20 ms stall is already uncertain by more
  // than its length, so only the window of the first step is published.
  auto f2 = Forecaster::Create(Opts(1000, 2.0))->Predict(stats, t * kMs);
  ASSERT_TRUE(f2.ok());
  EXPECT_EQ(f2->windows.size(), 1u);
}

TEST(Forecaster, ForecastsMeasuredCheckpointAtItsDeclaredStep) {
  StepStats stats = Stats();
  int64_t t = 0;
  for (int i = 0; i < 30; ++i) {
    if (i % 10 == 9) {
      ASSERT_TRUE(stats
                      .Add(MakeStep(i, t, 280,
                                    {{phase::kDataWait, 0, 20},
                                     {phase::kCompute, 20, 70},
                                     {phase::kOptimizer, 70, 80},
                                     {phase::kCheckpoint, 80, 280}}))
                      .ok());
      t += 280;
    } else {
      ASSERT_TRUE(stats.Add(Step(i, t, 20)).ok());
      t += 80;
    }
  }
  ForecastOptions o = Opts(2000);
  o.checkpoint = PeriodicEvent{10, 9, 0};
  auto f = Forecaster::Create(o)->Predict(stats, t * kMs);
  ASSERT_TRUE(f.ok());
  const IdleWindow* ck = nullptr;
  int checkpoints = 0;
  for (const IdleWindow& w : f->windows) {
    if (w.kind != IdleKind::kCheckpoint) continue;
    if (ck == nullptr) ck = &w;
    ++checkpoints;
  }
  EXPECT_EQ(checkpoints, 2);  // steps 39 and 49 within 2 s
  ASSERT_NE(ck, nullptr);
  EXPECT_EQ(ck->step, 39);
  EXPECT_EQ(ck->start_ns, (t + 9 * 80 + 80) * kMs);
  EXPECT_EQ(ck->duration_ns, 200 * kMs);
  EXPECT_EQ(f->WindowAt(ck->start_ns + 1), ck);
}

TEST(Forecaster, UsesDeclaredDurationForAnEventNotYetMeasured) {
  StepStats stats = Stats();
  int64_t t = 0;
  for (int i = 0; i < 10; ++i, t += 80) ASSERT_TRUE(stats.Add(Step(i, t, 20)).ok());
  ForecastOptions o = Opts(5000);
  o.eval = PeriodicEvent{50, 49, 500 * kMs};
  auto f = Forecaster::Create(o)->Predict(stats, t * kMs);
  ASSERT_TRUE(f.ok());
  const IdleWindow* ev = nullptr;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kEval) ev = &w;
  }
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->step, 49);
  // 500 ms with an assumed 10% sd: 500 - 2 * 50.
  EXPECT_EQ(ev->duration_ns, 400 * kMs);
}

TEST(Forecaster, PipelineBubblesMatchTheScheduleFraction) {
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(4, 12), 3.0 / 15.0);
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(1, 8), 0.0);
  for (int stage : {0, 1, 3}) {
    StepStats stats = Stats();
    int64_t t = 0;
    for (int i = 0; i < 10; ++i, t += 160) {
      ASSERT_TRUE(
          stats.Add(MakeStep(i, t, 160, {{phase::kCompute, 0, 150}, {phase::kOptimizer, 150, 160}}))
              .ok());
    }
    ForecastOptions o = Opts(160 * 5, 0.0);
    o.pipeline = PipelineSchedule{4, 12, stage, 2.0};
    auto f = Forecaster::Create(o)->Predict(stats, t * kMs);
    ASSERT_TRUE(f.ok());
    int64_t bubble = 0;
    for (const IdleWindow& w : f->windows) {
      EXPECT_EQ(w.kind, IdleKind::kPipelineBubble);
      bubble += w.duration_ns;
    }
    // 5 steps x 150 ms compute x 3/15, to rounding.
    EXPECT_NEAR(static_cast<double>(bubble), 5 * 150.0 * kMs * 0.2, 10.0) << "stage " << stage;
  }
}

TEST(Forecaster, AnswersWhetherAGuestStepAndSaveFit) {
  auto fc = Forecaster::Create(Opts(1000));
  GuestCost g{10e6, 1e6, 5e6, 2e6};
  auto yes = fc->FitsBefore(g, 0, 20'000'000);
  ASSERT_TRUE(yes.ok());
  EXPECT_TRUE(yes->fits);
  EXPECT_EQ(yes->needed_ns, static_cast<int64_t>(std::ceil(15e6 + 2 * std::sqrt(5e12))));
  EXPECT_FALSE(fc->FitsBefore(g, 0, 19'000'000)->fits);
  g.step_mean_ns = std::nan("");
  EXPECT_EQ(fc->FitsBefore(g, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Forecaster, NeedsAStationaryStepBeforeForecasting) {
  auto stats = StepStats::Create(StepStatsOptions{});
  auto f = Forecaster::Create(Opts(1000))->Predict(*stats, 0);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Forecaster, RejectsBadOptionsNamingTheField) {
  ForecastOptions o;
  o.k = std::nan("");
  EXPECT_NE(Forecaster::Create(o).status().message().find("k must be"), absl::string_view::npos);
  o = ForecastOptions{};
  o.horizon_ns = 0;
  EXPECT_NE(Forecaster::Create(o).status().message().find("horizon"), absl::string_view::npos);
  o = ForecastOptions{};
  o.checkpoint = PeriodicEvent{10, 10, 0};
  EXPECT_NE(Forecaster::Create(o).status().message().find("offset"), absl::string_view::npos);
  o = ForecastOptions{};
  o.pipeline.stage = 4;
  EXPECT_NE(Forecaster::Create(o).status().message().find("stage"), absl::string_view::npos);
}

TEST(ForecastJson, RoundTripsAndRefusesNewerVersions) {
  Forecast f;
  f.made_at_ns = 1000;
  f.horizon_ns = 5000;
  f.last_step = 7;
  f.k = 2;
  f.devices_needed_at_ns = 1500;
  f.windows.push_back(IdleWindow{1100, 300, IdleKind::kEval, 0.95, 8});
  const std::string json = ForecastToJson(f);
  EXPECT_NE(json.find("\"schema\":\"omni.forecast\""), std::string::npos);
  EXPECT_NE(json.find("\"version\":1"), std::string::npos);
  auto back = ForecastFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->windows.size(), 1u);
  EXPECT_EQ(back->windows[0].kind, IdleKind::kEval);
  EXPECT_EQ(back->windows[0].duration_ns, 300);
  EXPECT_EQ(back->devices_needed_at_ns, 1500);
  std::string newer = json;
  newer.replace(newer.find("\"version\":1"), 11, "\"version\":9");
  EXPECT_EQ(ForecastFromJson(newer).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ForecastFromJson("{]").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace omni
