// The forecaster's learners on small synthetic logs (fake times; no clock
// involved). The corpus in tests/data is covered by forecaster_corpus_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "omni/forecast.h"
#include "test_util.h"

namespace omni {
namespace {

using testing::kMs;
using testing::MakeStep;

// data_wait [0, dw), compute [dw, dw+50), optimizer 10 ms.
StepRecord Step(int64_t step, int64_t start_ms, int64_t dw) {
  return MakeStep(step, start_ms, dw + 60,
                  {{phase::kDataWait, 0, dw},
                   {phase::kCompute, dw, dw + 50},
                   {phase::kOptimizer, dw + 50, dw + 60}});
}

ForecastOptions Opts(int64_t horizon_ms) {
  ForecastOptions o;
  o.horizon_ns = horizon_ms * kMs;
  return o;
}

Forecaster Make(const ForecastOptions& o) {
  auto f = Forecaster::Create(o);
  EXPECT_TRUE(f.ok()) << f.status();
  return *std::move(f);
}

void Feed(Forecaster& fc, const StepRecord& r) {
  ASSERT_TRUE(fc.Observe(r, PhaseCatalog()).ok()) << "step " << r.step;
}

TEST(Forecaster, DeterministicStepsGiveExactDataStallWindows) {
  Forecaster fc = Make(Opts(800));
  int64_t t = 0;
  for (int i = 0; i < 20; ++i, t += 80) Feed(fc, Step(i, t, 20));
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->windows.size(), 10u);
  for (int j = 0; j < 10; ++j) {
    EXPECT_EQ(f->windows[j].start_ns, (t + 80 * j) * kMs);
    EXPECT_EQ(f->windows[j].duration_ns, 20 * kMs);
    EXPECT_EQ(f->windows[j].guaranteed_ns, 20 * kMs);
    EXPECT_EQ(f->windows[j].kind, IdleKind::kDataStall);
    EXPECT_EQ(f->windows[j].phase, "data_wait");
    EXPECT_EQ(f->windows[j].step, 20 + j);
    EXPECT_NEAR(f->windows[j].confidence, 0.9545, 1e-4);
  }
  EXPECT_EQ(f->devices_needed_at_ns, (t + 20) * kMs);
  EXPECT_EQ(f->last_step, 19);
  ASSERT_FALSE(f->next_steps.empty());
  EXPECT_EQ(f->next_steps[0].step, 20);
  EXPECT_EQ(f->next_steps[0].lo_ns, 80 * kMs);
  EXPECT_EQ(f->next_steps[0].hi_ns, 80 * kMs);
}

TEST(Forecaster, NeedsMinStepsOfARegimeBeforeForecasting) {
  Forecaster fc = Make(Opts(1000));
  EXPECT_EQ(fc.Predict(0).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int i = 0; i < 4; ++i) Feed(fc, Step(i, i * 80, 20));
  EXPECT_EQ(fc.Predict(320 * kMs).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fc.NextStepBounds(1).status().code(), absl::StatusCode::kFailedPrecondition);
  Feed(fc, Step(4, 320, 20));
  EXPECT_TRUE(fc.Predict(400 * kMs).ok());
  EXPECT_EQ(fc.NextStepBounds(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Forecaster, RefusesStepsOutOfOrderAndLeavesTheModelAsItWas) {
  Forecaster fc = Make(Opts(1000));
  for (int i = 0; i < 6; ++i) Feed(fc, Step(i, i * 80, 20));
  EXPECT_EQ(fc.Observe(Step(5, 480, 20), PhaseCatalog()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fc.last_step(), 5);
}

// Noise of a few percent on every phase, as in real jobs.
// Feeds step `i` starting at `t` ms: a data wait of `dw` ms, then `c` ms of
// compute. Returns its end (ms).
int64_t FeedWaitThenCompute(Forecaster& fc, int64_t i, int64_t t, int64_t dw, int64_t c) {
  Feed(fc, MakeStep(i, t, dw + c, {{phase::kDataWait, 0, dw}, {phase::kCompute, dw, dw + c}}));
  return t + dw + c;
}

struct Jitter {
  std::mt19937_64 rng{7};
  int64_t operator()(double ms, double rel) {
    return std::max<int64_t>(1, std::llround(ms * std::normal_distribution<double>(1, rel)(rng)));
  }
};

// Steps one after another: a ~20 ms data wait, `compute` ms of compute and
// 10 ms of optimizer; `t` is where the next one starts (ms).
struct WorkSteps {
  Jitter j;
  int64_t t = 0;
  int64_t i = 0;
  int64_t stride = 1;  // a log of every stride-th step: the ones between pass unlogged
  StepRecord operator()(int64_t compute) {
    const int64_t dw = j(20, 0.05);
    StepRecord r = MakeStep(i, t, dw + compute + 10,
                            {{phase::kDataWait, 0, dw},
                             {phase::kCompute, dw, dw + compute},
                             {phase::kOptimizer, dw + compute, dw + compute + 10}});
    i += stride;
    t += stride * (dw + compute + 10);
    return r;
  }
};

TEST(Forecaster, StallEveryThirdStepIsForecastOnThoseStepsOnly) {
  Forecaster fc = Make(Opts(6000));
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < 120; ++i) {
    const int64_t dw = i % 3 == 0 ? j(400, 0.05) : j(4, 0.2);
    const int64_t c = j(900, 0.02);
    t = FeedWaitThenCompute(fc, i, t, dw, c);
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  int long_windows = 0;
  for (const IdleWindow& w : f->windows) {
    if (w.guaranteed_ns > 100 * kMs) {
      EXPECT_EQ(w.step % 3, 0) << "a long stall forecast on step " << w.step;
      ++long_windows;
    }
  }
  EXPECT_GE(long_windows, 2);  // steps 120 and 123 at least
  // The bounds follow the rhythm too.
  auto b = fc.NextStepBounds(3);
  ASSERT_TRUE(b.ok());
  EXPECT_GT((*b)[0].lo_ns, 1200 * kMs);  // step 120: with the stall
  EXPECT_LT((*b)[1].hi_ns, 1000 * kMs);  // step 121: without
}

// Steps of `c` ms of compute only, a gap of `gap` ms before each (a loop that
// fetches its batch or logs outside the step hooks). Returns the end (ms).
int64_t FeedGapThenCompute(Forecaster& fc, int64_t i, int64_t t, int64_t gap, int64_t c) {
  Feed(fc, MakeStep(i, t + gap, c, {{phase::kCompute, 0, c}}));
  return t + gap + c;
}

TEST(Forecaster, TheGapBetweenStepsIsForecastAsHostSideTimeBeforeTheStep) {
  Forecaster fc = Make(Opts(1000));
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < 200; ++i) t = FeedGapThenCompute(fc, i, t, j(12, 0.05), j(60, 0.02));
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<int64_t> steps;
  for (const IdleWindow& w : f->windows) {
    EXPECT_TRUE(w.before_step) << "step " << w.step << " " << IdleKindName(w.kind);
    if (!w.before_step) continue;
    EXPECT_EQ(w.kind, IdleKind::kHostSide);
    EXPECT_EQ(w.phase, "");
    steps.insert(w.step);
    EXPECT_GE(w.guaranteed_ns, 9 * kMs);
    EXPECT_LE(w.guaranteed_ns, 12 * kMs);
    if (w.step != 200) continue;
    // The next step's gap has begun: it started when step 199 ended.
    EXPECT_EQ(w.earliest_start_ns, t * kMs);
    EXPECT_EQ(w.latest_start_ns, t * kMs);
    EXPECT_EQ(w.start_ns, t * kMs);
    EXPECT_GE(w.duration_ns, 9 * kMs);
  }
  EXPECT_EQ(steps.count(200), 1u);
  EXPECT_GE(steps.size(), 2u);
  // The gaps are no part of a step's bound.
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok());
  EXPECT_LT((*b)[0].hi_ns, 66 * kMs);
}

TEST(Forecaster, ALongGapEveryTenthStepIsForecastBeforeThoseStepsOnly) {
  // A metrics flush before every 10th step, outside the step hooks.
  Forecaster fc = Make(Opts(2000));
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < 300; ++i) {
    t = FeedGapThenCompute(fc, i, t, i % 10 == 0 ? j(40, 0.05) : 0, j(60, 0.02));
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<int64_t> steps;
  for (const IdleWindow& w : f->windows) {
    ASSERT_TRUE(w.before_step) << "step " << w.step << " " << IdleKindName(w.kind);
    EXPECT_EQ(w.step % 10, 0) << "a gap forecast before step " << w.step;
    EXPECT_GE(w.guaranteed_ns, 30 * kMs);
    steps.insert(w.step);
  }
  EXPECT_GE(steps.size(), 2u);  // steps 300 and 310 at least
  EXPECT_EQ(steps.count(300), 1u);
  // The time from one step's end to the next one's: the gap before it too.
  auto b = fc.NextStepBounds(2);
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 2u);
  EXPECT_GE((*b)[0].gap_hi_ns, 42 * kMs);  // step 300: after the flush
  EXPECT_LE((*b)[0].gap_hi_ns, 50 * kMs);
  EXPECT_LT((*b)[1].gap_hi_ns, 1 * kMs);  // step 301: none
}

TEST(Forecaster, NoiseDoesNotBuyASpuriousPeriod) {
  Forecaster fc = Make(Opts(2000));
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> data(std::log(20.0), 0.5);
  int64_t t = 0;
  for (int i = 0; i < 300; ++i) {
    const auto dw = static_cast<int64_t>(data(rng)) + 1;
    Feed(fc, Step(i, t, dw));
    t += dw + 60;
  }
  auto b = fc.NextStepBounds(64);
  ASSERT_TRUE(b.ok());
  for (const StepBound& x : *b) {  // one class: the same bound for every step
    EXPECT_EQ(x.lo_ns, (*b)[0].lo_ns);
    EXPECT_EQ(x.hi_ns, (*b)[0].hi_ns);
  }
}

// A loader that refills its shuffle buffer every 150 steps (an epoch's
// end) stalls 300 ms there, 2 ms elsewhere: a period beyond the residue
// classes' (max_period 64, and 3 values per class), which left the stall
// unforecast and its step's bound 3x short. From its third spike on the
// rule forecasts it on its steps only, the next one and the one after, and
// the bound of its step includes it; a step the rule names that does not
// spike ends the rule.
TEST(Forecaster, AStallEvery150StepsIsForecastOnThoseStepsFromItsThirdOccurrence) {
  Forecaster fc = Make(Opts(30000));
  Jitter j;
  int64_t t = 0;
  const auto feed = [&](int i, bool spike) {
    const int64_t dw = spike ? j(300, 0.05) : j(2, 0.2);
    const int64_t c = j(80, 0.02);
    t = FeedWaitThenCompute(fc, i, t, dw, c);
  };
  for (int i = 0; i < 596; ++i) feed(i, i % 150 == 149);  // spikes at 149, 299, 449
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<int64_t> long_steps;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kDataStall && w.guaranteed_ns > 100 * kMs) {
      long_steps.push_back(w.step);
      EXPECT_GE(w.guaranteed_ns, 200 * kMs) << "step " << w.step;
    }
  }
  ASSERT_GE(long_steps.size(), 2u);
  EXPECT_EQ(long_steps[0], 599);
  EXPECT_EQ(long_steps[1], 749);
  for (const int64_t s : long_steps) EXPECT_EQ(s % 150, 149) << s;
  auto b = fc.NextStepBounds(4);
  ASSERT_TRUE(b.ok());
  EXPECT_LT((*b)[0].hi_ns, 150 * kMs);  // step 596
  EXPECT_GT((*b)[3].lo_ns, 200 * kMs);  // step 599: with the stall (~380 ms)
  EXPECT_GT((*b)[3].hi_ns, 400 * kMs);

  for (int i = 596; i < 600; ++i) feed(i, false);  // 599 does not stall
  f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  for (const IdleWindow& w : f->windows) {
    EXPECT_LE(w.guaranteed_ns, 100 * kMs) << "step " << w.step << ": the rule has ended";
  }
}

// The same loader, its waits of 2 ms now and then 9-12 ms (a worker that
// falls behind for a batch: 4x the median, a spike too, 1 step in 40):
// the rule is the major spikes' (at least a quarter of the longest kept);
// while a minor one was kept, the 300 ms stall had no rule and no claim.
TEST(Forecaster, AStallEvery150StepsIsForecastAmongShortSpikesOfTheSameWait) {
  Forecaster fc = Make(Opts(30000));
  Jitter j;
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int> one_in_40(0, 39);
  int64_t t = 0;
  int minor = 0;
  for (int i = 0; i < 596; ++i) {
    const bool stall = i % 150 == 149, slow = !stall && one_in_40(rng) == 0;
    minor += slow ? 1 : 0;
    const int64_t dw = stall ? j(300, 0.05) : (slow ? j(10, 0.1) : j(2, 0.2));
    const int64_t c = j(80, 0.02);
    t = FeedWaitThenCompute(fc, i, t, dw, c);
  }
  ASSERT_GE(minor, 8);
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<int64_t> long_steps;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kDataStall && w.guaranteed_ns > 100 * kMs) long_steps.push_back(w.step);
  }
  ASSERT_GE(long_steps.size(), 2u) << "the stall at 599 is not claimed";
  EXPECT_EQ(long_steps[0], 599);
  EXPECT_EQ(long_steps[1], 749);
}

// A stall every 60 steps, within the residue classes' reach (max_period
// 64) but not yet learned by them (3 values per class: 180 steps and a
// relearn): the spike rule forecasts the fourth (and the next ones, on their
// steps only) from right after the third.
TEST(Forecaster, AStallWithinTheResiduePeriodsIsForecastFromItsThirdOccurrence) {
  Forecaster fc = Make(Opts(30000));
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < 181; ++i) {  // stalls at 59, 119, 179
    const int64_t dw = i % 60 == 59 ? j(300, 0.05) : j(2, 0.2);
    const int64_t c = j(80, 0.02);
    t = FeedWaitThenCompute(fc, i, t, dw, c);
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  int64_t claimed = 0;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kDataStall && w.step == 239) claimed = w.guaranteed_ns;
    if (w.kind == IdleKind::kDataStall && w.step % 60 != 59) {
      EXPECT_LT(w.guaranteed_ns, 100 * kMs) << "step " << w.step;
    }
  }
  EXPECT_GT(claimed, 200 * kMs) << "the stall at 239 claimed " << claimed / 1e6 << " ms";
}

// An eval loop whose batches are steps of their own (a framework's step
// hook fires on validation batches too): 10 eval steps every 200. The
// loop is a run of the eval slot: within a run the next steps are evals
// (as long as the runs before), and the runs' first steps have a rule, so
// the next loop is forecast ahead. Before, each loop's first steps missed
// the normal steps' bound and made a regime change, every 200 steps.
TEST(Forecaster, AnEvalLoopLoggedAsStepsIsARunOfEvalSteps) {
  Forecaster fc = Make(Opts(60'000));
  Jitter j;
  int64_t t = 0;
  const auto feed = [&](int i) {
    if (i >= 200 && i % 200 < 10) {
      const int64_t ev = j(60, 0.05);
      Feed(fc, MakeStep(i, t, ev, {{phase::kEval, 0, ev}}));
      t += ev;
    } else {
      const int64_t dw = j(10, 0.2), c = j(90, 0.02);
      t = FeedWaitThenCompute(fc, i, t, dw, c);
    }
  };
  for (int i = 0; i < 803; ++i) feed(i);  // loops at 200, 400, 600 and 800
  EXPECT_EQ(fc.regime_changes(), 0);
  // Inside the fourth loop: its steps 803-809 are evals, 810 is not.
  auto b = fc.NextStepBounds(8);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 8u);
  for (const StepBound& sb : *b) {
    if (sb.step < 810) {
      EXPECT_LT(sb.hi_ns, 80 * kMs) << "step " << sb.step << " bounded as a training step";
    } else {
      EXPECT_GT(sb.lo_ns, 80 * kMs) << "step " << sb.step << " bounded as an eval step";
    }
  }
  for (int i = 803; i < 850; ++i) feed(i);
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<int64_t> eval_steps;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kEval && w.guaranteed_ns > 40 * kMs && w.step < 1200) {
      eval_steps.insert(w.step);  // (and the loops after it, as far as the horizon)
    }
  }
  std::set<int64_t> next_loop;
  for (int64_t s = 1000; s < 1010; ++s) next_loop.insert(s);
  EXPECT_EQ(eval_steps, next_loop);
}

// A step of a data wait, training work and an eval after it (ms).
StepRecord EvalStep(int64_t step, int64_t start_ms, int64_t dw, int64_t c, int64_t ev) {
  return MakeStep(step, start_ms, dw + c + ev,
                  {{phase::kDataWait, 0, dw},
                   {phase::kCompute, dw, dw + c},
                   {phase::kEval, dw + c, dw + c + ev}});
}

// Feeds `n` steps; every `every`-th (offset every − 1) runs an eval of
// eval_ms(step, jitter) after its training work. Returns the end (ms).
int64_t FeedWithEvals(Forecaster& fc, int n, int every,
                      const std::function<int64_t(int, Jitter&)>& eval_ms) {
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t dw = j(20, 0.3), c = j(50, 0.05);
    if (i % every == every - 1) {
      const int64_t ev = eval_ms(i, j);
      Feed(fc, EvalStep(i, t, dw, c, ev));
      t += dw + c + ev;
    } else {
      Feed(fc, Step(i, t, dw));
      t += dw + 60;
    }
  }
  return t;
}

const IdleWindow* FirstOfKind(const Forecast& f, IdleKind kind) {
  for (const IdleWindow& w : f.windows) {
    if (w.kind == kind) return &w;
  }
  return nullptr;
}

// The last eval window of `step` guaranteed longer than `min_ms`, or nullptr.
const IdleWindow* EvalWindowLongerThan(const Forecast& f, int64_t step, int64_t min_ms) {
  const IdleWindow* found = nullptr;
  for (const IdleWindow& w : f.windows) {
    if (w.kind == IdleKind::kEval && w.step == step && w.guaranteed_ns > min_ms * kMs) found = &w;
  }
  return found;
}

// The first window of `kind` in the forecast made at `now_ms`; none when
// there is none (a failed forecast fails the test).
std::optional<IdleWindow> FirstWindowOf(Forecaster& fc, int64_t now_ms, IdleKind kind) {
  auto f = fc.Predict(now_ms * kMs);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return std::nullopt;
  const IdleWindow* w = FirstOfKind(*f, kind);
  return w != nullptr ? std::optional<IdleWindow>(*w) : std::nullopt;
}

// A forecaster with evals declared every 20 steps (at 19, 39, ...: what
// eval_every = 20 declares), fed step by step.
struct DeclaredEvalFeed {
  Forecaster fc = Make([] {
    ForecastOptions o = Opts(30'000);
    o.eval = PeriodicEvent{20, 19, 0};
    return o;
  }());
  Jitter j;
  int64_t t = 0;  // the end of the last step fed (ms)

  // Step `i`: an eval step of ~300 ms of eval after its training work when
  // `eval`, else a normal step.
  void Next(int i, bool eval) {
    const int64_t dw = j(20, 0.3), c = j(50, 0.05);
    if (eval) {
      const int64_t ev = j(300, 0.02);
      Feed(fc, EvalStep(i, t, dw, c, ev));
      t += dw + c + ev;
    } else {
      Feed(fc, Step(i, t, dw));
      t += dw + 60;
    }
  }
};

TEST(Forecaster, ADeclaredEventTheLogContradictsIsVoidedAndTheEventsOwnStepsAreLearned) {
  // eval_every = 20 declares the eval at step % 20 == 19; this loop
  // evaluates at step % 20 == 0. Before, the declared steps kept an
  // eval-sized bound (every one a miss) and the evals' own steps were
  // learned beside them: eval windows in both.
  DeclaredEvalFeed feed;
  Forecaster& fc = feed.fc;
  for (int i = 0; i < 199; ++i) feed.Next(i, i % 20 == 0);  // the next, 199, is declared
  auto b = fc.NextStepBounds(2);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 2U);
  EXPECT_EQ((*b)[0].step, 199);
  EXPECT_LT((*b)[0].hi_ns, 200 * kMs) << "a declared step the log never evaluated in";
  EXPECT_GT((*b)[1].lo_ns, 250 * kMs) << "an eval's own step";
  auto f = fc.Predict(feed.t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  int evals = 0;
  for (const IdleWindow& w : f->windows) {
    if (w.kind != IdleKind::kEval) continue;
    ++evals;
    EXPECT_EQ(w.step % 20, 0) << "an eval window in step " << w.step;
  }
  EXPECT_GT(evals, 0);
}

TEST(Forecaster, ADeclaredEventSetAsideIsTakenBackWhenADeclaredStepHasItAgain) {
  // Evals declared every 20 (at 19, 39, ...) that start only at step 99
  // (after a warm-up the loop does not declare): 80 steps in, the
  // declaration is set aside; the eval at step 99 takes it back, and the
  // next declared step (119) is bounded as an eval from then on.
  DeclaredEvalFeed d;
  Forecaster& fc = d.fc;
  const auto feed = [&](int i) { d.Next(i, i % 20 == 19 && i >= 99); };
  for (int i = 0; i < 99; ++i) feed(i);
  auto before = fc.NextStepBounds(1);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_LT((*before)[0].hi_ns, 200 * kMs) << "step 99 while the declaration is set aside";
  for (int i = 99; i < 119; ++i) feed(i);
  auto after = fc.NextStepBounds(1);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ((*after)[0].step, 119);
  EXPECT_GT((*after)[0].hi_ns, 300 * kMs) << "step 119, declared and seen again at 99";
}

TEST(Forecaster, ACertainEvalFarAheadKeepsItsFullLength) {
  ForecastOptions o = Opts(30'000);
  o.eval = PeriodicEvent{50, 49, 0};
  Forecaster fc = Make(o);
  const int64_t t = FeedWithEvals(fc, 105, 50, [](int, Jitter& j) { return j(500, 0.02); });
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok());
  const IdleWindow* ev = FirstOfKind(*f, IdleKind::kEval);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->step, 149);  // 44 steps ahead
  EXPECT_EQ(ev->phase, "eval");
  // Its start is uncertain, its length is not.
  EXPECT_GT(ev->latest_start_ns - ev->earliest_start_ns, 20 * kMs);
  EXPECT_GT(ev->guaranteed_ns, 420 * kMs);
  EXPECT_NEAR(static_cast<double>(ev->expected_ns), 500.0 * kMs, 25.0 * kMs);
}

// The DataLoader recording's first eval took 193 ms (kernels compiled,
// caches cold), its second 119: two lengths that far apart guaranteed
// nothing of the third. The first, far longer than every later one, is no
// sample of their lengths.
TEST(Forecaster, AnEventsFirstOccurrenceThatRanColdDoesNotVoidTheNextOnesGuarantee) {
  Forecaster fc = Make(Opts(30'000));  // the eval is not declared
  const int64_t t = FeedWithEvals(
      fc, 179, 60, [](int step, Jitter& j) { return step == 59 ? j(193, 0.01) : j(119, 0.02); });
  const std::optional<IdleWindow> ev = FirstWindowOf(fc, t, IdleKind::kEval);
  ASSERT_TRUE(ev.has_value()) << "no eval window for step 179";
  EXPECT_EQ(ev->step, 179);
  EXPECT_GT(ev->guaranteed_ns, 95 * kMs);
  EXPECT_LT(ev->guaranteed_ns, 119 * kMs);
}

// A quick eval every 20 steps (100 ms) and a full one every 40 (400 ms):
// the evals' lengths alternate by occurrence, a rhythm no period of steps up
// to 64 shows (every eval step is 19 mod 20 and 19 or 39 mod 40). Pooled,
// the next eval was claimed as the short ones or, with the median between
// the two, not at all; by occurrence, each as its own.
TEST(Forecaster, EventsWhoseLengthsAlternateByOccurrenceAreEachClaimedAsTheirOwn) {
  Forecaster fc = Make(Opts(30'000));  // the evals are not declared
  const auto eval_ms = [](int step, Jitter& j) { return j(step % 40 == 39 ? 400 : 100, 0.02); };
  const int64_t t = FeedWithEvals(fc, 300, 20, eval_ms);  // 15 evals; the next, 319, is full
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::map<int64_t, int64_t> guaranteed;  // by step
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kEval) guaranteed[w.step] = w.guaranteed_ns;
  }
  ASSERT_EQ(guaranteed.count(319), 1u) << "no window for the full eval at step 319";
  ASSERT_EQ(guaranteed.count(339), 1u) << "no window for the quick eval at step 339";
  EXPECT_GT(guaranteed[319], 340 * kMs);
  EXPECT_LE(guaranteed[319], 400 * kMs);
  EXPECT_GT(guaranteed[339], 85 * kMs);
  EXPECT_LE(guaranteed[339], 100 * kMs);
  // The steps' durations too (~470 and ~170 ms).
  auto b = fc.NextStepBounds(40);
  ASSERT_TRUE(b.ok()) << b.status();
  int checked = 0;
  for (const StepBound& sb : *b) {
    if (sb.step == 319) {
      EXPECT_GT(sb.lo_ns, 400 * kMs);
      ++checked;
    }
    if (sb.step == 339) {
      EXPECT_LT(sb.hi_ns, 250 * kMs);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
}

// The rhythm of the lengths is learned from two occurrences of each class:
// after a quick, a full, a quick and a full eval, the fifth (quick) and the
// sixth (full) are each claimed as their own. Learned from three of each
// before, the lengths were pooled until then: too far apart to claim
// either.
TEST(Forecaster, EventsWhoseLengthsAlternateAreToldApartFromTwoOccurrencesOfEach) {
  Forecaster fc = Make(Opts(30'000));  // the evals are not declared
  const auto eval_ms = [](int step, Jitter& j) { return j(step % 40 == 39 ? 400 : 100, 0.02); };
  const int64_t t = FeedWithEvals(fc, 80, 20, eval_ms);  // evals at 19, 39, 59, 79; 99 is quick
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  const auto guaranteed_at = [](const Forecast& fc_out, int64_t step) -> int64_t {
    for (const IdleWindow& w : fc_out.windows) {
      if (w.kind == IdleKind::kEval && w.step == step) return w.guaranteed_ns;
    }
    return -1;
  };
  const int64_t quick = guaranteed_at(*f, 99);
  EXPECT_GT(quick, 80 * kMs) << "the fifth eval, quick, claimed " << quick / 1e6 << " ms";
  EXPECT_LE(quick, 100 * kMs);
  const int64_t full = guaranteed_at(*f, 119);
  EXPECT_GT(full, 300 * kMs) << "the sixth eval, full, claimed " << full / 1e6 << " ms";
  EXPECT_LE(full, 400 * kMs);
}

// A sequence-length curriculum: the training work grows 0.3% a step, so
// the next eval (after the training work of its step) starts where the
// last few steps' work ends, not where the history's mean would put it.
// From the class mean, the past evals' leads over it spread with the drift
// and the start was claimed anywhere in ~100 ms; from the recent level it
// is claimed within a normal step's noise.
TEST(Forecaster, TheNextEventsStartFollowsTheNormalStepsRecentLevel) {
  Forecaster fc = Make(Opts(30'000));
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0, 0.01);
  const auto work = [&](int i) { return std::llround(100 * (1 + 0.003 * i) * (1 + noise(rng))); };
  int64_t t = 0;
  int64_t next_start = 0;  // where step 399's eval starts (ms after the step's start)
  for (int i = 0; i < 400; ++i) {
    const int64_t c = work(i), dw = 10;
    if (i == 399) {
      next_start = dw + c;
      break;
    }
    if (i % 25 == 24) {
      const int64_t ev = std::llround(300 * (1 + noise(rng)));
      Feed(fc, EvalStep(i, t, dw, c, ev));
      t += dw + c + ev;
    } else {
      t = FeedWaitThenCompute(fc, i, t, dw, c);
    }
  }
  const std::optional<IdleWindow> ev = FirstWindowOf(fc, t, IdleKind::kEval);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->step, 399);
  EXPECT_LT(ev->latest_start_ns - ev->earliest_start_ns, 30 * kMs);
  EXPECT_LE(ev->earliest_start_ns, (t + next_start) * kMs);
  EXPECT_GE(ev->latest_start_ns, (t + next_start) * kMs);
  EXPECT_GT(ev->duration_ns, 200 * kMs);  // its sure part by the clock
}

// An eval of 20 decode passes (3 ms of device work each, 2 ms idle after
// each but the last) and 60 ms idle after the last: 20 idle stretches, more
// than the forecaster tells apart (kMaxIdleOrdinals, 16). The stretch after
// the last pass is most of the eval's idle time; the 16th to 19th are not,
// and leave out.
TEST(Forecaster, AnEvalSplitIntoManyPassesIsForecastThroughItsIdleTimeAfterTheLast) {
  ForecastOptions o = Opts(30'000);
  o.eval = PeriodicEvent{20, 19, 0};
  Forecaster fc = Make(o);
  constexpr int kPasses = 20;
  constexpr int64_t kPassesMs = kPasses * 5 - 2;
  constexpr int64_t kEvalMs = kPassesMs + 60;
  int64_t t = 0;
  for (int i = 0; i < 120; ++i) {
    const int64_t dw = 10, c = 50;
    StepRecord r = Step(i, t, dw);
    if (i % 20 == 19) {
      r = MakeStep(i, t, dw + c + kEvalMs,
                   {{phase::kDataWait, 0, dw},
                    {phase::kCompute, dw, dw + c},
                    {phase::kEval, dw + c, dw + c + kEvalMs}});
      for (int k = 0; k < kPasses; ++k) {
        PhaseSpan& pass = r.spans[r.num_spans++];
        pass.phase = phase::kCompute;
        pass.start_ns = r.start_ns + (dw + c + 5 * k) * kMs;
        pass.end_ns = pass.start_ns + 3 * kMs;
        pass.depth = 1;
      }
    }
    Feed(fc, r);
    t += (r.end_ns - r.start_ns) / kMs;
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  const IdleWindow* last = EvalWindowLongerThan(*f, 139, 50);
  ASSERT_NE(last, nullptr) << "no window for the idle time after step 139's last pass";
  EXPECT_EQ(last->ordinal, kMaxIdleOrdinals - 1);
  EXPECT_LE(last->guaranteed_ns, 60 * kMs);
  // It starts after the last pass: 60 ms of training work and 98 of passes
  // into the step, 19 steps of 70 ms after the last one logged.
  const int64_t step_start = t + 19 * 70;
  EXPECT_GE(last->earliest_start_ns, (step_start + 60 + kPassesMs - 8) * kMs);
  EXPECT_LE(last->earliest_start_ns, (step_start + 60 + kPassesMs) * kMs);
}

// A pipeline stage that logs each of its 12 bubbles (a 1F1B schedule of 12
// micro-batches: 2 ms idle between them, 12 ms after the last): every one
// is forecast in the next step, each as its own window. With 8 ordinals
// the 8th to 11th were not forecast (a fifth of the bubbles' time).
TEST(Forecaster, EachOfAStagesTwelveLoggedBubblesIsForecast) {
  Forecaster fc = Make(Opts(30'000));
  constexpr int kBubbles = 12;
  int64_t t = 0;
  for (int i = 0; i < 100; ++i) {
    constexpr int64_t kStepMs = 2 + kBubbles * 4 + (kBubbles - 1) * 2 + 12;
    StepRecord r = MakeStep(i, t, kStepMs, {{phase::kDataWait, 0, 2}});
    int64_t at = 2;
    const auto add = [&](PhaseId ph, int64_t a, int64_t b) {
      PhaseSpan& p = r.spans[r.num_spans++];
      p.phase = ph;
      p.start_ns = r.start_ns + a * kMs;
      p.end_ns = r.start_ns + b * kMs;
    };
    for (int k = 0; k < kBubbles; ++k) {
      const int64_t idle = k + 1 < kBubbles ? 2 : 12;
      add(phase::kCompute, at, at + 4);
      add(phase::kPipelineBubble, at + 4, at + 4 + idle);
      at += 4 + idle;
    }
    Feed(fc, r);
    t += kStepMs;
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<int> ordinals;
  for (const IdleWindow& w : f->windows) {
    if (w.step == 100 && w.kind == IdleKind::kPipelineBubble && w.guaranteed_ns >= 1 * kMs) {
      ordinals.insert(w.ordinal);
    }
  }
  EXPECT_EQ(ordinals.size(), static_cast<size_t>(kBubbles));
}

// Feeds 350 steps of data wait 20 ms and compute `before` ms, `after` ms
// from step 330 on, with a 200 ms eval every 40 steps; returns the end (ms).
// With `forward_ms`, the eval nests a forward pass of that length first
// (its idle time after it).
int64_t FeedAChangeBeforeAnEval(Forecaster& fc, double before, double after, double forward_ms = 0,
                                int steps = 350) {
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < steps; ++i) {
    const int64_t dw = j(20, 0.05), c = j(i < 330 ? before : after, 0.03);
    if (i % 40 == 39) {
      const int64_t ev = j(200, 0.03);
      const int64_t fwd = forward_ms > 0 ? j(forward_ms, 0.03) : 0;
      if (fwd > 0) {
        Feed(fc, MakeStep(i, t, dw + c + fwd + ev,
                          {{phase::kDataWait, 0, dw},
                           {phase::kCompute, dw, dw + c},
                           {phase::kEval, dw + c, dw + c + fwd + ev},
                           {phase::kCompute, dw + c, dw + c + fwd, 1}}));
      } else {
        Feed(fc, EvalStep(i, t, dw, c, ev));
      }
      t += dw + c + fwd + ev;
    } else {
      t = FeedWaitThenCompute(fc, i, t, dw, c);
    }
  }
  return t;
}

// The demo's machine slowed down 9 steps before its last eval: a new
// regime, whose steps had no eval yet, and the eval went unclaimed, as the
// first event after every change did. The eval measured before the change
// is claimed by its guaranteed length from the open (no sure part by the
// clock: its start in the new steps is unknown).
TEST(Forecaster, TheFirstEventAfterARegimeChangeIsClaimedFromItsLengthsBeforeIt) {
  Forecaster fc = Make(Opts(30'000));  // the eval every 40 steps is learned
  const int64_t t = FeedAChangeBeforeAnEval(fc, 50, 90);
  ASSERT_GE(fc.regime_changes(), 1);
  const std::optional<IdleWindow> ev = FirstWindowOf(fc, t, IdleKind::kEval);
  ASSERT_TRUE(ev.has_value()) << "no eval window after the change";
  EXPECT_EQ(ev->step, 359);
  EXPECT_GT(ev->guaranteed_ns, 170 * kMs);  // a slower step: its length as before
  EXPECT_LT(ev->guaranteed_ns, 200 * kMs);
  EXPECT_EQ(ev->duration_ns, 0);  // claimed from its open only
  // Its step has no duration bound until an eval step is measured again.
  auto b = fc.NextStepBounds(10);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->size(), 9u);  // up to step 358
}

// An eval nesting a forward pass is idle after it: carried over the
// change, that window starts after the pass in the slower steps, not at
// the end of their training work.
TEST(Forecaster, AnEvalsIdleTimeAfterItsForwardPassIsCarriedOverAChange) {
  Forecaster fc = Make(Opts(30'000));
  const int64_t t = FeedAChangeBeforeAnEval(fc, 50, 90, 100, 359);  // step 359 next
  ASSERT_GE(fc.regime_changes(), 1);
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  const IdleWindow* ev = EvalWindowLongerThan(*f, 359, 100);
  ASSERT_NE(ev, nullptr) << "no eval window after the change";
  EXPECT_LT(ev->guaranteed_ns, 200 * kMs);
  // It starts after the slower steps' work (~110 ms) and the forward pass
  // (100 ms): at ~210 ms into the step.
  EXPECT_LE(ev->earliest_start_ns - t * kMs, 210 * kMs);
  EXPECT_GE(ev->latest_start_ns - t * kMs, 210 * kMs);
  EXPECT_GT(ev->earliest_start_ns - t * kMs, 150 * kMs);
}

// Faster steps (the machine's other load went away) may come with a
// faster eval: its lengths from before are claimed scaled down by the
// normal steps' speed-up (110 -> 40 ms: 0.36x), never up.
TEST(Forecaster, AnEventCarriedOverAChangeToFasterStepsIsClaimedShorter) {
  Forecaster fc = Make(Opts(30'000));
  const int64_t t = FeedAChangeBeforeAnEval(fc, 90, 20);
  ASSERT_GE(fc.regime_changes(), 1);
  const std::optional<IdleWindow> ev = FirstWindowOf(fc, t, IdleKind::kEval);
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->step, 359);
  EXPECT_GT(ev->guaranteed_ns, 55 * kMs);
  EXPECT_LT(ev->guaranteed_ns, 200 * 40 / 110 * kMs + 5 * kMs);
}

// A checkpoint every 1,000 steps never shares a history of 512 steps with
// the last one: such an event was not forecast at all. Its steps are kept
// beyond the history (here: a history of 64 steps, an eval every 100), so
// it is forecast from its own steps, with a sure part and a bound.
TEST(Forecaster, AnEventRarerThanTheHistoryIsForecastFromItsOwnSteps) {
  ForecastOptions o = Opts(30'000);
  o.history_steps = 64;
  Forecaster fc = Make(o);
  const int64_t t = FeedWithEvals(fc, 299, 100, [](int, Jitter& j) { return j(500, 0.02); });
  const std::optional<IdleWindow> ev = FirstWindowOf(fc, t, IdleKind::kEval);
  ASSERT_TRUE(ev.has_value()) << "no eval window for step 299";
  EXPECT_EQ(ev->step, 299);
  EXPECT_GT(ev->guaranteed_ns, 400 * kMs);
  EXPECT_GT(ev->duration_ns, 300 * kMs);  // its sure part by the clock
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_GE((*b)[0].hi_ns, (70 + 510) * kMs);
}

// A shard fetched every 10th step (the demo's loader): its stall was
// listed while its start was sure enough for a sure part (8 occurrences
// here), then no more, as the idle time of every normal step further ahead
// is not. A residue class's window that stands out of its slot's other
// steps is now listed for its next 16 occurrences after that, by its
// guaranteed length; the tiny waits of the other steps still are not.
TEST(Forecaster, AStallEveryTenthStepIsListedForItsNextOccurrences) {
  Forecaster fc = Make(Opts(30'000));
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < 301; ++i) {
    const int64_t dw = i % 10 == 0 ? j(60, 0.05) : 1, c = j(10, 0.05);
    t = FeedWaitThenCompute(fc, i, t, dw, c);
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  int sure = 0, listed = 0;
  int64_t last = 0;
  for (const IdleWindow& w : f->windows) {
    ASSERT_EQ(w.kind, IdleKind::kDataStall);
    if (w.step == 301) continue;  // the next step's wait (1 ms) is listed, as before
    EXPECT_EQ(w.step % 10, 0) << "step " << w.step;
    EXPECT_GT(w.guaranteed_ns, 45 * kMs) << "step " << w.step;
    ++(w.duration_ns > 0 ? sure : listed);
    last = std::max(last, w.step);
  }
  EXPECT_GE(sure, 5);
  EXPECT_EQ(listed, 16);
  EXPECT_EQ(last, 300 + 10 * (sure + listed));
}

// A short eval every 50 steps (~300 ms idle) and a full one every 500
// (~3 s): the eval steps' lengths had no class of their own (500 is beyond
// max_period), so every eval was claimed at the short ones' length and
// the full ones' bounds were 10x short. From the third full eval on it is
// forecast at its own length at its steps, the short ones at theirs.
TEST(Forecaster, AFullEvalEvery500StepsAmongShortOnesIsForecastAtItsOwnLength) {
  ForecastOptions o = Opts(60'000);
  o.eval = PeriodicEvent{50, 49, 0};
  Forecaster fc = Make(o);
  const int64_t t = FeedWithEvals(fc, 1505, 50, [](int step, Jitter& j) {
    return step % 500 == 499 ? j(3000, 0.03) : j(300, 0.03);
  });
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  int full = 0, short_ones = 0;
  for (const IdleWindow& w : f->windows) {
    if (w.kind != IdleKind::kEval) continue;
    if (w.step % 500 == 499) {
      ++full;
      EXPECT_GT(w.guaranteed_ns, 2000 * kMs) << "step " << w.step;  // 3 of them: ~0.8x
    } else {
      ++short_ones;
      EXPECT_GT(w.guaranteed_ns, 240 * kMs) << "step " << w.step;
      EXPECT_LT(w.guaranteed_ns, 320 * kMs) << "step " << w.step;
    }
  }
  EXPECT_GE(full, 1) << "step 1999";
  EXPECT_GE(short_ones, 5);
  auto b = fc.NextStepBounds(500);
  ASSERT_TRUE(b.ok());
  EXPECT_GT((*b)[1999 - 1505].lo_ns, 2000 * kMs);  // the full eval's step
  EXPECT_LT((*b)[1549 - 1505].hi_ns, 600 * kMs);   // a short one's
}

TEST(Forecaster, ForecastsMeasuredCheckpointAtItsDeclaredStep) {
  ForecastOptions o = Opts(2000);
  o.checkpoint = PeriodicEvent{10, 9, 0};
  Forecaster fc = Make(o);
  int64_t t = 0;
  for (int i = 0; i < 60; ++i) {  // six checkpoints: past the small-sample prior
    if (i % 10 == 9) {
      Feed(fc, MakeStep(i, t, 280,
                        {{phase::kDataWait, 0, 20},
                         {phase::kCompute, 20, 70},
                         {phase::kOptimizer, 70, 80},
                         {phase::kCheckpoint, 80, 280}}));
      t += 280;
    } else {
      Feed(fc, Step(i, t, 20));
      t += 80;
    }
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok());
  const IdleWindow* ck = nullptr;
  int checkpoints = 0;
  for (const IdleWindow& w : f->windows) {
    if (w.kind != IdleKind::kCheckpoint) continue;
    if (ck == nullptr) ck = &w;
    ++checkpoints;
  }
  EXPECT_EQ(checkpoints, 2);  // steps 69 and 79 within 2 s
  ASSERT_NE(ck, nullptr);
  EXPECT_EQ(ck->step, 69);
  EXPECT_EQ(ck->start_ns, (t + 9 * 80 + 80) * kMs);
  EXPECT_EQ(ck->duration_ns, 200 * kMs);
  EXPECT_EQ(f->WindowAt(ck->start_ns + 1), ck);
  auto save = fc.SaveBound();
  ASSERT_TRUE(save.ok()) << save.status();
  EXPECT_EQ(save->step, 69);
  EXPECT_GE(save->hi_ns, 200 * kMs);
  EXPECT_EQ(f->save_hi_ns, save->hi_ns);
}

TEST(Forecaster, UsesDeclaredDurationForAnEventNotYetMeasured) {
  ForecastOptions o = Opts(5000);
  o.eval = PeriodicEvent{50, 49, 500 * kMs};
  Forecaster fc = Make(o);
  int64_t t = 0;
  for (int i = 0; i < 10; ++i, t += 80) Feed(fc, Step(i, t, 20));
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok());
  const IdleWindow* ev = nullptr;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kEval) ev = &w;
  }
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->step, 49);
  EXPECT_EQ(ev->guaranteed_ns, 400 * kMs);  // 80% of the declared 500 ms
  // No time is claimed by the clock: where in the event its idle time
  // begins (after an eval's forward pass) is not known before one is
  // measured. It is claimed by its guaranteed length from its open.
  EXPECT_EQ(ev->duration_ns, 0);
  EXPECT_EQ(fc.SaveBound().status().code(), absl::StatusCode::kNotFound);
}

TEST(Forecaster, AnEventStepNotMeasuredYetHasNoDurationBound) {
  // An eval every 50 steps, declared without its length: until one was
  // measured, the eval step's length is unknown. The bounds stopped there
  // after a fix; before it, step 49 was bounded like a normal step, and a
  // preemption decision could take a 70 ms bound for a step of 70 ms plus
  // an eval of any length.
  ForecastOptions o = Opts(5000);
  o.eval = PeriodicEvent{50, 49, 0};
  Forecaster fc = Make(o);
  int64_t t = 0;
  for (int i = 0; i < 40; ++i, t += 80) Feed(fc, Step(i, t, 20));
  auto b = fc.NextStepBounds(12);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 9u);  // steps 40-48
  EXPECT_EQ(b->back().step, 48);
  // Declared with its length, the step is bounded by it.
  o.eval.expected_ns = 500 * kMs;
  Forecaster declared = Make(o);
  t = 0;
  for (int i = 0; i < 40; ++i, t += 80) Feed(declared, Step(i, t, 20));
  b = declared.NextStepBounds(12);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 12u);
  EXPECT_EQ((*b)[9].step, 49);
  EXPECT_GE((*b)[9].hi_ns, (80 + 600) * kMs);  // the step and 120% of the eval

  // Nor a step that runs the first eval with a checkpoint measured before.
  o.eval.expected_ns = 0;
  o.checkpoint = PeriodicEvent{25, 24, 0};
  Forecaster both = Make(o);
  t = 0;
  for (int i = 0; i < 40; ++i) {
    if (i == 24) {
      Feed(both, MakeStep(i, t, 100,
                          {{phase::kDataWait, 0, 20},
                           {phase::kCompute, 20, 80},
                           {phase::kCheckpoint, 80, 100}}));
      t += 100;
    } else {
      Feed(both, Step(i, t, 20));
      t += 80;
    }
  }
  b = both.NextStepBounds(12);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 9u);
  EXPECT_EQ(b->back().step, 48);
}

TEST(Forecaster, AnEventMeasuredOnceBoundsItsNextOccurrenceFarWider) {
  // omni_train's second eval ran 359 ms after a first of 269 ms (its answers
  // grew longer): one occurrence does not show how much an event moves.
  // Its next occurrence is bounded a third longer and more; with a prior
  // of 5% of the mean as the spread of one value the bound was 21% above it.
  ForecastOptions o = Opts(5000);
  o.eval = PeriodicEvent{50, 49, 0};
  Forecaster fc = Make(o);
  FeedWithEvals(fc, 99, 50, [](int, Jitter& j) { return j(270, 0.02); });
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ((*b)[0].step, 99);
  EXPECT_GE((*b)[0].hi_ns, (70 + 360) * kMs);
}

TEST(Forecaster, AStepWithACheckpointAndAnEvalIsBoundedLikeTheStepsThatRanBoth) {
  // A 10 ms save every 30 steps, a 200 ms eval every 25: steps 149 and 299
  // run both. Step 299 was bounded from every checkpoint step, 18 short
  // saves and the one long step, and missed (omni_train, eval every 25,
  // checkpoint every 30: 341 ms against a bound of 266 ms).
  ForecastOptions o = Opts(5000);
  o.eval = PeriodicEvent{25, 24, 0};
  o.checkpoint = PeriodicEvent{30, 29, 0};
  Forecaster fc = Make(o);
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < 299; ++i) {
    const int64_t dw = j(20, 0.1), c = j(50, 0.02);
    const int64_t ev = i % 25 == 24 ? j(200, 0.02) : 0;
    const int64_t ck = i % 30 == 29 ? j(10, 0.05) : 0;
    const int64_t len = dw + c + ev + ck;
    if (ev > 0 && ck > 0) {
      Feed(fc, MakeStep(i, t, len,
                        {{phase::kDataWait, 0, dw},
                         {phase::kCompute, dw, dw + c},
                         {phase::kEval, dw + c, dw + c + ev},
                         {phase::kCheckpoint, dw + c + ev, len}}));
    } else if (ev > 0) {
      Feed(fc, MakeStep(i, t, len,
                        {{phase::kDataWait, 0, dw},
                         {phase::kCompute, dw, dw + c},
                         {phase::kEval, dw + c, len}}));
    } else if (ck > 0) {
      Feed(fc, MakeStep(i, t, len,
                        {{phase::kDataWait, 0, dw},
                         {phase::kCompute, dw, dw + c},
                         {phase::kCheckpoint, dw + c, len}}));
    } else {
      Feed(fc, MakeStep(i, t, len, {{phase::kDataWait, 0, dw}, {phase::kCompute, dw, len}}));
    }
    t += len;
  }
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_EQ((*b)[0].step, 299);
  EXPECT_GE((*b)[0].hi_ns, 290 * kMs);  // step 149 took ~280 ms
  EXPECT_GE((*b)[0].lo_ns, 150 * kMs);  // more than a save alone
}

// Feeds step i at t ms: 380 ms with a 300 ms checkpoint, else a plain 80 ms
// step. Returns its length in ms.
int64_t FeedStepOrCheckpoint(Forecaster& fc, int i, int64_t t, bool checkpoint) {
  if (!checkpoint) {
    Feed(fc, Step(i, t, 20));
    return 80;
  }
  Feed(fc,
       MakeStep(
           i, t, 380,
           {{phase::kDataWait, 0, 20}, {phase::kCompute, 20, 80}, {phase::kCheckpoint, 80, 380}}));
  return 380;
}

// The steps of the forecast's checkpoint windows.
std::vector<int64_t> CheckpointSteps(const Forecast& f) {
  std::vector<int64_t> at;
  for (const IdleWindow& w : f.windows) {
    if (w.kind == IdleKind::kCheckpoint) at.push_back(w.step);
  }
  return at;
}

// What the forecast made at `now_ms` guarantees of the `kind` window of
// `step` (0: none, or no forecast).
int64_t GuaranteedAt(Forecaster& fc, int64_t now_ms, IdleKind kind, int64_t step) {
  auto f = fc.Predict(now_ms * kMs);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return 0;
  int64_t g = 0;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == kind && w.step == step) g = w.guaranteed_ns;
  }
  return g;
}

// A step with a host-side gap of `gap` ms (none when 0) between its compute
// and its optimizer, and a 300 ms checkpoint after them when `checkpoint`.
// Returns its length in ms.
int64_t FeedHostGapStep(Forecaster& fc, int i, int64_t t, int64_t gap, bool checkpoint) {
  const int64_t opt_end = 80 + gap;
  const int64_t end = checkpoint ? opt_end + 300 : opt_end;
  if (checkpoint) {
    Feed(fc, MakeStep(i, t, end,
                      {{phase::kDataWait, 0, 20},
                       {phase::kCompute, 20, 70},
                       {phase::kOptimizer, 70 + gap, opt_end},
                       {phase::kCheckpoint, opt_end, end}}));
  } else {
    Feed(fc, MakeStep(i, t, end,
                      {{phase::kDataWait, 0, 20},
                       {phase::kCompute, 20, 70},
                       {phase::kOptimizer, 70 + gap, opt_end}}));
  }
  return end;
}

// The guaranteed length of the forecast's host-side window at `step`; -1
// when there is none.
int64_t HostSideGuaranteedAt(const Forecast& f, int64_t step) {
  for (const IdleWindow& w : f.windows) {
    if (w.kind == IdleKind::kHostSide && w.step == step) return w.guaranteed_ns;
  }
  return -1;
}

// A gap of host-side time shorter than min_window is not logged as a window:
// the normal steps show the gap missing in about one step of ten. The same gap in
// a checkpoint step, seen there 5 times at 3 ms, is no sign that it is always
// there: before, its window was claimed at every checkpoint step and missed
// whenever the gap was short.
TEST(Forecaster, AHostGapOftenMissingInNormalStepsIsNotClaimedInAnEventStepFromItsFewOccurrences) {
  ForecastOptions o = Opts(2000);
  o.checkpoint = PeriodicEvent{20, 19, 0};
  Forecaster fc = Make(o);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> gap(2, 5);
  std::bernoulli_distribution missing(0.1);
  int64_t t = 0;
  for (int i = 0; i < 120; ++i) {
    const bool ckpt = i % 20 == 19;
    const int64_t g = missing(rng) ? 0 : gap(rng);
    t += FeedHostGapStep(fc, i, t, ckpt ? 3 : g, ckpt);
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(CheckpointSteps(*f), (std::vector<int64_t>{139}));
  EXPECT_EQ(HostSideGuaranteedAt(*f, 139), -1);
}

// Every 5th step logged (4, 9, 14, ...) of a job whose loader stalls every
// 5th step, on the logged ones: each logged step stalls, and nothing tells
// whether the steps between do. Before, a stall was claimed in each of them
// (the same rhythm logged every 5th step after a change from every 3rd:
// window precision 0.86, the claimed times in the next logged step's work).
TEST(Forecaster, ALogOfEveryFifthStepClaimsNothingInTheStepsBetween) {
  Forecaster fc = Make(Opts(20000));
  Jitter j;
  int64_t t = 0;
  for (int i = 4; i < 600; i += 5) {
    const int64_t dw = j(200, 0.05);
    Feed(fc, Step(i, t, dw));
    t += (dw + 60) + 4 * 65;  // the four steps between, ~65 ms each
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<int64_t> stall_steps;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kDataStall) stall_steps.insert(w.step);
  }
  ASSERT_TRUE(stall_steps.count(604)) << "the next logged step's stall";
  for (const int64_t s : stall_steps) EXPECT_EQ(s % 5, 4) << "claimed at step " << s;
}

// A loader made again after each eval (every 40 steps) stalls every 6th
// step counted from it: the stalls' phase moves at each eval. Once the
// rhythm is known to restart there, the step the old phase names after an
// eval is not claimed: the new phase is unknown until the first stall
// after the eval (logged every 5th step, a stall every 4th counted from
// each eval: its 20 claims after evals all false, precision 0.79).
TEST(Forecaster, ARhythmThatRestartsAtEachEvalIsNotClaimedAfterOneUntilItStallsAgain) {
  Forecaster fc = Make(Opts(20000));
  Jitter j;
  int64_t t = 0;
  int64_t last_eval = -1;
  for (int i = 0; i < 120; ++i) {
    if (i % 40 == 39) {
      const int64_t d = j(300, 0.02);
      Feed(fc,
           MakeStep(
               i, t, 60 + d,
               {{phase::kDataWait, 0, 2}, {phase::kCompute, 2, 60}, {phase::kEval, 60, 60 + d}}));
      t += 60 + d;
      last_eval = i;
      continue;
    }
    const bool stall = (i - last_eval) % 6 == 0;
    const int64_t dw = stall ? j(150, 0.05) : j(3, 0.2);
    Feed(fc, Step(i, t, dw));
    t += dw + 60;
  }
  ASSERT_EQ(last_eval, 119);
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  for (const IdleWindow& w : f->windows) {
    // The old phase (stalls at 85, 91, ..., 115) names 121 and 127; the new
    // one 125, 131.
    if (w.kind == IdleKind::kDataStall && w.step < 130) {
      EXPECT_LT(w.guaranteed_ns, 50 * kMs) << "a stall claimed at step " << w.step;
    }
  }
}

// Every 10th step logged (9, 19, ...) of a job that saves every 20th step
// (offset 19, undeclared): every other logged step is a checkpoint step.
// Among the logged steps the save is no rare event, among the steps it is.
// Before, no rule was kept and each checkpoint step was bounded as a normal
// one (a stress log of 45 s steps and 90 s saves: 0 of 13 covered).
TEST(Forecaster, ACheckpointInEveryOtherStepOfALogOfEveryTenthIsBoundedAsACheckpoint) {
  Forecaster fc = Make(Opts(2000));
  int64_t t = 0;
  for (int i = 9; i < 400; i += 10) t += FeedStepOrCheckpoint(fc, i, t, i % 20 == 19) + 9 * 80;
  auto b = fc.NextStepBounds(20);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 20u);
  EXPECT_EQ((*b)[9].step, 409);
  EXPECT_LE((*b)[9].hi_ns, 100 * kMs);  // a normal step
  EXPECT_EQ((*b)[19].step, 419);
  EXPECT_GE((*b)[19].lo_ns, 300 * kMs);  // a checkpoint step
  EXPECT_GE((*b)[19].hi_ns, 380 * kMs);
}

// Every 5th step logged of a job whose undeclared eval came every 50 steps
// (49, 99, ..., 999) and comes every 30 since (1029, 1059, ...). "Every
// ~6 s" fits the evals too, if an unlogged one came between each two of the
// old ones; the rule of every 30 steps needs none, and stays. Before, the
// wall-clock rule dropped it and named no step: the evals at 1119-1209
// were bounded as normal steps.
TEST(Forecaster, AnEvalPeriodThatChangedInALogOfEveryFifthStepIsLearnedFromItsSteps) {
  Forecaster fc = Make(Opts(20000));
  Jitter j;
  int64_t t = 0;
  for (int64_t i = 0; i < 1115; ++i) {
    const bool eval = i < 1000 ? i % 50 == 49 : i % 30 == 9;
    const int64_t dw = j(20, 0.1), c = j(60, 0.03), ev = eval ? j(600, 0.05) : 0;
    if (i % 5 == 4) Feed(fc, eval ? EvalStep(i, t, dw, c, ev) : Step(i, t, dw));
    t += dw + (eval ? c + ev : 60);
  }
  auto b = fc.NextStepBounds(5);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 5u);
  EXPECT_EQ((*b)[4].step, 1119);
  EXPECT_GE((*b)[4].lo_ns, 500 * kMs);  // an eval step
}

// Every 10th step logged of a job whose loader stalls ~200 ms every 7th
// step and that runs a declared eval every 64th: the logged steps stall
// every 70th, a rhythm that names logged steps only. Nothing is known of
// where the steps between stall: each is bounded from all the logged steps
// alike, stalls included, and the logged steps after them are placed by
// that. Before, the steps between were bounded as the logged steps without
// a stall, and an eval 10 steps ahead was claimed a stall too early (a
// stress log's evals: precision 0.82-0.86, their sure parts in the eval's
// forward pass).
TEST(Forecaster, AStepBetweenTheLoggedOnesOfALogOfEveryTenthIsBoundedFromAllOfThem) {
  ForecastOptions o = Opts(20000);
  o.eval = PeriodicEvent{64, 63, 0};
  Forecaster fc = Make(o);
  Jitter j;
  int64_t t = 0;
  std::map<int64_t, std::pair<int64_t, int64_t>> eval_at;  // step -> its eval [a, b) (ms)
  std::vector<std::pair<int64_t, Forecast>> before_eval;   // forecasts a step before one
  for (int64_t i = 0; i < 1300; ++i) {
    const int64_t dw = i % 7 == 6 ? j(200, 0.05) : j(5, 0.2);
    const int64_t ev = i % 64 == 63 ? j(500, 0.05) : 0;
    if (ev > 0) eval_at[i] = {t + dw + 60, t + dw + 60 + ev};
    if (i % 10 == 9) {
      Feed(fc, ev > 0 ? EvalStep(i, t, dw, 60, ev) : Step(i, t, dw));
      if ((i + 10) % 64 == 63) {
        auto f = fc.Predict((t + dw + 60 + ev) * kMs);
        ASSERT_TRUE(f.ok()) << f.status();
        before_eval.emplace_back(i + 10, *std::move(f));
      }
    }
    t += dw + 60 + ev;
  }
  auto b = fc.NextStepBounds(10);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 10u);
  for (int k = 0; k < 9; ++k) {
    EXPECT_GE((*b)[static_cast<size_t>(k)].hi_ns, 250 * kMs) << "step " << (*b)[k].step;
  }
  ASSERT_EQ(before_eval.size(), 4u);  // 319, 639, 959 and 1279
  for (const auto& [step, f] : before_eval) {
    for (const IdleWindow& w : f.windows) {
      if (w.kind != IdleKind::kEval || w.step != step || w.duration_ns == 0) continue;
      EXPECT_GE(w.start_ns, eval_at[step].first * kMs) << "eval " << step;
      EXPECT_LE(w.start_ns + w.duration_ns, eval_at[step].second * kMs) << "eval " << step;
    }
  }
}

// The data waits of a loader whose fetch overlaps the previous step's
// compute: what is left, often nothing (below the window minimum), of
// widely varying length. Its first steps all waited, by chance: a few
// lengths this varied (coefficient of variation above 0.3) show nothing of
// how often the wait is missing, and the next step falls below all n of
// them with probability 1/(n + 1). Its length is claimed from 21 steps on
// (⌈1/α⌉ − 1); a wait of nearly constant length from its first steps. Before,
// a generated loader's first 5 waits (31-81 ms) claimed 18.5 ms of the next,
// which waited 0.5 ms (logged every 5th step: data-stall precision 0.60).
// Held to 21 lengths in each residue class, a rhythm of 50 steps claimed
// nothing for 1,000 steps: only the regime's first steps are.
TEST(Forecaster, AWaitOfWidelyVaryingLengthIsClaimedOnlyFromEnoughSteps) {
  const auto claimed = [](const std::vector<int64_t>& waits) {
    Forecaster fc = Make(Opts(2000));
    int64_t t = 0;
    for (size_t i = 0; i < waits.size(); ++i) {
      Feed(fc, Step(static_cast<int64_t>(i), t, waits[i]));
      t += waits[i] + 60;
    }
    auto f = fc.Predict(t * kMs);
    EXPECT_TRUE(f.ok()) << f.status();
    int64_t g = 0;
    if (!f.ok()) return g;
    for (const IdleWindow& w : f->windows) {
      if (w.kind == IdleKind::kDataStall && w.step == static_cast<int64_t>(waits.size())) {
        g = w.guaranteed_ns;
      }
    }
    return g;
  };
  const std::vector<int64_t> varied = {37, 81, 39, 31, 57, 45, 66, 28, 50, 72};
  EXPECT_EQ(claimed(varied), 0);
  std::vector<int64_t> steady;
  for (int i = 0; i < 10; ++i) steady.push_back(40 + i % 3);
  EXPECT_GT(claimed(steady), 30 * kMs);
  // A loader that started behind: its 8 waits fit a period of 2 whose
  // classes vary little (0.26 and 0.15 of their means); a period chosen
  // from 8 steps is no evidence. (Its next step waited 2 ms.)
  EXPECT_EQ(claimed({225, 101, 152, 73, 125, 110, 129, 90}), 0);
  std::vector<int64_t> many = varied;
  for (int r = 0; r < 2; ++r) many.insert(many.end(), varied.begin(), varied.end());
  EXPECT_GT(claimed(many), 0);  // 30 steps
}

// A host gap in every normal step for 50 steps, then missing from one: the
// gap may be missing from far more steps than 1 in 51 (by the rule of
// succession, 2 in 53 is above α/2), so it is not claimed until enough steps
// with it have followed. Before, it was claimed at once (50 of 51 steps).
TEST(Forecaster, AHostGapSeenMissingOnceIsNotClaimedUntilEnoughStepsShowIt) {
  Forecaster fc = Make(Opts(2000));
  int64_t t = 0;
  int i = 0;
  for (; i < 50; ++i) t += FeedHostGapStep(fc, i, t, 3, false);
  auto before = fc.Predict(t * kMs);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(HostSideGuaranteedAt(*before, i), 0) << "claimed while never seen missing";
  t += FeedHostGapStep(fc, i++, t, 0, false);  // missing
  auto after = fc.Predict(t * kMs);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(HostSideGuaranteedAt(*after, i), -1);
  // (1 + 1) / (n + 2) <= α/2 from n = 86 on.
  for (; i < 84; ++i) t += FeedHostGapStep(fc, i, t, 3, false);
  auto f84 = fc.Predict(t * kMs);
  ASSERT_TRUE(f84.ok()) << f84.status();
  EXPECT_EQ(HostSideGuaranteedAt(*f84, i), -1) << "84 steps, one missing";
  for (; i < 90; ++i) t += FeedHostGapStep(fc, i, t, 3, false);
  auto f90 = fc.Predict(t * kMs);
  ASSERT_TRUE(f90.ok()) << f90.status();
  EXPECT_GT(HostSideGuaranteedAt(*f90, i), 0) << "90 steps, one missing";
}

// Host-side pauses at random (here at steps 18 and 85 of 150): two of them
// make no period. Before, the second made one of 67 steps and the next pause
// was claimed at step 152 (a generated job's: 24 ms, all false). Two evals
// at the same steps still do: an eval or a checkpoint comes on a period far
// more often than not.
TEST(Forecaster, TwoHostPausesAtRandomMakeNoPeriodButTwoEvalsDo) {
  for (const PhaseId pause_phase : {phase::kHost, phase::kEval}) {
    Forecaster fc = Make(Opts(60000));
    int64_t t = 0;
    for (int i = 0; i < 150; ++i) {
      const int64_t end = i == 18 || i == 85 ? 120 : 80;
      Feed(fc, MakeStep(i, t, end,
                        {{phase::kDataWait, 0, 2},
                         {phase::kCompute, 2, 70},
                         {phase::kOptimizer, 70, 80},
                         {end > 80 ? pause_phase : phase::kOptimizer, 80, end}}));
      t += end;
    }
    auto f = fc.Predict(t * kMs);
    ASSERT_TRUE(f.ok()) << f.status();
    std::vector<int64_t> claimed;
    for (const IdleWindow& w : f->windows) {
      if (w.kind == IdleKind::kHostSide || w.kind == IdleKind::kEval) claimed.push_back(w.step);
    }
    if (pause_phase == phase::kHost) {
      EXPECT_TRUE(claimed.empty()) << "host pause claimed at step " << claimed.front();
    } else {
      ASSERT_FALSE(claimed.empty());
      EXPECT_EQ(claimed.front(), 152) << "the eval's period: 67 steps";
    }
  }
}

// Normal steps whose host gap is anywhere in 1-9 ms (at random): a checkpoint step's gap
// of 9 ms every time, 5 times, is claimed for no more than the normal steps'
// low end (before: about 8.5 ms, from 5 equal lengths and the small-sample
// prior of 5% noise).
TEST(Forecaster, AHostGapInAnEventStepIsClaimedForNoMoreThanTheNormalStepsShowOfIt) {
  ForecastOptions o = Opts(2000);
  o.checkpoint = PeriodicEvent{20, 19, 0};
  Forecaster fc = Make(o);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> gap(1, 9);
  int64_t t = 0;
  for (int i = 0; i < 120; ++i) {
    const bool ckpt = i % 20 == 19;
    const int64_t g = gap(rng);
    t += FeedHostGapStep(fc, i, t, ckpt ? 9 : g, ckpt);
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(CheckpointSteps(*f), (std::vector<int64_t>{139}));
  EXPECT_LE(HostSideGuaranteedAt(*f, 139), 2 * kMs);
}

// A checkpoint the header does not size (expected 0) and whose write slows
// the five steps after it by half (it contends with training). Its first
// occurrence had no bound of its own and counted as a miss; with the slow
// steps it made a change of regime, taken back without the steps that
// missed, the checkpoint with them, every time: before, after five
// checkpoints none was measured and none was forecast.
TEST(Forecaster, ACheckpointFollowedBySlowStepsIsLearnedFromItsFirstOccurrence) {
  ForecastOptions o = Opts(20'000);
  o.checkpoint = PeriodicEvent{100, 99, 0};
  Forecaster fc = Make(o);
  std::mt19937 rng(3);
  std::lognormal_distribution<double> noise(0.0, 0.3);
  int64_t t = 0;
  int slow = 0;
  for (int i = 0; i < 590; ++i) {
    StepRecord r;
    r.step = i;
    r.start_ns = t;
    int64_t at = t;
    const auto span = [&](PhaseId p, double ms) {
      PhaseSpan& sp = r.spans[r.num_spans++];
      sp.phase = p;
      sp.start_ns = at;
      at += static_cast<int64_t>(ms * kMs);
      sp.end_ns = at;
    };
    span(phase::kDataWait, 8 * noise(rng));
    span(phase::kCompute, slow > 0 ? 150 : 100);
    span(phase::kComm, 15);
    span(phase::kOptimizer, 8);
    slow = std::max(slow - 1, 0);
    if (i % 100 == 99) {
      span(phase::kCheckpoint, 80);
      slow = 5;
    }
    r.end_ns = at;
    Feed(fc, r);
    t = at;
  }
  auto f = fc.Predict(t);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::vector<int64_t> at = CheckpointSteps(*f);
  ASSERT_FALSE(at.empty());
  EXPECT_EQ(at.front(), 599);
  for (const IdleWindow& w : f->windows) {
    if (w.kind != IdleKind::kCheckpoint || w.step != 599) continue;
    // Claimed from its open; not by the clock: from the second spell on the
    // slow steps (5% of all) stay in the history (Transient), and the
    // checkpoint step's training part may be one of them as far as the
    // forecaster can tell.
    EXPECT_GE(w.guaranteed_ns, 70 * kMs);
    EXPECT_LE(w.guaranteed_ns, 80 * kMs);
  }
}

TEST(Forecaster, LearnsAnUndeclaredCheckpointFromItsSpacing) {
  Forecaster fc = Make(Opts(3000));
  int64_t t = 0;
  for (int i = 0; i < 40; ++i) t += FeedStepOrCheckpoint(fc, i, t, i % 12 == 5);
  // Seen at 5, 17 and 29: next at 41.
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok());
  const std::vector<int64_t> at = CheckpointSteps(*f);
  ASSERT_FALSE(at.empty());
  EXPECT_EQ(at[0], 41);
  auto save = fc.SaveBound();
  ASSERT_TRUE(save.ok());
  EXPECT_EQ(save->step, 41);
}

// Steps missing from the log (a telemetry ring that dropped them under
// load): the checkpoint of step 29 is not there, so its occurrences seen are
// 5, 17 and 41. The spacing 12 explains them and skips only a step that is
// not in the log. When a logged step where the rule puts it lacks it, there
// is no rule.
TEST(Forecaster, LearnsAnEventAcrossAnOccurrenceMissingFromTheLog) {
  for (const bool step_29_logged : {false, true}) {
    SCOPED_TRACE(step_29_logged ? "step 29 logged without a checkpoint" : "step 29 not logged");
    Forecaster fc = Make(Opts(3000));
    int64_t t = 0;
    for (int i = 0; i < 50; ++i) {
      if (i == 29 && !step_29_logged) {
        t += 380;  // it ran, with its checkpoint, but was not logged
        continue;
      }
      t += FeedStepOrCheckpoint(fc, i, t, i % 12 == 5 && i != 29);
    }
    auto f = fc.Predict(t * kMs);
    ASSERT_TRUE(f.ok());
    const std::vector<int64_t> at = CheckpointSteps(*f);
    if (step_29_logged) {
      EXPECT_TRUE(at.empty()) << "first at " << at[0];
    } else {
      ASSERT_FALSE(at.empty());
      EXPECT_EQ(at[0], 53);
    }
  }
}

// An event whose spacing is long against the history (a checkpoint every
// 200 steps, a history of 512 logged steps) and one of its occurrences not
// logged (steps 980-1019 dropped, with step 999's checkpoint): the rule held
// at every logged step since it was learned, and it stays once the next
// checkpoint comes where it said. Before, the rule was learned again from
// the last three occurrences, 599, 799 and 1199, whose span reaches back
// before the history, and it was dropped until three equal gaps had passed
// again (the evals after such a gap were not forecast for 400 steps).
TEST(Forecaster, KeepsAnEventsRuleAcrossAnUnloggedOccurrenceFartherBackThanTheHistory) {
  Forecaster fc = Make(Opts(30000));  // 200 steps ahead: 16 s
  int64_t t = 0;
  for (int i = 0; i < 1300; ++i) {
    if (i >= 980 && i < 1020) {
      t += i == 999 ? 380 : 80;  // ran, but not logged
      continue;
    }
    t += FeedStepOrCheckpoint(fc, i, t, i % 200 == 199);
    if (i == 1199 || i == 1299) {
      SCOPED_TRACE(absl::StrCat("after step ", i));
      auto f = fc.Predict(t * kMs);
      ASSERT_TRUE(f.ok());
      const std::vector<int64_t> at = CheckpointSteps(*f);
      ASSERT_FALSE(at.empty());
      EXPECT_EQ(at[0], 1399);
    }
  }
}

// A loader made again after each eval (every 150 steps, undeclared): a
// ~120 ms stall on every 4th step counted from the last eval, so its phase
// moves by 2 steps at each eval and the residue classes mix the phases. The
// spike rule restarts at each eval from the stalls after it (four of them):
// after step 1370 the stalls at 1373, 1377, ..., 1389 are claimed, and no
// step without a stall. Before: none claimed (a generated 3,000-step log:
// data-stall recall 0.14 -> 0.73, precision 0.967 -> 0.968).
TEST(Forecaster, AStallRhythmThatRestartsAtEachEvalIsClaimedAfterIt) {
  Forecaster fc = Make(Opts(3000));
  Jitter j;
  int64_t t = 0;
  int since = 0;
  for (int i = 0; i <= 1370; ++i) {
    const int64_t dw = since % 4 == 3 ? j(120, 0.05) : j(4, 0.2);
    ++since;
    if (i % 150 == 149) {
      Feed(fc, EvalStep(i, t, dw, 90, 400));
      t += dw + 490;
      since = 0;
    } else {
      t = FeedWaitThenCompute(fc, i, t, dw, 90);
    }
  }
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<int64_t> long_steps;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kDataStall && w.guaranteed_ns > 60 * kMs) long_steps.push_back(w.step);
  }
  const auto stalls = [](int64_t step) { return (step % 150) % 4 == 3; };  // evals at 149, 299...
  for (const int64_t s : long_steps) EXPECT_TRUE(stalls(s)) << s;
  for (int64_t s = 1373; s <= 1389; s += 4) {
    EXPECT_NE(std::find(long_steps.begin(), long_steps.end(), s), long_steps.end()) << s;
  }
}

// An undeclared checkpoint every 20.5 steps (every 41 samples at 2 a step:
// steps 20, 40, 61, 81, 102, ...), 20 and 21 steps apart in turn: no rule of
// one spacing holds, the fraction 41/2 does (from two cycles of its gaps
// and a confirmation: claimed from the seventh on).
TEST(Forecaster, AnEventEveryTwentyAndAHalfStepsIsForecast) {
  Forecaster fc = Make(Opts(4000));  // 50 steps ahead
  int64_t t = 0;
  const auto due = [](int i) { return (2 * i + 1) % 41 == 0 || (2 * i + 2) % 41 == 0; };
  std::vector<int64_t> at;
  for (int i = 0; i < 240; ++i) {
    // Occurrence k at floor((41k − 1) / 2): the steps i with 2i + 1 or
    // 2i + 2 a multiple of 41.
    t += FeedStepOrCheckpoint(fc, i, t, due(i));
    if (i == 150 || i == 225) {
      SCOPED_TRACE(absl::StrCat("after step ", i));
      auto f = fc.Predict(t * kMs);
      ASSERT_TRUE(f.ok());
      at = CheckpointSteps(*f);
      std::vector<int64_t> want;
      for (int s = i + 1; s <= i + 45; ++s) {
        if (due(s)) want.push_back(s);
      }
      ASSERT_GE(at.size(), 2u);
      EXPECT_EQ(at[0], want[0]);
      EXPECT_EQ(at[1], want[1]);
    }
  }
}

// A checkpoint by wall time: its spacing in steps wanders (20, 20, then 21).
// The rule of 20 from the first three fails at step 80; afterwards a rule
// must explain one more occurrence than the three it was learned from: 81,
// 101, 121 (spaced 20, but 60 is not on that rule) make none, and 141
// makes it. Wall-time checkpoints in 10 generated logs: checkpoint
// precision below the claim on 5 of 10 (0.917-0.952) before, 1 of 10 after.
TEST(Forecaster, AfterARuleFailedANewOneMustExplainOneMoreOccurrence) {
  Forecaster fc = Make(Opts(4000));  // 50 steps ahead
  const std::set<int> at = {20, 40, 60, 81, 101, 121, 141};
  int64_t t = 0;
  for (int i = 0; i <= 141; ++i) {
    t += FeedStepOrCheckpoint(fc, i, t, at.count(i) > 0);
    if (i == 60 || i == 121 || i == 141) {
      SCOPED_TRACE(absl::StrCat("after step ", i));
      auto f = fc.Predict(t * kMs);
      ASSERT_TRUE(f.ok());
      const std::vector<int64_t> claimed = CheckpointSteps(*f);
      if (i == 121) {
        EXPECT_TRUE(claimed.empty()) << claimed[0];
      } else {
        ASSERT_FALSE(claimed.empty());
        EXPECT_EQ(claimed[0], i + 20);
      }
    }
  }
}

// Saves of 90-130 ms (declared every 20 steps), one of 260 ms the first
// after a regime change (the steps slowed from 80 to 128 ms): one or two
// lengths of the new regime show little of the spread, and the next save
// is claimed for no more than all of its lengths give (a recording's saves
// of 8-13 ms and one of 25.8 after a change: 21.1 ms claimed, 10.5 taken).
TEST(Forecaster, AnEventsFewLengthsAfterARegimeChangeClaimNoMoreThanAllOfItsLengths) {
  ForecastOptions o = Opts(4000);
  o.checkpoint = PeriodicEvent{20, 19, 0};
  Forecaster fc = Make(o);
  const int64_t lengths[] = {100, 120, 90, 130, 110, 95, 125, 105, 115, 100};
  int64_t t = 0;
  int saves = 0;
  for (int i = 0; i < 300; ++i) {
    const int64_t dw = i < 220 ? 20 : 68;  // the steps slow down at 220
    const bool save = i % 20 == 19;
    if (!save) {
      Feed(fc, Step(i, t, dw));
      t += dw + 60;
      continue;
    }
    const int64_t len = i == 239 ? 260 : lengths[saves++ % 10];
    Feed(fc, MakeStep(i, t, dw + 60 + len,
                      {{phase::kDataWait, 0, dw},
                       {phase::kCompute, dw, dw + 50},
                       {phase::kOptimizer, dw + 50, dw + 60},
                       {phase::kCheckpoint, dw + 60, dw + 60 + len}}));
    t += dw + 60 + len;
    if (i == 239) {
      const int64_t claimed = GuaranteedAt(fc, t, IdleKind::kCheckpoint, 259);
      EXPECT_GT(claimed, 0);
      EXPECT_LE(claimed, 90 * kMs) << "no more than the saves of 90-130 ms give";
    }
  }
  EXPECT_EQ(fc.regime_changes(), 1);
}

// A declared checkpoint measured once, at its first occurrence. In a job
// that started cold (its first step 3x the others: allocation, kernels) that
// checkpoint may have run cold as well, and the second is claimed for at
// most a third of it (a recorded PyTorch trainer: 17.1 ms, then 6.5; 14.0
// ms had been claimed). A job that started warm keeps the claim of one
// measured occurrence (~80% of it).
TEST(Forecaster, AnEventMeasuredOnceInAJobThatStartedColdIsClaimedForAThirdOfIt) {
  for (const bool cold : {true, false}) {
    SCOPED_TRACE(cold ? "cold start" : "warm start");
    ForecastOptions o = Opts(3000);
    o.checkpoint = PeriodicEvent{50, 49, 0};
    Forecaster fc = Make(o);
    int64_t t = 0;
    for (int i = 0; i < 99; ++i) {
      const int64_t first = cold && i == 0 ? 180 : 0;  // the first step's extra time
      if (i == 49) {
        Feed(fc, MakeStep(i, t, 360,
                          {{phase::kDataWait, 0, 10},
                           {phase::kCompute, 10, 60},
                           {phase::kCheckpoint, 60, 360}}));  // 300 ms
        t += 360;
      } else {
        Feed(fc, Step(i, t, 10 + first));
        t += 70 + first;
      }
    }
    const int64_t claimed = GuaranteedAt(fc, t, IdleKind::kCheckpoint, 99);
    if (cold) {
      EXPECT_GT(claimed, 0);
      EXPECT_LE(claimed, 100 * kMs);
    } else {
      EXPECT_GT(claimed, 200 * kMs);
    }
  }
}

// The same job's second checkpoint, 100 ms after a cold first of 300: the
// first is left out of the sample as cold (more than 1.25x every later
// one), and the second, warm, is claimed at its own length. It was claimed
// for a third of it, as if it were the cold one (the DataLoader
// recording's third eval: ~40 ms claimed of ~120).
TEST(Forecaster, AnEventsSecondLengthAfterAColdFirstIsClaimedInFull) {
  ForecastOptions o = Opts(3000);
  o.checkpoint = PeriodicEvent{50, 49, 0};
  Forecaster fc = Make(o);
  int64_t t = 0;
  for (int i = 0; i < 149; ++i) {
    const int64_t first = i == 0 ? 180 : 0;  // a cold start
    if (i % 50 == 49) {
      const int64_t save = i == 49 ? 300 : 100;
      Feed(fc, MakeStep(i, t, 60 + save,
                        {{phase::kDataWait, 0, 10},
                         {phase::kCompute, 10, 60},
                         {phase::kCheckpoint, 60, 60 + save}}));
      t += 60 + save;
    } else {
      Feed(fc, Step(i, t, 10 + first));
      t += 70 + first;
    }
  }
  const int64_t claimed = GuaranteedAt(fc, t, IdleKind::kCheckpoint, 149);
  EXPECT_GT(claimed, 70 * kMs);
  EXPECT_LE(claimed, 100 * kMs);
}

// A stall every 125 steps (a loader opening a new shard), learned as a
// spike rule, and a slow spell of five steps just before one of them: the
// history is cut back to the few steps since the spell, which tell nothing
// of the data wait's usual length. That stall was taken for a step that did
// not spike and the rule ended (a recorded PyTorch LM trainer: its stalls
// were no longer forecast from step 999 on); now the usual length from
// before the cut stays until 8 steps show it again.
TEST(Forecaster, ASpikeRuleOutlastsASlowSpellJustBeforeItsNextStall) {
  Forecaster fc = Make(Opts(30000));  // 125 steps ahead: 10 s
  int64_t t = 0;
  for (int i = 0; i < 600; ++i) {
    const int64_t dw = i % 125 == 62 ? 300 : 2;
    if (i >= 557 && i < 562) {
      Feed(fc, MakeStep(i, t, dw + 110,
                        {{phase::kDataWait, 0, dw},
                         {phase::kCompute, dw, dw + 100},
                         {phase::kOptimizer, dw + 100, dw + 110}}));  // twice the work
      t += dw + 110;
    } else {
      Feed(fc, Step(i, t, dw));
      t += dw + 60;
    }
  }
  const int64_t claimed = GuaranteedAt(fc, t, IdleKind::kDataStall, 687);
  EXPECT_GT(claimed, 200 * kMs) << "transients " << fc.transients();
  EXPECT_EQ(fc.transients(), 1);  // the spell was one, and taken back
}

// A data wait present in about half the steps at random (a loader whose
// fetch the previous step's compute mostly hides). Its 14 first steps put
// three long waits on steps 2, 6 and 10: a period of 4 explained them, and
// step 14 was claimed for 20 ms from that class of three (it waited 4 ms).
// A period now needs 4 steps per class.
TEST(Forecaster, ThreeLongWaitsOnOneResidueDoNotMakeAPeriod) {
  Forecaster fc = Make(Opts(3000));
  const int64_t waits[] = {7, 0, 41, 11, 0, 31, 55, 0, 0, 5, 37, 0, 0, 23};
  int64_t t = 0;
  for (int i = 0; i < 14; ++i) {
    const int64_t dw = waits[i];
    if (dw == 0) {
      Feed(fc, MakeStep(i, t, 60, {{phase::kCompute, 0, 50}, {phase::kOptimizer, 50, 60}}));
    } else {
      Feed(fc, Step(i, t, dw));
    }
    t += dw + 60;
  }
  EXPECT_LT(GuaranteedAt(fc, t, IdleKind::kDataStall, 14), 5 * kMs);
}

// Spikes at random leave their last 8 on one spacing now and then: here
// 105, 123, 147, 159, 183, 189, 195 and 201, all 3 modulo 6, the last four
// 6 apart. A spike rule of every 6th step explained them, though 9 of the
// 17 steps it named since 105 had not spiked, and step 207 was claimed for
// the spikes' length. A rule now needs the steps it names to have spiked.
TEST(Forecaster, ASpikeRuleNeedsTheStepsItNamesToHaveSpiked) {
  Forecaster fc = Make(Opts(3000));
  const std::set<int> spikes = {105, 123, 147, 159, 183, 189, 195, 201};
  int64_t t = 0;
  for (int i = 0; i < 207; ++i) {
    const int64_t dw = spikes.count(i) != 0 ? 300 : 2;
    Feed(fc, Step(i, t, dw));
    t += dw + 60;
  }
  EXPECT_LT(GuaranteedAt(fc, t, IdleKind::kDataStall, 207), 100 * kMs);
}

TEST(Forecaster, DropsACompileWarmupFirstStep) {
  Forecaster fc = Make(Opts(1000));
  Feed(fc, Step(0, 0, 60 * 80));  // 60x: kernels compiling
  int64_t t = 60 * 80 + 60;
  for (int i = 1; i < 12; ++i, t += 80) Feed(fc, Step(i, t, 20));
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)[0].hi_ns, 80 * kMs);
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->steps_observed, 11);
}

// A restart in the log: a step 60x as long (kernels compiled again), then
// steps 30% slower. The next steps were bounded from the old regime until
// two more of them had missed (the restart trace's coverage below the
// claim on 2 of 8 fresh draws). Now a new regime begins at the restart
// step, and nothing is bounded from the old one.
TEST(Forecaster, ARestartBeginsANewRegimeAtOnce) {
  Forecaster fc = Make(Opts(1000));
  int64_t t = 0;
  int i = 0;
  for (; i < 100; ++i, t += 80) Feed(fc, Step(i, t, 20));
  ASSERT_EQ(fc.regime_changes(), 0);
  Feed(fc, Step(i++, t, 60 * 80));
  t += 60 * 80 + 60;
  EXPECT_EQ(fc.regime_changes(), 1);
  auto b = fc.NextStepBounds(1);
  EXPECT_TRUE(!b.ok() || b->empty()) << "a bound drawn from before the restart";
  for (int k = 0; k < 12; ++k, ++i, t += 104) Feed(fc, Step(i, t, 44));  // 104 ms steps
  b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_LE((*b)[0].lo_ns, 104 * kMs);
  EXPECT_GE((*b)[0].hi_ns, 104 * kMs);
  EXPECT_EQ(fc.regime_changes(), 1);
}

// A curriculum whose steps grow 0.06% a step under slow contention (AR(1),
// φ 0.95, σ 1%), an undeclared eval every 100 steps, and from step 400 on
// everything 0.6 times as long (moved to faster devices). The drift is no
// new regime, however far it goes (LevelShift judges the steps against a
// local level that moves with them); the jump is one within a few steps,
// and the next eval is claimed at about its new length.
// (ForecasterCorpus.AnAbruptlyFasterDriftingJobBeginsANewRegimeAndItsEvalsHoldTheirClaims:
// the held-out drift trace so shifted, which the marginal bound alone
// missed.)
TEST(Forecaster, ADriftingSeriesBeginsANewRegimeOnlyWhereItsLevelJumps) {
  Forecaster fc = Make(Opts(60'000));
  std::mt19937_64 rng(4);
  std::normal_distribution<double> noise(0, 0.01);
  std::lognormal_distribution<double> wait(std::log(6.0), 0.3);
  double level = 0;
  int64_t t = 0;
  int64_t changed_at = -1;
  for (int i = 0; i < 520; ++i) {
    level = 0.95 * level + noise(rng);
    const double speed = i < 400 ? 1.0 : 0.6;
    const auto dw = static_cast<int64_t>(wait(rng) * speed);
    const auto c = static_cast<int64_t>(150 * (1 + 0.0006 * i) * std::exp(level) * speed);
    if (i == 498) {
      // The forecast before the first eval after the change.
      auto f = fc.Predict(t * kMs);
      ASSERT_TRUE(f.ok()) << f.status();
      const IdleWindow* ev = FirstOfKind(*f, IdleKind::kEval);
      ASSERT_NE(ev, nullptr);
      EXPECT_EQ(ev->step, 499);
      // Scaled by the normal steps' speed since it was measured (a level
      // that lags the drift: somewhat above the 180 ms it takes now).
      EXPECT_LE(ev->guaranteed_ns, 200 * kMs) << "an eval of 300 ms, now 180 ms";
    }
    if (i % 100 == 99) {
      const auto ev = static_cast<int64_t>(300 * speed);
      Feed(fc, EvalStep(i, t, dw, c, ev));
      t += dw + c + ev;
    } else {
      Feed(fc, MakeStep(i, t, dw + c, {{phase::kDataWait, 0, dw}, {phase::kCompute, dw, dw + c}}));
      t += dw + c;
    }
    if (changed_at < 0 && fc.regime_changes() > 0) changed_at = i;
  }
  EXPECT_GE(changed_at, 400) << "slow drift is no new regime";
  EXPECT_LE(changed_at, 405);
}

// A stall as long as a restart, the steps after it as before: the old
// regime comes back (a transient), its history with it.
TEST(Forecaster, AStallAsLongAsARestartIsTakenBackWhenTheStepsFitAgain) {
  Forecaster fc = Make(Opts(1000));
  int64_t t = 0;
  int i = 0;
  for (; i < 100; ++i, t += 80) Feed(fc, Step(i, t, 20));
  Feed(fc, Step(i++, t, 40 * 80));
  t += 40 * 80 + 60;
  for (int k = 0; k < 12; ++k, ++i, t += 80) Feed(fc, Step(i, t, 20));
  EXPECT_EQ(fc.regime_changes(), 0);
  EXPECT_EQ(fc.transients(), 1);
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_GT(f->steps_observed, 100);
}

// Steps that miss their bound by a hair (here by 0.5..1.5 ms, on a bound
// ~8 ms wide) are counted by the calibrator but are no evidence
// of a new regime: a false change would forget every event learned. Before
// the margin, three of them started one (seen on the demo's own log).
TEST(Forecaster, StepsJustOutsideTheirBoundStartNoNewRegime) {
  Forecaster fc = Make(Opts(2000));
  int64_t t = 0;
  int i = 0;
  std::mt19937 rng(7);  // no rhythm: 78..82 ms steps drawn at random
  for (; i < 150; ++i) {
    const int64_t dw = 18 + static_cast<int64_t>(rng() % 5);
    Feed(fc, Step(i, t, dw));
    t += dw + 60;
  }
  ASSERT_EQ(fc.regime_changes(), 0);
  for (int k = 0; k < 6; ++k, ++i) {
    // Each step 0.5..1.5 ms shorter than its bound's lower end: a miss, by
    // a small part of the bound's width.
    auto b = fc.NextStepBounds(1);
    ASSERT_TRUE(b.ok()) << b.status();
    const int64_t lo = (*b)[0].lo_ns, hi = (*b)[0].hi_ns;
    const int64_t d = (lo - kMs / 2) / kMs;  // whole ms
    ASSERT_LT(d * kMs, lo);
    ASSERT_LT(lo - d * kMs, (hi - lo) / 4) << "a slight miss";
    Feed(fc, Step(i, t, d - 60));
    t += d;
  }
  EXPECT_EQ(fc.regime_changes(), 0);
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->windows.empty()) << "not suspended";
  // A clear miss still counts: steps twice as slow are a new regime.
  for (int k = 0; k < 3; ++k, ++i) {
    Feed(fc, MakeStep(i, t, 130,
                      {{phase::kDataWait, 0, 20},
                       {phase::kCompute, 20, 120},
                       {phase::kOptimizer, 120, 130}}));
    t += 130;
  }
  EXPECT_EQ(fc.regime_changes(), 1);
}

// A loader that falls behind on 1 % of the steps and stays behind with
// probability 0.8 a step (bursts of 5 steps on average), stalling 40-90 ms a
// step meanwhile, among ~63 ms steps. `clustered` false: as many stalls, on
// steps drawn at random. Each step is scored against NextStepBounds(1) taken
// before it; `after_miss` counts the steps that follow one longer than its
// bound.
struct BurstReplay {
  int scored = 0, covered = 0, after_miss = 0, after_miss_covered = 0;
  std::vector<double> width_after_miss, width_other;  // hi - lo, ms
};
BurstReplay ReplayBursts(bool clustered, uint32_t seed) {
  Forecaster fc = Make(Opts(2000));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int64_t> stall(40, 90), wait(2, 4);
  BurstReplay r;
  bool behind = false, missed = false;
  int64_t t = 0;
  for (int i = 0; i < 4000; ++i) {
    behind = clustered ? u(rng) < (behind ? 0.8 : 0.01) : u(rng) < 0.0476;
    const int64_t dw = behind ? stall(rng) : wait(rng);
    auto b = fc.NextStepBounds(1);
    if (b.ok() && !b->empty()) {
      const int64_t d = (dw + 60) * kMs;
      const bool in = d >= (*b)[0].lo_ns && d <= (*b)[0].hi_ns;
      ++r.scored;
      r.covered += in ? 1 : 0;
      const double width = static_cast<double>((*b)[0].hi_ns - (*b)[0].lo_ns) / kMs;
      if (missed) {
        ++r.after_miss;
        r.after_miss_covered += in ? 1 : 0;
        r.width_after_miss.push_back(width);
      } else {
        r.width_other.push_back(width);
      }
      missed = d > (*b)[0].hi_ns;
    }
    Feed(fc, Step(i, t, dw));
    t += dw + 60;
  }
  return r;
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

TEST(Forecaster, AStepAfterAMissGetsAWiderBoundWhereMissesCluster) {
  // Measured (seeds 1-4): 0.90-0.97 of the steps after a miss covered,
  // 0.977-0.981 of all (0.58-0.65 and 0.970-0.973 with the bounds after a
  // miss as any other).
  for (const uint32_t seed : {1u, 2u, 3u}) {
    const BurstReplay r = ReplayBursts(true, seed);
    ASSERT_GT(r.after_miss, 50) << "seed " << seed;
    EXPECT_GE(static_cast<double>(r.covered) / r.scored, 0.9545) << "seed " << seed;
    EXPECT_GE(static_cast<double>(r.after_miss_covered) / r.after_miss, 0.85) << "seed " << seed;
  }
}

TEST(Forecaster, AStepAfterAMissIsBoundedAsAnyOtherWhereMissesDoNotCluster) {
  // The same stalls at random: a miss says nothing of the next step. The
  // bounds after one widen only while a chance miss after a miss is
  // remembered (measured, seeds 1-4: their median width 1.00, 1.03, 1.07
  // and 1.18 times the others'; a lone miss is undone by about 21 hits).
  for (const uint32_t seed : {1u, 2u, 3u, 4u}) {
    const BurstReplay r = ReplayBursts(false, seed);
    ASSERT_GT(r.after_miss, 50) << "seed " << seed;
    EXPECT_GE(static_cast<double>(r.covered) / r.scored, 0.9545) << "seed " << seed;
    EXPECT_LE(Median(r.width_after_miss), 1.25 * Median(r.width_other)) << "seed " << seed;
  }
}

TEST(Forecaster, RarePausesBeyondAnyMarginLeaveTheNextStepBoundNarrow) {
  // Steps of ~150 ms (a ~20 ms wait, 120 ± 3 ms of compute, 10 of
  // optimizer) and, in 3 % of them at random, a host-side pause of
  // 100-300 ms (a GC), 10-30 spreads beyond the bound: more than the share
  // of misses the bounds aim at (0.6·α, 2.7 %), and in some stretches of
  // the history more than the upper end's share of α (3.6 %). Before, the
  // calibrator widened at every pause, and the upper quantile jumped to the
  // pauses whenever the history held more than 3.6 % of them: the median
  // bound over 500 steps up to 1.83, 1.84 and 1.55 times the step on these
  // seeds (1.13, 1.10 and 1.16 over the whole run). Measured after: at most
  // 1.10, 1.13 and 1.11 (1.07-1.08 over the whole run), 0.962 of the
  // steps covered. (On seeds 3, 5 and 8 the history's share of pauses
  // passes 0.9·α for a few hundred steps, and the bound covers pauses
  // there, as it must for the claim to hold: a median of up to 1.85.)
  for (const uint32_t seed : {1u, 2u, 6u}) {
    Forecaster fc = Make(Opts(2000));
    WorkSteps ws;
    ws.j.rng.seed(seed);
    std::mt19937 rng(seed);
    std::bernoulli_distribution pause(0.03);
    std::uniform_int_distribution<int64_t> pause_ms(100, 300);
    std::normal_distribution<double> compute(120, 3);
    int scored = 0, covered = 0;
    std::vector<double> slack;
    std::vector<std::vector<double>> slack_by_500(8);
    for (int i = 0; i < 4000; ++i) {
      const int64_t c = std::llround(compute(rng)) + (pause(rng) ? pause_ms(rng) : 0);
      const StepRecord r = ws(c);
      auto b = fc.NextStepBounds(1);
      if (b.ok() && !b->empty()) {
        const int64_t d = r.end_ns - r.start_ns;
        ++scored;
        covered += d >= (*b)[0].lo_ns && d <= (*b)[0].hi_ns ? 1 : 0;
        slack.push_back(static_cast<double>((*b)[0].hi_ns) / static_cast<double>(d));
        slack_by_500[static_cast<size_t>(i / 500)].push_back(slack.back());
      }
      Feed(fc, r);
    }
    ASSERT_GT(scored, 3900) << "seed " << seed;
    EXPECT_GE(static_cast<double>(covered) / scored, 0.9545) << "seed " << seed;
    EXPECT_LE(Median(slack), 1.10) << "seed " << seed;
    for (size_t k = 0; k < slack_by_500.size(); ++k) {
      EXPECT_LE(Median(slack_by_500[k]), 1.25) << "seed " << seed << ", steps from " << 500 * k;
    }
  }
}

TEST(Forecaster, ASlowdownStartsANewRegimeWithinThreeSteps) {
  Forecaster fc = Make(Opts(2000));
  Jitter j;
  int64_t t = 0;
  int i = 0;
  for (; i < 100; ++i) {
    const int64_t dw = j(20, 0.05);
    Feed(fc, Step(i, t, dw));
    t += dw + 60;
  }
  EXPECT_EQ(fc.regime_changes(), 0);
  // 50% slower compute from now on.
  const auto slow = [&](int64_t s) {
    const int64_t dw = j(20, 0.05);
    const StepRecord r = MakeStep(s, t, dw + 85,
                                  {{phase::kDataWait, 0, dw},
                                   {phase::kCompute, dw, dw + 75},
                                   {phase::kOptimizer, dw + 75, dw + 85}});
    t += dw + 85;
    return r;
  };
  Feed(fc, slow(i++));
  Feed(fc, slow(i++));
  // Two misses on the same side: nothing is published from the old regime.
  auto suspect = fc.Predict(t * kMs);
  ASSERT_TRUE(suspect.ok());
  EXPECT_TRUE(suspect->windows.empty());
  Feed(fc, slow(i++));
  EXPECT_EQ(fc.regime_changes(), 1);
  EXPECT_EQ(fc.Predict(t * kMs).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int k = 0; k < 10; ++k) Feed(fc, slow(i++));
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok());
  EXPECT_GT((*b)[0].lo_ns, 95 * kMs);  // learnt from the slow steps only
}

TEST(Forecaster, ASlowdownAfterFewStepsStartsANewRegimeWithinThreeSteps) {
  // A run's later steps are judged against the bounds from the steps before
  // it. Judged against a bound with the run in its sample, the run widened
  // it: with two slow steps among 32, type 7's quantile at 0.964 lay 0.88 of
  // the way into them, the third was no clear miss, and no change came at
  // all (a log of 30 steps, then 300 twice as long: the slow steps' data
  // stalls claimed at the old length, recall 0.51).
  Forecaster fc = Make(Opts(2000));
  WorkSteps step;
  for (int k = 0; k < 30; ++k) Feed(fc, step(50));
  ASSERT_TRUE(fc.NextStepBounds(1).ok());
  for (int k = 0; k < 3; ++k) Feed(fc, step(200));
  EXPECT_EQ(fc.regime_changes(), 1);
  EXPECT_EQ(fc.Predict(step.t * kMs).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int k = 0; k < 20; ++k) Feed(fc, step(200));
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_GT((*b)[0].lo_ns, 200 * kMs);  // learnt from the slow steps only
}

TEST(Forecaster, ASlowSpellTakenBackInALogOfEveryTenthStepLeavesALogOfEveryTenth) {
  // A change is taken back within 64 steps of the log (64 logged steps of
  // a log of every 10th, not 6.4: no change there was ever taken back), and
  // the history without the spell's steps, a gap of 50 among gaps of 10,
  // is still a log of every 10th (it had become a log of every step: a
  // stall claimed at each step between the logged ones; precision 0.85 on
  // a log of 3-step spells every 33 logged steps, each spell a change).
  Forecaster fc = Make(Opts(20000));
  WorkSteps step;
  step.i = 9;
  step.stride = 10;
  for (int k = 0; k < 100; ++k) Feed(fc, step(50));
  for (int k = 0; k < 4; ++k) Feed(fc, step(200));
  EXPECT_EQ(fc.regime_changes(), 1);
  for (int k = 0; k < 8; ++k) Feed(fc, step(50));
  EXPECT_EQ(fc.transients(), 1);
  EXPECT_EQ(fc.regime_changes(), 0);
  const int64_t s = step.i;  // the next logged step
  auto f = fc.Predict(step.t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  std::set<int64_t> stall_steps;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kDataStall) stall_steps.insert(w.step);
  }
  ASSERT_TRUE(stall_steps.count(s)) << "the next logged step's stall";
  for (const int64_t k : stall_steps) EXPECT_EQ(k % 10, 9) << "claimed at step " << k;
}

TEST(Forecaster, StepNumbersUpToTheLargestAllowedMakeNoOverflow) {
  // A log 2^54 steps apart whose last step is kMaxStepNumber, with two
  // slow spells and a slowdown in its last 5 steps: the bounds kept for a
  // run and for a change that may be taken back are those of steps after
  // the last one (a signed overflow when the last one was the int64 limit:
  // a runtime error under the asan preset's -fsanitize=undefined with
  // UBSAN_OPTIONS=halt_on_error=1, in NextStepBounds too). One past it is
  // refused, naming the limit.
  Forecaster fc = Make(Opts(2000));
  WorkSteps step;
  constexpr int64_t kGap = int64_t{1} << 54;  // 120 steps up to 2^61
  for (int k = 0; k < 120; ++k) {
    const bool spell = (k >= 40 && k < 44) || (k >= 70 && k < 74);
    const int compute = k >= 115 ? 800 : (spell ? 200 : 50);
    StepRecord r = step(compute);
    r.step = kMaxStepNumber - (119 - k) * kGap;
    Feed(fc, r);
  }
  EXPECT_EQ(fc.transients(), 2);
  EXPECT_EQ(fc.regime_changes(), 1);
  const auto bounds = fc.NextStepBounds(3);  // steps past the last one
  EXPECT_TRUE(bounds.ok() || bounds.status().code() == absl::StatusCode::kFailedPrecondition)
      << bounds.status();
  StepRecord past = step(50);
  past.step = kMaxStepNumber + 1;
  const absl::Status st = fc.Observe(past, PhaseCatalog());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("step number outside [0, 2^61]"), std::string::npos)
      << st;
}

TEST(Forecaster, ALogEndingAtTheLargestClockReadingIsForecastAsTheSameLogEarlier) {
  // The same steps at 1 s and ending at kMaxClockNs: the forecast windows
  // are those of the earlier log, shifted (a forecast of steps after the
  // last one reaches past the limit by the horizon). A time outside the
  // clock's range is refused.
  constexpr int kSteps = 200;
  constexpr int64_t kStepNs = 101 * kMs;
  const int64_t late_origin = kMaxClockNs - kSteps * kStepNs;
  std::vector<Forecast> forecasts;
  for (const int64_t origin : {int64_t{1'000'000'000}, late_origin}) {
    ForecastOptions o = Opts(2000);
    o.horizon_ns = kMaxForecastHorizonNs;
    Forecaster fc = Make(o);
    for (int k = 0; k < kSteps; ++k) {
      const int stall = k % 3 == 2 ? 40 : 5;
      Feed(fc, testing::ShiftedBy(
                   testing::MakeStep(k, 0, 100,
                                     {{phase::kDataWait, 0, stall}, {phase::kCompute, stall, 100}}),
                   origin + k * kStepNs));
    }
    const int64_t now = origin + kSteps * kStepNs - kMs;
    auto f = fc.Predict(now);
    ASSERT_TRUE(f.ok()) << f.status();
    for (IdleWindow& w : f->windows) {  // relative to the origin
      w.start_ns -= origin;
      w.earliest_start_ns -= origin;
      w.latest_start_ns -= origin;
    }
    forecasts.push_back(*std::move(f));
    EXPECT_EQ(fc.Predict(kMaxClockNs + 1).status().code(), absl::StatusCode::kInvalidArgument);
  }
  const std::vector<IdleWindow>& early = forecasts[0].windows;
  const std::vector<IdleWindow>& late = forecasts[1].windows;
  ASSERT_GT(early.size(), 10U);
  ASSERT_EQ(early.size(), late.size());
  for (size_t i = 0; i < early.size(); ++i) {
    EXPECT_EQ(early[i].step, late[i].step);
    EXPECT_EQ(early[i].kind, late[i].kind);
    // Within the double's resolution at 2^62 (512 ns).
    EXPECT_NEAR(early[i].start_ns, late[i].start_ns, 2048) << "window " << i;
    EXPECT_NEAR(early[i].latest_start_ns, late[i].latest_start_ns, 2048) << "window " << i;
    EXPECT_NEAR(early[i].duration_ns, late[i].duration_ns, 2048) << "window " << i;
  }
}

TEST(Forecaster, TakingBackASlowSpellUndoesEveryChangeSinceIt) {
  // A spell that changed twice (slow, then a stall long enough to count as
  // a restart) before the steps came back to the old regime: taking it back
  // undoes both changes.
  Forecaster fc = Make(Opts(2000));
  WorkSteps step;
  for (int k = 0; k < 100; ++k) Feed(fc, step(50));
  for (int k = 0; k < 6; ++k) Feed(fc, step(150));
  EXPECT_EQ(fc.regime_changes(), 1);
  Feed(fc, step(8000));
  EXPECT_EQ(fc.regime_changes(), 2);
  for (int k = 0; k < 10; ++k) Feed(fc, step(50));
  EXPECT_EQ(fc.transients(), 1);
  EXPECT_EQ(fc.regime_changes(), 0);
}

// Feeds `lead` steps at 50 ms of compute, then `cycles` cycles of 3 steps
// at 370 ms and 30 at 50 (a neighbour's periodic burst). Returns the share
// of the steps of the cycles from `scored_from` on that fell inside the
// next-step bound published before them; `conf` is the bounds' confidence.
double FeedSpellCycles(Forecaster& fc, int lead, int cycles, int scored_from, double& conf) {
  WorkSteps step;
  for (int k = 0; k < lead; ++k) Feed(fc, step(50));
  int scored = 0, covered = 0;
  for (int cycle = 0; cycle < cycles; ++cycle) {
    for (int k = 0; k < 33; ++k) {
      const StepRecord r = step(k < 3 ? 370 : 50);
      if (cycle >= scored_from) {
        auto b = fc.NextStepBounds(1);
        if (!b.ok()) {
          ADD_FAILURE() << "step " << r.step << ": " << b.status();
          return 0;
        }
        ++scored;
        conf = (*b)[0].confidence;
        covered += r.duration_ns() >= (*b)[0].lo_ns && r.duration_ns() <= (*b)[0].hi_ns ? 1 : 0;
      }
      Feed(fc, r);
    }
  }
  return static_cast<double>(covered) / scored;
}

TEST(Forecaster, ShortSpellsThatRecurAreLearnedAsTheJobsRhythm) {
  // 3 steps at 5 times the work every 33 steps (a neighbour's periodic
  // burst): after the first spells, the spells are part of the rhythm; each
  // is bounded as a spell, not taken for a new regime, or a change taken
  // back. (Judging a run's later steps against the bounds from before it,
  // before the spells' steps were kept when a change was taken back, made a
  // change of every spell: recall 0.887 -> 0.646, next-step coverage
  // 0.974 -> 0.958 on such a log.)
  Forecaster fc = Make(Opts(2000));
  double conf = 0;
  const double coverage = FeedSpellCycles(fc, 30, 20, 10, conf);
  EXPECT_EQ(fc.regime_changes(), 0);
  EXPECT_LE(fc.transients(), 2);
  EXPECT_GE(coverage, conf);
}

TEST(Forecaster, SpellsOfStepsOver3TimesTheUsualThatRecurStayInTheHistory) {
  // The same spells after 100 steady steps: each made a change, and the
  // spell's steps, over 3 times the steps after them, were dropped from the
  // new regime as a warm-up, so taking it back never kept them however
  // often they came: 18 transients in 18 spells, next-step coverage 0.959,
  // median slack 1.31 on such a log. (A fourth transient since the
  // split of α that a mode of long steps just above the upper end's share
  // calls for: while the history held 3.6-4.1 % of spell steps, the bound
  // left them out, and the next spell was a change taken back.)
  Forecaster fc = Make(Opts(2000));
  double conf = 0;
  const double coverage = FeedSpellCycles(fc, 100, 18, 8, conf);
  EXPECT_EQ(fc.regime_changes(), 0);
  EXPECT_LE(fc.transients(), 4);
  EXPECT_GE(coverage, conf);
}

TEST(Forecaster, ASlowSpellThatPassesIsTakenBackWithWhatItHadLearned) {
  Forecaster fc = Make(Opts(2000));
  WorkSteps step;
  for (int k = 0; k < 100; ++k) Feed(fc, step(50));
  // Four steps at more than twice the work (a noisy neighbour), then as
  // before.
  for (int k = 0; k < 4; ++k) Feed(fc, step(120));
  EXPECT_EQ(fc.regime_changes(), 1);
  for (int k = 0; k < 7; ++k) Feed(fc, step(50));
  EXPECT_EQ(fc.transients(), 0);  // 7 steps that fit the old regime: not yet
  Feed(fc, step(50));
  EXPECT_EQ(fc.regime_changes(), 0);
  EXPECT_EQ(fc.transients(), 1);
  auto f = fc.Predict(step.t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  // The old 100 steps and the 8 since, not the slow ones.
  EXPECT_EQ(f->steps_observed, 108);
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok());
  EXPECT_LT((*b)[0].hi_ns, 100 * kMs);
}

TEST(Forecaster, SpellsThatRecurStayInTheHistoryAndTheNextStepBoundCoversThem) {
  // A loader that falls behind for 4 steps at irregular times (8% of the
  // steps at 330 ms against 200 ms): each spell began a regime that was
  // taken back without its steps, so the bounds never saw one and every
  // spell's first steps missed them (fresh draws of bursty_stalls: next-step
  // coverage as low as 0.921). From the second spell on they stay.
  Forecaster fc = Make(Opts(30'000));
  Jitter j;
  const std::vector<int> starts = {37, 81, 139, 170, 226, 290, 331, 379, 440};
  int64_t t = 0;
  for (int i = 0; i < 470; ++i) {
    bool spell = false;
    for (const int s : starts) spell = spell || (i >= s && i < s + 4);
    const int64_t dw = spell ? j(130, 0.05) : j(2, 0.2);
    const int64_t c = j(190, 0.02);
    t = FeedWaitThenCompute(fc, i, t, dw, c);
  }
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_GE((*b)[0].hi_ns, 300 * kMs);
  EXPECT_LE((*b)[0].lo_ns, 200 * kMs);
}

TEST(Forecaster, ASlowdownThatStaysIsNotTakenBack) {
  Forecaster fc = Make(Opts(2000));
  Jitter j;
  int64_t t = 0;
  for (int i = 0; i < 200; ++i) {
    const int64_t compute = i < 100 ? 50 : 120;
    const int64_t dw = j(20, 0.05);
    Feed(fc, MakeStep(i, t, dw + compute + 10,
                      {{phase::kDataWait, 0, dw},
                       {phase::kCompute, dw, dw + compute},
                       {phase::kOptimizer, dw + compute, dw + compute + 10}}));
    t += dw + compute + 10;
  }
  EXPECT_EQ(fc.regime_changes(), 1);
  EXPECT_EQ(fc.transients(), 0);
}

TEST(Forecaster, ALongEvalDoesNotShortenTheNextEvalsGuaranteedLength) {
  // Ten evals of ~500 ms; the fifth ran 1 s (a slow metrics upload). Before
  // the guaranteed length of a few events came from the lower half of their
  // sample, that one long eval cut the next one's to 242 ms.
  ForecastOptions o = Opts(30'000);
  o.eval = PeriodicEvent{20, 19, 0};
  Forecaster fc = Make(o);
  const int64_t t = FeedWithEvals(
      fc, 218, 20, [](int i, Jitter& j) { return i == 99 ? int64_t{1000} : j(500, 0.02); });
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok());
  const IdleWindow* ev = FirstOfKind(*f, IdleKind::kEval);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->step, 219);
  EXPECT_GT(ev->guaranteed_ns, 400 * kMs);
  EXPECT_LT(ev->guaranteed_ns, 500 * kMs);
}

// The guaranteed length of the next eval after six evals of ~`before_ms`
// and `after` of ~`after_ms` (2% noise each), one every 20 steps.
int64_t NextEvalAfterALevelShift(int64_t before_ms, int64_t after_ms, int after = 2) {
  ForecastOptions o = Opts(30'000);
  o.eval = PeriodicEvent{20, 19, 0};
  Forecaster fc = Make(o);
  const int evals = 6 + after;
  const int64_t t = FeedWithEvals(fc, 20 * evals, 20, [&](int i, Jitter& j) {
    return j(static_cast<double>(i < 120 ? before_ms : after_ms), 0.02);
  });
  auto f = fc.Predict(t * kMs);
  EXPECT_TRUE(f.ok());
  const IdleWindow* ev = f.ok() ? FirstOfKind(*f, IdleKind::kEval) : nullptr;
  EXPECT_NE(ev, nullptr);
  EXPECT_EQ(ev == nullptr ? -1 : ev->step, 20 * evals + 19);
  return ev == nullptr ? -1 : ev->guaranteed_ns;
}

TEST(Forecaster, AnEvalWhoseLengthRisesIsClaimedFromItsNewLevelAfterThree) {
  // The demo trainer's evals shift so (the answers it generates lengthen,
  // then shorten as the model learns) while its training steps stay as they
  // were. Before an event's own level shifts were found, the next eval after
  // a rise from 300 to 500 ms was claimed 293 ms, from all nine lengths.
  const int64_t rose = NextEvalAfterALevelShift(300, 500, 3);
  EXPECT_GT(rose, 380 * kMs);
  EXPECT_LT(rose, 470 * kMs);  // below every length of the new level
  // After two of the new level, the claim is still all lengths' (two close
  // lengths after a gap are what noise makes too: see
  // AnEventsLengthsThatRoseTwiceByChanceAreNotANewLevel).
  const int64_t two = NextEvalAfterALevelShift(300, 500, 2);
  EXPECT_GT(two, 200 * kMs);
  EXPECT_LT(two, 300 * kMs);
  // After a drop, the claim is below the new level from two on (it was
  // before too: the lower half of the eight lengths is the new level's).
  const int64_t dropped = NextEvalAfterALevelShift(500, 300);
  EXPECT_GT(dropped, 200 * kMs);
  EXPECT_LT(dropped, 280 * kMs);
}

// The guaranteed length of the next eval after evals of `lengths_ms` (one
// every 20 steps, not declared); 0 when none is claimed.
int64_t NextEvalAfter(const std::vector<int64_t>& lengths_ms) {
  Forecaster fc = Make(Opts(30'000));
  const int n = static_cast<int>(lengths_ms.size());
  const int64_t t = FeedWithEvals(
      fc, 20 * n, 20, [&](int i, Jitter&) { return lengths_ms[static_cast<size_t>(i / 20)]; });
  auto f = fc.Predict(t * kMs);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return -1;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kEval && w.step == 20 * n + 19) return w.guaranteed_ns;
  }
  return 0;
}

TEST(Forecaster, AnEventsLengthsThatRoseTwiceByChanceAreNotANewLevel) {
  // Saves whose lengths vary as a lognormal of σ 0.5 (shared storage): two
  // short and two long ones by chance. Taken for a rise to a new level,
  // the fifth was claimed at 614 ms, and it took 155.
  const int64_t next = NextEvalAfter({381, 373, 740, 715});
  EXPECT_LT(next, 373 * kMs) << "claimed " << next / 1e6 << " ms";
}

TEST(Forecaster, ARiseToLengthsMeasuredBeforeIsNotANewLevel) {
  // A quick or a full eval as a coin falls: after 900, 900, 300 and 300 ms,
  // three of 900 again are one of the two modes, not a level the next keeps
  // to. Taken for a new level, the next was claimed at ~760 ms.
  const int64_t next = NextEvalAfter({900, 905, 300, 302, 898, 903, 901});
  EXPECT_LT(next, 300 * kMs) << "claimed " << next / 1e6 << " ms";
}

TEST(Forecaster, ARhythmOfEventLengthsThatNoiseBoughtIsNotClaimed) {
  // Seven saves of a lognormal of σ 0.5: split by three (313, 311, 224 |
  // 1065, 1060 | 546, 436) they fit a rhythm that the penalised fit
  // prefers, whose second class claimed the eighth at 897 ms (it took 233).
  // Each class must hold its own lengths from its others: 224 is below what
  // 313 and 311 bound.
  const int64_t next = NextEvalAfter({313, 1065, 546, 311, 1060, 436, 224});
  EXPECT_LT(next, 224 * kMs) << "claimed " << next / 1e6 << " ms";
}

TEST(Forecaster, ASlowSpellOfEvalsDoesNotShortenTheNextEvalsGuaranteedLength) {
  // make demo on a loaded machine: evals of ~120 ms idle time, then 187,
  // 170 and 128 ms. The three were taken for a new level of length (a
  // rise) and the next eval was claimed from them alone, 53 ms; all nine
  // lengths claim about the short ones' lower end.
  ForecastOptions o = Opts(30'000);
  o.eval = PeriodicEvent{20, 19, 0};
  Forecaster fc = Make(o);
  const std::vector<double> slow = {187, 170, 128};
  const int64_t t = FeedWithEvals(fc, 180, 20, [&](int i, Jitter& j) {
    const int k = i / 20;
    return k < 6 ? j(120, 0.02) : static_cast<int64_t>(slow[static_cast<size_t>(k - 6)]);
  });
  auto f = fc.Predict(t * kMs);
  ASSERT_TRUE(f.ok()) << f.status();
  const IdleWindow* ev = FirstOfKind(*f, IdleKind::kEval);
  ASSERT_NE(ev, nullptr);
  EXPECT_EQ(ev->step, 199);
  EXPECT_GT(ev->guaranteed_ns, 100 * kMs);
  EXPECT_LT(ev->guaranteed_ns, 120 * kMs);
}

TEST(Forecaster, HeavyTailedStepsAreCoveredAtLeastAtTheStatedRate) {
  Forecaster fc = Make(Opts(1000));
  std::mt19937_64 rng(11);
  std::lognormal_distribution<double> data(std::log(30.0), 0.9);
  int64_t t = 0, covered = 0, scored = 0;
  double conf = 0;
  for (int i = 0; i < 1500; ++i) {
    const auto dw = static_cast<int64_t>(data(rng)) + 1;
    const StepRecord r = Step(i, t, dw);
    if (auto b = fc.NextStepBounds(1); b.ok()) {
      ++scored;
      conf = (*b)[0].confidence;
      covered += r.duration_ns() >= (*b)[0].lo_ns && r.duration_ns() <= (*b)[0].hi_ns ? 1 : 0;
    }
    Feed(fc, r);
    t += dw + 60;
  }
  ASSERT_GT(scored, 1400);
  EXPECT_GE(static_cast<double>(covered) / static_cast<double>(scored), conf);
}

TEST(Forecaster, TheNextStepExceedsABoundFromFewHeavyTailedStepsAtMostAtItsShareOfAlpha) {
  // 300 logs of 90 steps: a lognormal data wait (median 15 ms, σ 1) before
  // ~160 ms of compute, scored from the 51st step on, where the bound's
  // upper end is the sample's quantile at 1 − 0.8·α (kDurationLoShare) and
  // the calibrator has seen few claims. From n values the next exceeds
  // their type-7 quantile about (2·level − 1)/(n + 1) more often than the
  // level says: 3.8% of these steps against 0.8·α = 3.6% (2.9% with the
  // predictive quantile).
  int64_t above = 0, below = 0, scored = 0;
  double conf = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    Forecaster fc = Make(Opts(1000));
    std::mt19937_64 rng(seed);
    std::lognormal_distribution<double> data(std::log(15.0), 1.0);
    std::normal_distribution<double> work(160, 3);
    int64_t t = 0;
    for (int i = 0; i < 90; ++i) {
      const auto dw = static_cast<int64_t>(data(rng));
      const auto cw = static_cast<int64_t>(work(rng));
      const StepRecord r =
          MakeStep(i, t, dw + cw, {{phase::kDataWait, 0, dw}, {phase::kCompute, dw, dw + cw}});
      if (auto b = fc.NextStepBounds(1); b.ok() && i > 50) {
        ++scored;
        conf = (*b)[0].confidence;
        above += r.duration_ns() > (*b)[0].hi_ns ? 1 : 0;
        below += r.duration_ns() < (*b)[0].lo_ns ? 1 : 0;
      }
      Feed(fc, r);
      t += dw + cw + 5;
    }
  }
  ASSERT_EQ(scored, 300 * 39);
  const double n = static_cast<double>(scored);
  EXPECT_LE(static_cast<double>(above) / n, 0.8 * (1 - conf)) << above << " " << below;
  EXPECT_GE(1 - static_cast<double>(above + below) / n, conf);
}

// Replays `dw` (data waits, ms) before 200 ms of compute, one step each,
// and scores the guaranteed length of each step's data-stall window in the
// forecast made after the step before: claimed and held (ms), per step.
struct StallClaims {
  std::vector<int64_t> claimed, held;
  double Precision(size_t from = 0) const {
    int64_t c = 0, h = 0;
    for (size_t i = from; i < claimed.size(); ++i) c += claimed[i], h += held[i];
    return c > 0 ? static_cast<double>(h) / static_cast<double>(c) : 1.0;
  }
  int64_t Claimed(size_t from, size_t to) const {
    int64_t c = 0;
    for (size_t i = from; i < std::min(to, claimed.size()); ++i) c += claimed[i];
    return c;
  }
};
StallClaims ReplayStallClaims(const std::vector<int64_t>& dw) {
  Forecaster fc = Make(Opts(2000));
  StallClaims out;
  out.claimed.assign(dw.size(), 0);
  out.held.assign(dw.size(), 0);
  int64_t t = 0;
  for (size_t i = 0; i < dw.size(); ++i) {
    const auto step = static_cast<int64_t>(i);
    Feed(fc, MakeStep(step, t, dw[i] + 200,
                      {{phase::kDataWait, 0, dw[i]}, {phase::kCompute, dw[i], dw[i] + 200}}));
    t += dw[i] + 200;
    auto f = fc.Predict(t * kMs);
    if (!f.ok() || i + 1 == dw.size()) continue;
    for (const IdleWindow& w : f->windows) {
      if (w.step != step + 1 || w.kind != IdleKind::kDataStall) continue;
      out.claimed[i + 1] = w.guaranteed_ns / kMs;
      out.held[i + 1] = std::min(w.guaranteed_ns / kMs, dw[i + 1]);
    }
  }
  return out;
}

TEST(Forecaster, AHeavyTailedStallStaysClaimedAfterAnEarlyMissAndItsClaimsHold) {
  // Lognormal stalls of σ 1 (median 15 ms; 5% last under 3 ms), the first
  // ten of them all within 19-33 ms, so the first claims are ~14 ms and the
  // first short stalls miss them. The margin, in spreads of ~20 ms, then
  // outgrew the ~3 ms low quantile and nothing was claimed again: no
  // outcome to narrow it, the few early claims' precision below the stated
  // confidence, none in the last 250 steps.
  std::vector<int64_t> dw = {21, 24, 29, 19, 27, 20, 23, 33, 26, 25};
  std::mt19937_64 rng(5);
  std::lognormal_distribution<double> stall(std::log(15.0), 1.0);
  while (dw.size() < 400) dw.push_back(std::max<int64_t>(1, std::llround(stall(rng))));
  const StallClaims c = ReplayStallClaims(dw);
  EXPECT_GE(c.Precision(), 0.9545);
  EXPECT_GT(c.Claimed(150, 400), 250);  // still claimed, about 2 ms a step
}

TEST(Forecaster, WaitsShortOrLongAsACoinFallsAreClaimedAtTheShortOnesLength) {
  // Each wait 18-22 ms or 270-330 ms as a coin falls. Claims that held more
  // often than needed (every long wait holds) moved the lower quantile
  // towards the median by value, and with the median in the upper mode
  // that lay in the gap between the modes: after runs of long waits, up
  // to 115 ms claimed of waits half of which last 20 (137 claims of 1,500
  // above the longest short wait).
  std::mt19937_64 rng(3);
  std::bernoulli_distribution coin(0.5);
  std::uniform_real_distribution<double> spread(0.9, 1.1);
  std::vector<int64_t> dw;
  while (dw.size() < 1500) dw.push_back(std::llround((coin(rng) ? 300 : 20) * spread(rng)));
  const StallClaims c = ReplayStallClaims(dw);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_LE(c.claimed[i], 22) << "step " << i;
  EXPECT_GE(c.Precision(), 0.9545);
}

TEST(Forecaster, AStallBurstLearnedAsARegimeIsClaimedOnlyAsTheOldRegimeClaims) {
  // A loader that falls behind for 9 steps (~120 ms stalls) among ~3 ms
  // waits. The burst is a new regime after three steps; claiming its stalls
  // for the next step failed whole at the burst's end (the next step is the
  // old regime's). While the old regime may come back, a window is claimed
  // only as both claim it; a stall length that stays is claimed once the
  // old regime can no longer come back.
  Jitter j;
  std::vector<int64_t> dw;
  for (int i = 0; i < 100; ++i) dw.push_back(j(3, 0.2));
  for (int i = 0; i < 9; ++i) dw.push_back(j(120, 0.1));
  for (int i = 0; i < 60; ++i) dw.push_back(j(3, 0.2));
  for (int i = 0; i < 200; ++i) dw.push_back(j(120, 0.1));  // a slower loader, for good
  const StallClaims c = ReplayStallClaims(dw);
  for (size_t i = 100; i < 169; ++i) EXPECT_LE(c.claimed[i], 3) << "step " << i;
  EXPECT_GE(c.Precision(), 0.9545);
  // The change at 169 stays: claimed within 64 + 8 steps (the old regime can
  // no longer come back), ~100 ms a step from then on.
  EXPECT_GT(c.Claimed(250, 369), 100 * 90);
}

// Replays `dw` (data waits, ms) as steps; returns the coverage of the
// next-step bounds and their median slack (upper end / duration).
std::pair<double, double> ReplayBounds(const std::vector<int64_t>& dw) {
  Forecaster fc = Make(Opts(1000));
  int64_t t = 0, covered = 0;
  std::vector<double> slack;
  for (size_t i = 0; i < dw.size(); ++i) {
    const StepRecord r = Step(static_cast<int64_t>(i), t, dw[i]);
    if (auto b = fc.NextStepBounds(1); b.ok()) {
      covered += r.duration_ns() >= (*b)[0].lo_ns && r.duration_ns() <= (*b)[0].hi_ns ? 1 : 0;
      slack.push_back(static_cast<double>((*b)[0].hi_ns) / static_cast<double>(r.duration_ns()));
    }
    Feed(fc, r);
    t += dw[i] + 60;
  }
  std::nth_element(slack.begin(), slack.begin() + static_cast<std::ptrdiff_t>(slack.size() / 2),
                   slack.end());
  return {static_cast<double>(covered) / static_cast<double>(slack.size()),
          slack[slack.size() / 2]};
}

// 800 data waits of 60·e^level (+ `plus`) ms, the level an AR(1) of
// coefficient `phi` and noise sd `sd`, pushed up by `push` a step from step
// `from` on.
std::vector<int64_t> ArWaits(std::mt19937_64& rng, double phi, double sd, int64_t plus,
                             int from = 800, double push = 0) {
  std::normal_distribution<double> noise(0, sd);
  std::vector<int64_t> dw;
  double level = 0;
  for (int i = 0; i < 800; ++i) {
    level = phi * level + noise(rng) + (i >= from ? push : 0.0);
    dw.push_back(static_cast<int64_t>(std::llround(60 * std::exp(level))) + plus);
  }
  return dw;
}

TEST(Forecaster, BoundsLeanOnTheRecentLevelWhenStepTimesDrift) {
  // Contention that comes and goes slowly (AR(1), φ 0.98): the next step is
  // close to the last few, though the whole series spreads widely.
  std::mt19937_64 rng(5);
  const std::vector<int64_t> drifting = ArWaits(rng, 0.98, 0.05, 1);
  // The same durations in random order: no memory to lean on.
  std::vector<int64_t> shuffled = drifting;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  const auto [drift_cover, drift_slack] = ReplayBounds(drifting);
  const auto [shuf_cover, shuf_slack] = ReplayBounds(shuffled);
  EXPECT_GE(drift_cover, 0.9545);
  EXPECT_GE(shuf_cover, 0.9545);
  // Measured: 1.10 against 1.41.
  EXPECT_LT(drift_slack, 1.2);
  EXPECT_LT(drift_slack, shuf_slack - 0.15);
}

TEST(Forecaster, ABoundOnTheRecentLevelKeepsTheWholeSeriesLowerEnd) {
  // Steps of a slow spell of contention: the bound leans on the recent
  // (high) level above, but its lower end stays where the whole series'
  // is: the contention can end at any step. It was the level's own (a step
  // back at the usual speed fell below it and counted as a miss).
  std::mt19937_64 rng(7);
  const std::vector<int64_t> dw = ArWaits(rng, 0.9, 0.02, 0, 700, 0.04);  // ~+0.4 from step 700
  Forecaster fc = Make(Opts(1000));
  int64_t t = 0;
  for (size_t i = 0; i < dw.size(); ++i) {
    Feed(fc, Step(static_cast<int64_t>(i), t, dw[i]));
    t += dw[i] + 60;
  }
  auto b = fc.NextStepBounds(1);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 1u);
  EXPECT_LT((*b)[0].lo_ns, 125 * kMs);  // the usual steps: 120 ms, ±2%
  EXPECT_GT((*b)[0].hi_ns, 140 * kMs);  // the spell's: ~150 ms
}

TEST(Forecaster, PipelineBubblesMatchTheScheduleFraction) {
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(4, 12), 3.0 / 15.0);
  EXPECT_DOUBLE_EQ(PipelineBubbleFraction(1, 8), 0.0);
  for (int stage : {0, 1, 3}) {
    ForecastOptions o = Opts(160 * 5);
    o.pipeline = PipelineSchedule{4, 12, stage, 2.0};
    Forecaster fc = Make(o);
    int64_t t = 0;
    for (int i = 0; i < 10; ++i, t += 160) {
      Feed(fc, MakeStep(i, t, 160, {{phase::kCompute, 0, 150}, {phase::kOptimizer, 150, 160}}));
    }
    auto f = fc.Predict(t * kMs);
    ASSERT_TRUE(f.ok());
    int64_t bubble = 0;
    for (const IdleWindow& w : f->windows) {
      EXPECT_EQ(w.kind, IdleKind::kPipelineBubble);
      bubble += w.duration_ns;
    }
    // 5 steps x 150 ms compute x 3/15, to rounding.
    EXPECT_NEAR(static_cast<double>(bubble), 5 * 150.0 * kMs * 0.2, 1e3) << "stage " << stage;
  }
}

TEST(Forecaster, AnswersWhetherAGuestStepAndSaveFit) {
  Forecaster fc = Make(Opts(1000));
  GuestCost g{10e6, 1e6, 5e6, 2e6};
  auto yes = fc.FitsBefore(g, 0, 20'000'000);
  ASSERT_TRUE(yes.ok());
  EXPECT_TRUE(yes->fits);
  EXPECT_EQ(yes->needed_ns, static_cast<int64_t>(std::ceil(15e6 + 2 * std::sqrt(5e12))));
  EXPECT_FALSE(fc.FitsBefore(g, 0, 19'000'000)->fits);
  g.step_mean_ns = std::nan("");
  EXPECT_EQ(fc.FitsBefore(g, 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Forecaster, RejectsBadOptionsNamingTheField) {
  ForecastOptions o;
  o.k = std::nan("");
  EXPECT_NE(Forecaster::Create(o).status().message().find("k must be"), absl::string_view::npos);
  o = ForecastOptions{};
  o.confidence = 1.0;
  EXPECT_NE(Forecaster::Create(o).status().message().find("confidence"), absl::string_view::npos);
  // erf(k/sqrt(2)) rounds to 1 from k ~ 8.375: no quantile is left to claim
  // at (a forecaster made with k = 9 crashed at its first relearn).
  for (const double k : {0.0, 8.4, 9.0, 40.0}) {
    o = ForecastOptions{};
    o.k = k;
    EXPECT_NE(Forecaster::Create(o).status().message().find("k must state a confidence"),
              absl::string_view::npos)
        << "k = " << k;
  }
  o = ForecastOptions{};
  o.k = 8.3;
  EXPECT_TRUE(Forecaster::Create(o).ok());
  o.k = 0;
  o.confidence = 0.9;  // a confidence given outright does not read k
  EXPECT_TRUE(Forecaster::Create(o).ok());
  o = ForecastOptions{};
  o.horizon_ns = 0;
  EXPECT_NE(Forecaster::Create(o).status().message().find("horizon"), absl::string_view::npos);
  o.horizon_ns = kMaxForecastHorizonNs + 1;  // added to a clock reading of up to kMaxClockNs
  EXPECT_NE(Forecaster::Create(o).status().message().find("horizon must be in (0, 2^61]"),
            absl::string_view::npos);
  o = ForecastOptions{};
  o.checkpoint = PeriodicEvent{10, 10, 0};
  EXPECT_NE(Forecaster::Create(o).status().message().find("offset"), absl::string_view::npos);
  o = ForecastOptions{};
  o.eval.every_ns = -1;
  EXPECT_NE(Forecaster::Create(o).status().message().find("eval event: every_ns"),
            absl::string_view::npos);
  o = ForecastOptions{};
  o.checkpoint = PeriodicEvent{10, 9, 0, 1'000'000'000};
  EXPECT_NE(Forecaster::Create(o).status().message().find("by steps or by wall time"),
            absl::string_view::npos);
  o = ForecastOptions{};
  o.checkpoint.wall_lag_steps = 1;  // without every_ns
  EXPECT_NE(Forecaster::Create(o).status().message().find("wall_lag_steps 1 without every_ns"),
            absl::string_view::npos);
  o = ForecastOptions{};
  o.eval.every_ns = 1'000'000'000;
  o.eval.wall_lag_steps = PeriodicEvent::kMaxWallLagSteps + 1;
  EXPECT_NE(Forecaster::Create(o).status().message().find("eval event: wall_lag_steps must be in"),
            absl::string_view::npos);
  o.eval.wall_lag_steps = PeriodicEvent::kMaxWallLagSteps;
  EXPECT_TRUE(Forecaster::Create(o).ok());
  o = ForecastOptions{};
  o.pipeline.stage = 4;
  EXPECT_NE(Forecaster::Create(o).status().message().find("stage"), absl::string_view::npos);
  o = ForecastOptions{};
  o.max_period = 0;
  EXPECT_NE(Forecaster::Create(o).status().message().find("max_period"), absl::string_view::npos);
  EXPECT_NEAR(ForecastOptions{}.StatedConfidence(), 0.9545, 1e-4);
}

TEST(ForecastTable, MicrosecondStepBoundsAndSavesKeepTheirDigits) {
  Forecast f;
  f.last_step = 2999;
  f.next_steps.push_back(StepBound{3000, 1'950, 2'460, 0.95});  // a 2 µs step
  f.next_steps.push_back(StepBound{3001, 99'000'000, 105'500'000, 0.95});
  f.save_hi_ns = 12'345;
  const std::string table = ForecastToTable(f);
  EXPECT_NE(table.find("3000:[0.00195, 0.00246]"), std::string::npos) << table;
  EXPECT_NE(table.find("3001:[99, 105.5]"), std::string::npos) << table;
  EXPECT_NE(table.find("save takes at most 0.01235 ms"), std::string::npos) << table;
}

TEST(ForecastTable, AGapBeforeAStepIsNamedAsSuch) {
  Forecast f;
  f.last_step = 9;
  IdleWindow w;
  w.step = 10;
  w.before_step = true;
  w.guaranteed_ns = 12'000'000;
  f.windows.push_back(w);
  f.next_steps.push_back(StepBound{10, 60'000'000, 66'000'000, 0.95, 14'000'000});
  const std::string table = ForecastToTable(f);
  EXPECT_NE(table.find("host_side        (before the step)"), std::string::npos) << table;
  EXPECT_NE(table.find("10:[60, 66]+14 before"), std::string::npos) << table;
}

TEST(ForecastJson, RoundTripsVersionTwoAndReadsVersionOne) {
  Forecast f;
  f.made_at_ns = 1000;
  f.horizon_ns = 5000;
  f.last_step = 7;
  f.k = 2;
  f.confidence = 0.95;
  f.devices_needed_at_ns = 1500;
  IdleWindow w;
  w.start_ns = 1100;
  w.duration_ns = 300;
  w.kind = IdleKind::kEval;
  w.confidence = 0.95;
  w.step = 8;
  w.phase = "eval";
  w.earliest_start_ns = 1050;
  w.latest_start_ns = 1100;
  w.guaranteed_ns = 350;
  w.expected_ns = 400;
  f.windows.push_back(w);
  f.next_steps.push_back(StepBound{8, 90, 120, 0.95});
  f.next_steps.push_back(StepBound{9, 90, 120, 0.95, 40});
  f.save_hi_ns = 777;
  const std::string json = ForecastToJson(f);
  EXPECT_NE(json.find("\"schema\":\"omni.forecast\""), std::string::npos);
  EXPECT_NE(json.find("\"version\":2"), std::string::npos);
  auto back = ForecastFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->windows.size(), 1u);
  EXPECT_EQ(back->windows[0].kind, IdleKind::kEval);
  EXPECT_EQ(back->windows[0].duration_ns, 300);
  EXPECT_EQ(back->windows[0].phase, "eval");
  EXPECT_EQ(back->windows[0].earliest_start_ns, 1050);
  EXPECT_EQ(back->windows[0].guaranteed_ns, 350);
  EXPECT_EQ(back->windows[0].expected_ns, 400);
  ASSERT_EQ(back->next_steps.size(), 2u);
  EXPECT_EQ(back->next_steps[0].hi_ns, 120);
  EXPECT_EQ(back->next_steps[0].gap_hi_ns, 0);
  EXPECT_EQ(back->next_steps[1].gap_hi_ns, 40);
  EXPECT_EQ(back->save_hi_ns, 777);
  EXPECT_EQ(back->devices_needed_at_ns, 1500);
  // A version-1 document (no anchoring fields) still reads.
  const std::string v1 =
      R"({"schema":"omni.forecast","version":1,"made_at_ns":0,"horizon_ns":10,"last_step":1,)"
      R"("steps_observed":3,"devices_needed_at_ns":0,"k":2,"windows":[{"start_ns":5,)"
      R"("duration_ns":2,"step":2,"kind":"data_stall","confidence":0.95}]})";
  auto old = ForecastFromJson(v1);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->windows[0].guaranteed_ns, 2);
  EXPECT_EQ(old->windows[0].latest_start_ns, 5);
  std::string newer = json;
  newer.replace(newer.find("\"version\":2"), 11, "\"version\":9");
  EXPECT_EQ(ForecastFromJson(newer).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ForecastFromJson("{]").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace omni
