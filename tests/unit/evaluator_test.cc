#include "omni/evaluator.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"

namespace omni {
namespace {

using testing::kMs;
using testing::MakeStep;

StepLog Deterministic(int n) {
  StepLog log;
  for (int i = 0; i < n; ++i) {
    log.steps.push_back(MakeStep(
        i, i * 100, 100,
        {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 90}, {phase::kOptimizer, 90, 100}}));
  }
  return log;
}

EvaluateOptions Opts() {
  EvaluateOptions o;
  o.forecast.horizon_ns = 1000 * kMs;
  return o;
}

TEST(Evaluator, PerfectlyRegularStepsArePredictedExactly) {
  auto r = Evaluate(Deterministic(50), Opts());
  ASSERT_TRUE(r.ok()) << r.status();
  // From the 5th step (min_steps) on; the last boundary has nothing after it.
  EXPECT_EQ(r->forecasts, 45);
  EXPECT_NEAR(r->claimed_confidence, 0.9545, 1e-4);
  EXPECT_DOUBLE_EQ(r->next_step.coverage(), 1.0);
  EXPECT_DOUBLE_EQ(r->next_step.slack_median, 1.0);
  EXPECT_EQ(r->next_step.steps, 45);
  EXPECT_EQ(r->next_step_by_kind[static_cast<int>(StepKind::kNormal)].steps, 45);
  EXPECT_DOUBLE_EQ(r->total.precision(), 1.0);
  EXPECT_DOUBLE_EQ(r->total.recall(), 1.0);
  const auto& ds = r->by_kind[static_cast<int>(IdleKind::kDataStall)];
  EXPECT_GT(ds.forecast_ns, 0);
  const std::string json = r->ToJson();
  EXPECT_NE(json.find("\"precision\":1.0"), std::string::npos);
  EXPECT_NE(json.find("\"claimed_confidence\":0.9545"), std::string::npos);
  EXPECT_NE(json.find("\"next_step_coverage\":1.0"), std::string::npos);
  EXPECT_NE(json.find("\"next_step_slack_median\":1.0"), std::string::npos);
  EXPECT_NE(json.find("\"next_step_by_kind\":{\"normal\""), std::string::npos);
}

TEST(Evaluator, LiveNoticesAndTheirUnionWithTheWindowsAreScoredAsAGuestUsesThem) {
  // A loader ready in 1 ms on 9 steps of 10 and stalling 60-69 ms on every
  // 10th. The quantile table claims little of a stall: at its open it may
  // be a short wait, and the channel's grid (i/128) has too few points in a
  // mode of 10% of the windows for a claim at 0.95 once it outlasted the
  // short ones. The forecast knows the 10th step: a notice matched to the
  // forecast's window claims the stall from its open.
  StepLog log;
  int64_t t = 0;
  for (int i = 0; i < 400; ++i) {
    const int64_t dw = i % 10 == 9 ? 60 + (i / 10) % 10 : 1;
    log.steps.push_back(
        MakeStep(i, t, dw + 50, {{phase::kDataWait, 0, dw}, {phase::kCompute, dw, dw + 50}}));
    t += dw + 50;
  }
  EvaluateOptions table_only = Opts();
  table_only.notices.match_forecast = false;
  auto table = Evaluate(log, table_only);
  ASSERT_TRUE(table.ok()) << table.status();
  const auto& tn = table->notices.by_kind[static_cast<int>(IdleKind::kDataStall)];
  EXPECT_EQ(tn.real_ns, 2940 * kMs);  // 360 waits of 1 ms, 40 stalls of 60-69 ms
  EXPECT_GE(tn.precision(), 0.95);
  EXPECT_LT(tn.recall(), 0.2);
  // From the 4th window on (min_samples 3), but for windows 10-20: once the
  // first stall is among fewer than 21 measured windows, none of them
  // vouches for the 5% level (ClaimableQuantilesOf) and the small-sample
  // bound, with the stall in its spread, is at 0: no claim.
  EXPECT_EQ(table->notices.first_claims, 400 - 3 - 11);
  EXPECT_GE(table->notices.first_claims_held, 0.95 * 386);
  EXPECT_EQ(table->notices.forecast_matched, 0);

  auto r = Evaluate(log, Opts());
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& n = r->notices.by_kind[static_cast<int>(IdleKind::kDataStall)];
  const auto& f = r->by_kind[static_cast<int>(IdleKind::kDataStall)];
  EXPECT_EQ(n.real_ns, 2940 * kMs);
  EXPECT_GE(n.precision(), 0.95);
  EXPECT_GE(n.recall(), 0.8) << "the stalls, matched to the forecast's windows";
  EXPECT_GE(r->notices.forecast_matched, 30) << "of 40 stalls (and the 1 ms waits claimed)";
  EXPECT_GE(r->notices.first_claims_held, 0.95 * static_cast<double>(r->notices.first_claims));
  const auto& both = r->combined_by_kind[static_cast<int>(IdleKind::kDataStall)];
  EXPECT_GE(f.recall(), 0.8);
  EXPECT_GE(both.recall(), f.recall() - 0.01);  // a little more real time: from the first forecast
  EXPECT_GE(both.precision(), 0.95);
  EXPECT_GE(both.forecast_ns, f.forecast_ns);
  EXPECT_NE(r->ToJson().find("\"notices\":{"), std::string::npos);
  EXPECT_NE(r->ToJson().find("\"combined\":{"), std::string::npos);
  EXPECT_NE(r->ToTable().find("live notices"), std::string::npos);
  // No table claim below min_samples measured windows.
  EvaluateOptions few = table_only;
  few.notices.min_samples = 1000;
  auto none = Evaluate(log, few);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->notices.total.forecast_ns, 0);
  EXPECT_EQ(none->notices.first_claims, 0);
  EXPECT_GT(none->notices.total.real_ns, 0);
}

// A loader that waits in 6 pieces a step (5-6 ms each, 2 ms of work nested
// between them): the notices' fourth table holds the fourth and every later
// window of the phase in a step, so all six are claimed.
TEST(Evaluator, EveryWindowOfAPhaseSplitInMorePiecesThanTablesGetsANotice) {
  StepLog log;
  int64_t t = 0;
  constexpr int kPieces = 6;
  for (int i = 0; i < 300; ++i) {
    StepRecord r;
    r.step = i;
    r.start_ns = t * kMs;
    int64_t at = 0;
    PhaseSpan& wait = r.spans[r.num_spans++];
    wait.phase = phase::kDataWait;
    wait.start_ns = r.start_ns;
    for (int k = 0; k < kPieces; ++k) {
      at += 5 + (i + k) % 2;
      if (k == kPieces - 1) break;
      PhaseSpan& work = r.spans[r.num_spans++];
      work.phase = phase::kCompute;
      work.start_ns = r.start_ns + at * kMs;
      work.end_ns = work.start_ns + 2 * kMs;
      work.depth = 1;
      at += 2;
    }
    wait.end_ns = r.start_ns + at * kMs;
    PhaseSpan& compute = r.spans[r.num_spans++];
    compute.phase = phase::kCompute;
    compute.start_ns = wait.end_ns;
    compute.end_ns = compute.start_ns + 40 * kMs;
    r.end_ns = compute.end_ns;
    log.steps.push_back(r);
    t += at + 40;
  }
  EvaluateOptions o = Opts();
  o.notices.match_forecast = false;
  auto r = Evaluate(log, o);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& n = r->notices.by_kind[static_cast<int>(IdleKind::kDataStall)];
  EXPECT_GE(n.precision(), 0.95);
  EXPECT_GE(n.recall(), 0.8) << "the fifth and sixth windows of each step claimed too";
  EXPECT_GE(r->notices.first_claims, kPieces * 280);
  EXPECT_GE(r->notices.first_claims_held, 0.95 * static_cast<double>(r->notices.first_claims));
}

TEST(Evaluator, ALogWhoseClockGoesBackIsRefusedNotScored) {
  StepLog log = Deterministic(50);
  for (size_t i = 30; i < log.steps.size(); ++i) {  // a second run, its clock from 0
    log.steps[i] = MakeStep(log.steps[i].step, static_cast<int64_t>(i - 30) * 100, 100,
                            {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 100}});
  }
  auto r = Evaluate(log, Opts());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("step 30 starts before step 29 started"), std::string::npos)
      << r.status();
}

// 100 ms steps, 1 ms apart, with a pause of `pause_ns` after every 30th.
StepLog WithPauses(int n, int64_t pause_ns) {
  StepLog log;
  int64_t t = 0;
  for (int i = 0; i < n; ++i) {
    const StepRecord r = testing::ShiftedBy(
        MakeStep(i, 0, 100, {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 100}}), t);
    log.steps.push_back(r);
    t = r.end_ns + kMs + (i % 30 == 29 ? pause_ns : 0);
  }
  return log;
}

TEST(Evaluator, APauseOfYearsBetweenTwoStepsIsScoredWithoutAPollPerHalfMillisecond) {
  // A job paused for 2^60 ns (36 years) between two steps, several times:
  // the live notice replay polled every 0.5 ms of each gap while the
  // quantile table, which holds the long gaps, made no claim (2·10^12 polls
  // a gap; this test ran for hours). It skips to where the table can claim
  // again now, with the same scores as polling every 0.5 ms.
  constexpr int64_t kPause = int64_t{1} << 60;
  const StepLog log = WithPauses(120, kPause);
  auto r = Evaluate(log, Opts());
  ASSERT_TRUE(r.ok()) << r.status();
  const EvaluationReport::Score& gaps = r->notices.by_kind[static_cast<int>(IdleKind::kHostSide)];
  EXPECT_GE(gaps.real_ns, 3 * kPause) << "the pauses are real idle time";
  // Claims held at least as often as stated over the time claimed.
  EXPECT_GE(r->notices.total.precision(), r->claimed_confidence);
  EXPECT_GE(r->total.precision(), r->claimed_confidence);
}

TEST(Evaluator, HorizonScoringWhoseSumsWouldOverflowIsRefusedNamingIt) {
  // Each forecast scores its whole horizon: 120 forecasts over 2^61 ns of a
  // log paused for years overflowed the int64 sums (a runtime error under
  // the asan preset's UBSan, nonsense figures without it).
  EvaluateOptions o = Opts();
  o.scoring = Scoring::kHorizon;
  o.forecast.horizon_ns = kMaxForecastHorizonNs;
  const auto r = Evaluate(WithPauses(120, int64_t{1} << 60), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("overflows the sums"), std::string::npos) << r.status();
  o.scoring = Scoring::kLive;  // each stretch once
  EXPECT_TRUE(Evaluate(WithPauses(120, int64_t{1} << 60), o).ok());
}

TEST(Evaluator, ASampledLogScoresOnlyTheLoggedTime) {
  // Every 10th step of regular 100 ms steps: the unlogged steps in between
  // are neither real idle time nor scored forecasts.
  StepLog full = Deterministic(400), sampled;
  for (const StepRecord& r : full.steps) {
    if (r.step % 10 == 9) sampled.steps.push_back(r);
  }
  auto r = Evaluate(sampled, Opts());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->total.precision(), 1.0);
  EXPECT_GT(r->total.recall(), 0.99);
  // Real idle time: 20 ms per logged step scored (the 35 after the 5th).
  EXPECT_EQ(r->total.real_ns, 35 * 20 * kMs);
  EXPECT_DOUBLE_EQ(r->next_step.coverage(), 1.0);
}

TEST(Evaluator, ScoresAMissedStallAsLostRecallAndAWrongForecastAsLostPrecision) {
  StepLog log = Deterministic(30);
  // Step 25 has no data wait at all: forecasts of its stall were wrong; and it
  // has a 50 ms host gap at its end that nobody forecast.
  StepRecord& r = log.steps[25];
  r.spans[0].end_ns = r.spans[0].start_ns;  // zero-length data wait
  r.spans[1].start_ns = r.start_ns;
  r.spans[1].end_ns = r.start_ns + 40 * kMs;
  r.spans[2].start_ns = r.start_ns + 40 * kMs;
  r.spans[2].end_ns = r.start_ns + 50 * kMs;
  auto rep = Evaluate(log, Opts());
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_LT(rep->total.precision(), 1.0);
  EXPECT_LT(rep->total.recall(), 1.0);
  EXPECT_GT(rep->total.precision(), 0.9);
  const auto& host = rep->by_kind[static_cast<int>(IdleKind::kHostSide)];
  EXPECT_GT(host.real_ns, 0);
  EXPECT_EQ(host.real_covered_ns, 0);
}

// An eval at the end of its step, declared with an expected length of
// 1 s (80% of it claimed before one was measured), that lasts 300 ms: its
// claim runs 500 ms past the step's end, where the next forecast is made.
// A guest that began to use it keeps it: those 500 ms are false time.
// Cut at the next forecast before, the claim was all true.
TEST(Evaluator, AClaimPastTheNextForecastCountsToItsEndInThePrecision) {
  StepLog log;
  log.header.eval = PeriodicEvent{20, 19, 1000 * kMs};
  int64_t t = 0;
  for (int i = 0; i < 20; ++i) {
    const bool eval = i == 19;
    const int64_t dur = eval ? 400 : 100;
    log.steps.push_back(
        eval
            ? MakeStep(
                  i, t, dur,
                  {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 100}, {phase::kEval, 100, 400}})
            : MakeStep(i, t, dur, {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 100}}));
    t += dur;
  }
  for (int i = 20; i < 30; ++i) {
    log.steps.push_back(
        MakeStep(i, t, 100, {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 100}}));
    t += 100;
  }
  EvaluateOptions o = Opts();
  o.events_from_header = true;
  auto r = Evaluate(log, o);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& ev = r->by_kind[static_cast<int>(IdleKind::kEval)];
  ASSERT_GT(ev.forecast_ns, 0) << "the eval was not claimed";
  // Claimed 800 ms from its open: the eval's 300 ms true, then 5 steps
  // of 100 ms whose 20 ms data waits are idle too: 400 ms false.
  EXPECT_GE(ev.forecast_ns - ev.forecast_true_ns, 380 * kMs);
  EXPECT_LE(ev.forecast_ns - ev.forecast_true_ns, 400 * kMs);
  // The recall's real time is unchanged: the eval's 300 ms, all claimed.
  EXPECT_EQ(ev.real_ns, 300 * kMs);
  EXPECT_EQ(ev.real_covered_ns, 300 * kMs);
}

TEST(Evaluator, GapsBetweenStepsAreForecastAndScoredAsHostSideTime) {
  // A loop that loads its batch outside the step hooks: 20 ms (±1) before
  // each 60 ms step, and 45 ms before every 8th.
  StepLog log;
  int64_t t = 0;
  for (int i = 0; i < 400; ++i) {
    t += (i % 8 == 0 ? 45 : 20) + (i * 7 % 3) - 1;
    log.steps.push_back(MakeStep(i, t, 60, {{phase::kCompute, 0, 60}}));
    t += 60;
  }
  auto r = Evaluate(log, Opts());
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& host = r->by_kind[static_cast<int>(IdleKind::kHostSide)];
  EXPECT_GT(host.real_ns, 8000 * kMs);
  EXPECT_GE(host.recall(), 0.8);
  EXPECT_GE(host.precision(), r->claimed_confidence);
  EXPECT_GE(r->total.recall(), 0.8);
  EXPECT_GE(r->next_step.coverage(), r->claimed_confidence);
}

TEST(Evaluator, RejectsBadOptionsAndEmptyLogs) {
  EvaluateOptions o = Opts();
  o.stride_steps = 0;
  EXPECT_EQ(Evaluate(Deterministic(5), o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Evaluate(StepLog{}, Opts()).status().code(), absl::StatusCode::kInvalidArgument);
  // Too few steps for any forecast.
  EXPECT_EQ(Evaluate(Deterministic(4), Opts()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The notices' replay: a guest that never re-reads would loop for ever.
  EvaluateOptions no_poll = Opts();
  no_poll.notices.poll_ns = 0;
  absl::StatusOr<EvaluationReport> r = Evaluate(Deterministic(50), no_poll);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("notices.poll_ns"), std::string::npos) << r.status();
  EvaluateOptions sure = Opts();
  sure.notices.confidence = 1.0;
  r = Evaluate(Deterministic(50), sure);
  EXPECT_NE(r.status().message().find("notices.confidence must be in (0, 1), got 1"),
            std::string::npos)
      << r.status();
}

// A resumed run is scored as the live telemetry forecast it: after the
// previous run's steps, learned and not scored.
TEST(Evaluator, AResumedRunIsScoredAfterLearningThePreviousRunsSteps) {
  // A stall of 60 ms on every 5th step; the job was preempted after step
  // 119 and resumed from its checkpoint of step 99, 30 s later.
  StepLog before, after;
  for (int i = 0; i < 160; ++i) {
    const int64_t start = i * 100 + (i >= 100 ? 30'000 : 0);
    const int64_t wait = i % 5 == 0 ? 60 : 1;
    StepRecord rec =
        MakeStep(i, start, 100, {{phase::kDataWait, 0, wait}, {phase::kCompute, wait, 100}});
    if (i < 120) before.steps.push_back(rec);
    if (i >= 100) after.steps.push_back(rec);
  }
  absl::StatusOr<EvaluationReport> cold = Evaluate(after, Opts());
  EvaluateOptions o = Opts();
  o.previous = &before;
  absl::StatusOr<EvaluationReport> warm = Evaluate(after, o);
  ASSERT_TRUE(cold.ok()) << cold.status();
  ASSERT_TRUE(warm.ok()) << warm.status();
  // Every step of the resumed run has a bound, and only those are scored.
  EXPECT_EQ(warm->next_step.steps, 60);
  EXPECT_LT(cold->next_step.steps, 60);
  EXPECT_EQ(warm->forecasts, 59);  // the last boundary has nothing after it
  const auto& ds = [](const EvaluationReport& r) {
    return r.by_kind[static_cast<int>(IdleKind::kDataStall)];
  };
  EXPECT_GT(ds(*warm).recall(), ds(*cold).recall() + 0.1);
  EXPECT_GE(ds(*warm).precision(), 0.95);
  // The real idle time scored is the resumed run's (from its first step's
  // end, where the cold replay's scoring begins at its fifth).
  EXPECT_LE(ds(*warm).real_ns, 60 * 12 * kMs);

  // Another job's log (a phase this one does not have) is refused, naming it.
  StepLog other = before;
  ASSERT_TRUE(other.header.phases.Register("fetch", IdleKind::kDataStall).ok());
  o.previous = &other;
  absl::StatusOr<EvaluationReport> refused = Evaluate(after, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("'fetch'"), absl::string_view::npos);
}

}  // namespace
}  // namespace omni
