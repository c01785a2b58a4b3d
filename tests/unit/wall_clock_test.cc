// The wall-clock event learner (src/runtime/wall_clock.h), compiled into the
// test binary.
#include "runtime/wall_clock.h"

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <random>

namespace omni {
namespace {

constexpr int64_t kMs = 1'000'000;

// A job whose steps' work lasts ~200 ms (5 % noise), 50 µs apart, that
// checks a timer as `check` says and saves (~700 ms) once `period` has
// passed. `keep(step)` says whether a step is logged. The occurrences as
// the forecaster records them.
std::deque<TimedOccurrence> Simulate(WallClockCheck check, int64_t period, uint64_t seed, int steps,
                                     const std::function<bool(int)>& keep,
                                     int64_t later_period = -1, int change_at = 0) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> work(std::log(200.0 * kMs), 0.05);
  std::lognormal_distribution<double> save(std::log(700.0 * kMs), 0.05);
  std::deque<TimedOccurrence> occ;
  int64_t t = 0, anchor = 0, last_logged = -1;
  TimedOccurrence quiet;  // the step logged last since the last occurrence
  quiet.quiet_step = -1;
  bool all_logged = true;
  for (int s = 0; s < steps; ++s) {
    const int64_t start = t;
    const auto w = static_cast<int64_t>(work(rng));
    const int64_t check_at = check == WallClockCheck::kStepStart ? start : start + w;
    const bool fires =
        check_at - anchor >= (later_period > 0 && s >= change_at ? later_period : period);
    int64_t end = start + w;
    TimedOccurrence o;
    if (fires) {
      o.step = s;
      o.start_ns = start;
      o.event_a_ns = start + w;
      o.event_b_ns = o.event_a_ns + static_cast<int64_t>(save(rng));
      end = o.event_b_ns;
      anchor = check == WallClockCheck::kStepStart
                   ? start
                   : (check == WallClockCheck::kWorkEnd ? o.event_a_ns : o.event_b_ns);
    }
    t = end + kMs / 20;
    if (!keep(s)) continue;
    const bool after_last = last_logged == s - 1;
    last_logged = s;
    if (!fires) {
      quiet.quiet_step = s;
      quiet.quiet_start_ns = start;
      quiet.quiet_end_ns = end;
      all_logged = all_logged && after_last;
      continue;
    }
    o.quiet_step = quiet.quiet_step;
    o.quiet_start_ns = quiet.quiet_start_ns;
    o.quiet_end_ns = quiet.quiet_end_ns;
    o.all_logged = all_logged && after_last;
    occ.push_back(o);
    if (occ.size() > static_cast<size_t>(kMaxWallClockPairs) + 1) occ.pop_front();
    quiet.quiet_step = -1;
    all_logged = true;
  }
  return occ;
}

constexpr int64_t kTol = 4 * kMs;

TEST(WallClock, TheJobsCheckFitsAndBoundsItsPeriodWithinAStep) {
  for (const WallClockCheck check :
       {WallClockCheck::kStepStart, WallClockCheck::kWorkEnd, WallClockCheck::kEventEnd}) {
    for (uint64_t seed = 1; seed <= 10; ++seed) {
      const int64_t period = 20'000 * kMs;
      const auto occ = Simulate(check, period, seed, 1200, [](int) { return true; });
      const WallClockRule r = LearnWallClock(occ, check, kTol);
      ASSERT_TRUE(r.valid()) << "check " << static_cast<int>(check) << " seed " << seed;
      EXPECT_EQ(r.pairs, kMaxWallClockPairs);
      EXPECT_LT(r.t_lo, period) << "seed " << seed;
      EXPECT_GE(r.t_hi, period) << "seed " << seed;
      EXPECT_LT(r.t_hi - r.t_lo, 200 * kMs) << "seed " << seed;
    }
  }
}

TEST(WallClock, NeedsThreePairsTwoOfThemBoundingFromBelow) {
  auto occ = Simulate(WallClockCheck::kStepStart, 10'000 * kMs, 3, 2000, [](int) { return true; });
  while (occ.size() > static_cast<size_t>(kMinWallClockPairs)) occ.pop_front();
  EXPECT_FALSE(LearnWallClock(occ, WallClockCheck::kStepStart, kTol).valid());
  occ = Simulate(WallClockCheck::kStepStart, 10'000 * kMs, 3, 2000, [](int) { return true; });
  while (occ.size() > static_cast<size_t>(kMinWallClockPairs) + 1) occ.pop_front();
  EXPECT_TRUE(LearnWallClock(occ, WallClockCheck::kStepStart, kTol).valid());
  // Occurrences on consecutive logged steps bound the period from above only.
  for (TimedOccurrence& o : occ) o.quiet_step = -1;
  EXPECT_FALSE(LearnWallClock(occ, WallClockCheck::kStepStart, kTol).valid());
}

TEST(WallClock, APeriodThatChangedIsLearnedFromTheOccurrencesSinceWhenAsked) {
  // 20 s, then 12 s from step 900: the last 9 occurrences hold both.
  const int64_t later = 12'000 * kMs;
  const auto occ = Simulate(
      WallClockCheck::kStepStart, 20'000 * kMs, 4, 1250, [](int) { return true; }, later, 900);
  ASSERT_EQ(occ.size(), static_cast<size_t>(kMaxWallClockPairs) + 1);
  EXPECT_FALSE(LearnWallClock(occ, WallClockCheck::kStepStart, kTol).valid());
  const WallClockRule r = LearnWallClock(occ, WallClockCheck::kStepStart, kTol, true);
  ASSERT_TRUE(r.valid());
  EXPECT_GE(r.pairs, kMinWallClockPairs);
  EXPECT_LT(r.pairs, kMaxWallClockPairs);
  EXPECT_LT(r.t_lo, later);
  EXPECT_GE(r.t_hi, later);
}

TEST(WallClock, EventsAtRandomStepsGiveNoRule) {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> gap(40, 160);
    std::deque<TimedOccurrence> occ;
    int64_t step = 0;
    for (int i = 0; i < 9; ++i) {
      step += gap(rng);
      TimedOccurrence o;
      o.step = step;
      o.start_ns = step * 200 * kMs;  // steady 200 ms steps
      o.event_a_ns = o.start_ns + 200 * kMs;
      o.event_b_ns = o.event_a_ns + 700 * kMs;
      o.quiet_step = step - 1;
      o.quiet_start_ns = o.start_ns - 200 * kMs;
      o.quiet_end_ns = o.start_ns;
      o.all_logged = true;
      occ.push_back(o);
    }
    EXPECT_FALSE(LearnWallClock(occ, WallClockCheck::kStepStart, kTol).valid()) << "seed " << seed;
  }
}

TEST(WallClock, FrequentSlotsAreNoEvents) {
  auto occ = Simulate(WallClockCheck::kStepStart, 1'000 * kMs, 5, 300, [](int) { return true; });
  ASSERT_GE(occ.size(), 4u);  // every ~5 steps
  EXPECT_FALSE(LearnWallClock(occ, WallClockCheck::kStepStart, kTol).valid());
}

TEST(WallClock, AnOccurrenceTheLogDoesNotShowLeavesThePeriodBounded) {
  // A third of the steps dropped: some pairs span an occurrence that was
  // not logged. They bound the period from above only (their lower bound
  // would put it near twice the period).
  int learned = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    std::minstd_rand drop(static_cast<uint32_t>(seed));
    const int64_t period = 20'000 * kMs;
    const auto occ = Simulate(WallClockCheck::kStepStart, period, seed, 1500,
                              [&](int) { return drop() % 3 != 0; });
    const WallClockRule r = LearnWallClock(occ, WallClockCheck::kStepStart, kTol);
    if (!r.valid()) continue;  // too few pairs bound it from below
    ++learned;
    EXPECT_LT(r.t_lo, period + kTol) << "seed " << seed;
    EXPECT_GE(r.t_hi + kTol, period) << "seed " << seed;
  }
  EXPECT_GE(learned, 5);
}

TEST(WallClock, CountsThePairsThatMaySpanAnOccurrenceTheLogDoesNotShow) {
  const int64_t period = 20'000 * kMs;
  // Every step logged: no pair can hide one.
  const auto all = Simulate(WallClockCheck::kStepStart, period, 3, 1500, [](int) { return true; });
  const WallClockRule r = LearnWallClock(all, WallClockCheck::kStepStart, kTol);
  ASSERT_TRUE(r.valid());
  EXPECT_EQ(r.skips, 0);
  // The occurrence at the fourth period not logged, nor the steps around
  // it: that pair spans it, the others are one period each.
  std::deque<TimedOccurrence> occ;
  for (const int k : {0, 1, 2, 4, 5, 6}) {
    const int64_t t = k * (period + 50 * kMs);
    TimedOccurrence o;
    o.step = 100 * k;
    o.start_ns = o.event_a_ns = t;
    o.event_b_ns = t + 700 * kMs;
    if (k > 0) {
      o.quiet_step = o.step - 1;  // the step before it, logged
      o.quiet_start_ns = t - 250 * kMs;
      o.quiet_end_ns = t - 50 * kMs;
    }
    occ.push_back(o);
  }
  const WallClockRule s = LearnWallClock(occ, WallClockCheck::kStepStart, kTol);
  ASSERT_TRUE(s.valid());
  EXPECT_EQ(s.pairs, 5);
  EXPECT_EQ(s.skips, 1);
}

}  // namespace
}  // namespace omni
