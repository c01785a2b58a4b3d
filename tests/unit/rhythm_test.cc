// The forecaster's private learners (src/runtime/rhythm.h, quantile.h),
// compiled into the test binary.
#include "runtime/rhythm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "runtime/quantile.h"

namespace omni {
namespace {

struct Series {
  std::vector<int64_t> steps;
  std::vector<double> values;
};

TEST(Rhythm, FindsAStallEveryThirdStepUnderNoise) {
  std::mt19937_64 rng(1);
  std::lognormal_distribution<double> noise(0, 0.1);
  Series s;
  for (int i = 0; i < 90; ++i) {
    s.steps.push_back(i);
    s.values.push_back((i % 3 == 0 ? 400.0 : 4.0) * noise(rng));
  }
  EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64), 3);
}

TEST(Rhythm, ClassesOfATrueRhythmHoldTheirMembersOutOfSample) {
  // A quick and a full eval in turn, 3% noise: each length is within what
  // the others of its class bound, over 12 seeds.
  for (int seed = 0; seed < 12; ++seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed));
    std::lognormal_distribution<double> noise(0, 0.03);
    Series s;
    for (int i = 0; i < 10; ++i) {
      s.steps.push_back(i);
      s.values.push_back((i % 2 == 0 ? 150.0 : 600.0) * noise(rng));
    }
    EXPECT_TRUE(ClassesHoldOutOfSample(s.steps, s.values, 2, 3.0, 0.05)) << "seed " << seed;
  }
}

TEST(Rhythm, ClassesThatNoiseSplitDoNotHoldTheirMembersOutOfSample) {
  // Seven lognormal lengths of σ 0.5 split by 3: 224 is below what 313 and
  // 311 bound; by 1, the whole sample's spread covers every length.
  const Series s{{0, 1, 2, 3, 4, 5, 6}, {313, 1065, 546, 311, 1060, 436, 224}};
  EXPECT_FALSE(ClassesHoldOutOfSample(s.steps, s.values, 3, 3.0, 0.05));
  EXPECT_TRUE(ClassesHoldOutOfSample(s.steps, s.values, 1, 3.0, 0.05));
  // A class of one value has nothing to hold it against.
  EXPECT_TRUE(ClassesHoldOutOfSample({0, 1}, {100, 900}, 2, 3.0, 0.05));
}

TEST(Rhythm, HeavyTailedNoiseDoesNotSelectAPeriod) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    std::lognormal_distribution<double> noise(std::log(20.0), 1.0);
    Series s;
    for (int i = 0; i < 300; ++i) {
      s.steps.push_back(i);
      s.values.push_back(noise(rng));
    }
    EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64), 1) << "seed " << seed;
  }
}

// Data waits of ~5 ms, and in `long_steps` of them ~450 ms.
Series StallsAt(const std::function<bool(int, std::mt19937_64&)>& long_step, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> wait(std::log(5.0), 0.3);
  std::normal_distribution<double> stall(450, 20);
  Series s;
  for (int i = 0; i < 512; ++i) {
    s.steps.push_back(i);
    s.values.push_back(long_step(i, rng) ? stall(rng) : wait(rng));
  }
  return s;
}

TEST(Rhythm, FindsAStallInOneStepOfFiftyAfterEachEval) {
  // A loader made again after each eval (every 50 steps) stalls the next
  // step: 2% of the steps. Winsorising at the 2nd and 98th percentiles had
  // clipped them to the short waits' length, and no period was found.
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    const Series s = StallsAt([](int i, std::mt19937_64&) { return i > 0 && i % 50 == 0; }, seed);
    EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64), 50) << "seed " << seed;
    EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64, 2.0, 4, kPeriodSearchPenalty), 50)
        << "seed " << seed;
  }
}

TEST(Rhythm, AChanceSplitOfACoinsWaitsDoesNotPayForThePeriodsSearched) {
  // Waits of 2 or 30 ms as a coin falls (1 in 10 short), 512 of them: in
  // this draw the even steps had far more short ones than the odd steps by
  // chance, and the doubled BIC alone chose period 2 (its odd class's low
  // quantile then lay in the long mode: claims of 27 ms that a short wait
  // broke one time in ten). Paying for the 64 periods tried, it chooses
  // none; 3,000 such draws chose one once without it.
  std::mt19937_64 rng(1370);
  std::bernoulli_distribution short_wait(0.1);
  std::normal_distribution<double> short_ms(2.0, 0.1), long_ms(30.0, 1.5);
  Series s;
  for (int i = 0; i < 512; ++i) {
    s.steps.push_back(i);
    s.values.push_back(short_wait(rng) ? short_ms(rng) : long_ms(rng));
  }
  EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64, 2.0, 4), 2);
  EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64, 2.0, 4, kPeriodSearchPenalty), 1);
}

TEST(Rhythm, AsManyStallsAtRandomStepsSelectNoPeriod) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const Series s = StallsAt(
        [](int, std::mt19937_64& rng) { return std::bernoulli_distribution(0.02)(rng); }, seed);
    EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64), 1) << "seed " << seed;
  }
}

TEST(Rhythm, LearnsAPeriodFromEveryTenthStep) {
  Series s;
  std::mt19937_64 rng(2);
  std::normal_distribution<double> noise(1.0, 0.02);
  for (int i = 9; i < 3000; i += 10) {
    s.steps.push_back(i);
    s.values.push_back((i % 3 == 0 ? 300.0 : 5.0) * noise(rng));
  }
  EXPECT_EQ(ChoosePeriod(s.steps, s.values, 64), 3);
}

TEST(Rhythm, TooShortASeriesHasNoPeriod) {
  EXPECT_EQ(ChoosePeriod({0, 1, 2, 3}, {1, 9, 1, 9}, 64), 1);
}

TEST(Rhythm, EqualSpacingMakesARule) {
  const SpacingRule r = LearnSpacing({5, 17, 29});
  EXPECT_EQ(r.every, 12);
  EXPECT_EQ(r.offset, 5);
  EXPECT_TRUE(r.OccursAt(41));
  EXPECT_FALSE(r.OccursAt(40));
  EXPECT_EQ(LearnSpacing({5, 17, 30}).every, 0);
  EXPECT_EQ(LearnSpacing({17, 29}).every, 0);
  EXPECT_EQ(LearnSpacing({3, 4, 5}).every, 0);  // every step is no event
}

TEST(Rhythm, GapsThatAreMultiplesOfOneSpacingMakeARuleAcrossMissingSteps) {
  // An eval every 100 steps whose occurrence at 299 is not in the log.
  const SpacingRule r = SpacingAcrossGaps({99, 199, 399});
  EXPECT_EQ(r.every, 100);
  EXPECT_EQ(r.offset, 99);
  EXPECT_TRUE(r.OccursAt(499));
  EXPECT_EQ(SpacingAcrossGaps({99, 199, 299}).every, 0);  // equal gaps: LearnSpacing's
  EXPECT_EQ(SpacingAcrossGaps({5, 17, 30}).every, 0);     // no common spacing
  EXPECT_EQ(SpacingAcrossGaps({0, 12, 20}).every, 0);     // 4: below kMinSpacingFromTwo
  EXPECT_EQ(SpacingAcrossGaps({0, 10, 100}).every, 0);    // 9 spacings: too many skipped
  EXPECT_EQ(SpacingAcrossGaps({10, 30}).every, 0);
}

TEST(Rhythm, TwoOccurrencesMakeARuleOnlyWhenTheyExplainTheWholeLog) {
  // An eval at 19 and 39 in a log from step 0: the one before would have
  // been at -1, before the log: every 20 steps, next at 59.
  const SpacingRule r = SpacingFromTwo({19, 39}, 0);
  EXPECT_EQ(r.every, 20);
  EXPECT_TRUE(r.OccursAt(59));
  // A log resumed at step 1000: evals at 1099 and 1199.
  EXPECT_EQ(SpacingFromTwo({1099, 1199}, 1000).every, 100);
  // Something at 50 and 80 of a log from 0 would have been at 20 too: it
  // was not, so it is no periodic event.
  EXPECT_EQ(SpacingFromTwo({50, 80}, 0).every, 0);
  // Short spacings need more evidence (LearnSpacing's four occurrences).
  EXPECT_EQ(SpacingFromTwo({2, 7}, 0).every, 0);
  EXPECT_EQ(SpacingFromTwo({19, 39, 59}, 0).every, 0);  // only for exactly two
}

// The first n occurrences floor((k·every + phi) / den), k = 1, 2, ...
std::vector<int64_t> Occurrences(int64_t every, int64_t den, int64_t phi, int n) {
  std::vector<int64_t> v;
  for (int64_t k = 1; k <= n; ++k) v.push_back((k * every + phi) / den);
  return v;
}

TEST(Rhythm, GapsOfTwoAlternatingLengthsMakeAFractionalRuleOnceTheyDecideIt) {
  // An eval every 312.5 steps (every 10,000 samples at 32 a step): at 312,
  // 624, 937, 1249, 1562, 1874, ... The fit needs two cycles of its gaps (4
  // for 625/2), and the fit of the occurrences before the last must have
  // put the last where it came.
  const std::vector<int64_t> half = Occurrences(625, 2, -1, 6);
  ASSERT_EQ(half, (std::vector<int64_t>{312, 624, 937, 1249, 1562, 1874}));
  EXPECT_EQ(FractionalSpacing({half.begin(), half.end() - 1}).every, 0);  // nothing confirms it
  const SpacingRule r = FractionalSpacing(half);
  ASSERT_EQ(r.every, 625);
  ASSERT_EQ(r.den, 2);
  for (const int64_t s : {312, 624, 937, 1249, 1562, 1874, 2187}) EXPECT_TRUE(r.OccursAt(s)) << s;
  for (const int64_t s : {313, 625, 1250, 1873, 1875, 2186}) EXPECT_FALSE(r.OccursAt(s)) << s;
  EXPECT_EQ(r.NextAt(1563), 1874);
  EXPECT_EQ(r.NextAt(1874), 1874);
  EXPECT_EQ(r.NextAt(1875), 2187);
  EXPECT_EQ(r.Index(1874) - r.Index(1562), 1);  // consecutive occurrences, consecutive numbers
  // 937/3 (312, 624, 937, 1249, 1561, ...): its first gaps fit 625/2 as
  // well, and the least den is the guess until a gap proves it wrong; then
  // 937/3 needs its own two cycles (6 gaps) and a confirmation.
  const std::vector<int64_t> third = Occurrences(937, 3, 0, 9);
  ASSERT_EQ(third[4], 1561);
  for (ptrdiff_t n = 4; n < 8; ++n) {
    EXPECT_NE(FractionalSpacing({third.begin(), third.begin() + n}).den, 3) << n;
  }
  const SpacingRule r3 = FractionalSpacing({third.begin(), third.begin() + 8});
  EXPECT_EQ(r3.every, 937);
  EXPECT_EQ(r3.den, 3);
  EXPECT_EQ(r3.NextAt(third[7] + 1), third[8]);
  // A first stall at step 0, then one every 62.5 steps from 62 (a recorded
  // LM trainer): the run from 62 fits.
  EXPECT_EQ(FractionalSpacing({0, 62, 124, 187, 249, 312}).every, 0);
  const SpacingRule epoch = FractionalSpacing({0, 62, 124, 187, 249, 312, 374});
  EXPECT_EQ(epoch.every, 125);
  EXPECT_EQ(epoch.NextAt(375), 437);
  // Wall-time checkpoints whose gaps only look fractional: no rule.
  EXPECT_EQ(FractionalSpacing({0, 85, 170, 255, 339, 424, 510}).every, 0);
  // A validation four times an epoch of 1001 batches (250, 250, 250, 251),
  // seen for two epochs and one more validation.
  const SpacingRule q =
      FractionalSpacing({250, 500, 750, 1001, 1251, 1501, 1751, 2002, 2252, 2502});
  ASSERT_EQ(q.every, 1001);
  ASSERT_EQ(q.den, 4);
  EXPECT_EQ(q.NextAt(2503), 2752);
  // Not a fraction: equal gaps (LearnSpacing's), gaps two apart, short
  // gaps, or gaps of one length only after a gap of another.
  EXPECT_EQ(FractionalSpacing({100, 200, 300, 400, 500, 600, 700}).every, 0);
  EXPECT_EQ(FractionalSpacing({100, 200, 302, 402, 504, 604, 706}).every, 0);
  EXPECT_EQ(FractionalSpacing({0, 5, 11, 16, 22, 27, 33, 38}).every, 0);
  EXPECT_EQ(FractionalSpacing({0, 50, 300, 400, 500, 600, 700}).every, 0);
}

TEST(Rhythm, AWholeSpacingRuleKeepsItsStepArithmetic) {
  const SpacingRule r{100, 99};
  EXPECT_TRUE(r.OccursAt(199));
  EXPECT_FALSE(r.OccursAt(200));
  EXPECT_EQ(r.NextAt(200), 299);
  EXPECT_EQ(r.NextAt(299), 299);
  EXPECT_EQ(r.Index(299), 2);
}

TEST(Quantile, InterpolatesBetweenOrderStatistics) {
  std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(QuantileInPlace(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(QuantileSorted(v, 0), 1);
  EXPECT_DOUBLE_EQ(QuantileSorted(v, 1), 4);
  EXPECT_DOUBLE_EQ(QuantileSorted({7}, 0.3), 7);
}

TEST(Quantile, APredictiveQuantileIsExceededByTheNextValueAtItsLevel) {
  // From n exchangeable values the next exceeds the k-th least with
  // probability (n + 1 − k)/(n + 1): the order statistic at level·(n + 1)
  // is exceeded at 1 − level whatever the distribution. Type 7's (at
  // level·(n − 1) + 1) is exceeded about (2·level − 1)/(n + 1) more often:
  // near 5% instead of 3.6% from 50 values.
  std::mt19937_64 rng(3);
  std::lognormal_distribution<double> tail(0, 1);
  constexpr double kLevel = 0.9636;
  constexpr int kTrials = 20000;
  int over_predictive = 0, over_type7 = 0;
  for (int k = 0; k < kTrials; ++k) {
    std::vector<double> v(50);
    for (double& x : v) x = tail(rng);
    std::sort(v.begin(), v.end());
    const double next = tail(rng);
    over_predictive += next > PredictiveQuantileSorted(v, kLevel) ? 1 : 0;
    over_type7 += next > QuantileSorted(v, kLevel) ? 1 : 0;
  }
  // Between the order statistics it interpolates by value, which over a
  // heavy tail's wide gaps lies above the level: exceeded at most at 1 −
  // level, and at least as often as the greatest value (1/51).
  const double predictive = over_predictive / static_cast<double>(kTrials);
  EXPECT_LE(predictive, 1 - kLevel + 0.003);
  EXPECT_GE(predictive, 1.0 / 51 - 0.003);
  EXPECT_GT(over_type7 / static_cast<double>(kTrials), 1 - kLevel + 0.01);
  // Clamped to the sample where the level lies beyond it.
  EXPECT_DOUBLE_EQ(PredictiveQuantileSorted({1, 2, 3, 4}, 0.95), 4);
  EXPECT_DOUBLE_EQ(PredictiveQuantileSorted({1, 2, 3, 4}, 0.1), 1);
  EXPECT_DOUBLE_EQ(PredictiveQuantileSorted({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(PredictiveQuantileSorted({1, 2, 3, 4}, 0.7), 3.5);
}

TEST(LevelShift, TwoValuesFarOnOneSideStartANewLevel) {
  EXPECT_EQ(LevelShiftStart({300, 306, 295, 301, 298, 303, 500, 505}), 6U);
  EXPECT_EQ(LevelShiftStart({500, 506, 495, 501, 298, 303}), 4U);
  // The demo's evals: a short first one, ~205 ms, then ~125 ms.
  EXPECT_EQ(LevelShiftStart({134.8, 209.2, 211.3, 201.0, 202.8, 206.0}), 1U);
  EXPECT_EQ(LevelShiftStart({134.8, 209.2, 211.3, 201.0, 202.8, 206.0, 121.2, 129.3, 120.1}), 6U);
}

TEST(LevelShift, OneValueApartOrAFewValuesIsNoShift) {
  EXPECT_EQ(LevelShiftStart({}), 0U);
  EXPECT_EQ(LevelShiftStart({100, 200}), 0U);
  EXPECT_EQ(LevelShiftStart({300, 306, 295, 301, 500, 303, 298}), 0U);  // one long value
  EXPECT_EQ(LevelShiftStart({300, 306, 295, 301, 350, 352}), 0U);  // 44 ms out: 2.9 sd of 15 ms
  // The corpus's checkpoints: noise of ~8%, the first pairs far apart.
  EXPECT_EQ(LevelShiftStart({748.0, 722.1, 762.2, 844.0, 835.8, 883.0, 709.6, 692.9, 812.8}), 0U);
}

TEST(LevelShift, NoiseOfTheAssumedSizeAboutNeverLooksLikeAShift) {
  // 1,000 series of 30 values each with normal noise of 5% (the prior) and
  // of 10%. A heavier tail (lognormal, σ 0.3) does look like a shift in
  // about one series of eight, mostly between the first values; the
  // forecaster's eval claims on such lengths held as before (20 logs each;
  // docs/telemetry.md).
  std::mt19937_64 rng(5);
  int shifts5 = 0, shifts10 = 0;
  for (int k = 0; k < 1000; ++k) {
    std::vector<double> a, b;
    std::normal_distribution<double> five(1000, 50), ten(1000, 100);
    for (int i = 0; i < 30; ++i) {
      a.push_back(five(rng));
      b.push_back(ten(rng));
    }
    shifts5 += LevelShiftStart(a) != 0;
    shifts10 += LevelShiftStart(b) != 0;
  }
  EXPECT_LE(shifts5, 2);
  EXPECT_LE(shifts10, 10);
}

TEST(Calibration, MissRateConvergesToTheTargetWhateverTheDistribution) {
  // Claims "x <= q + margin·spread" with q the median of a heavy-tailed
  // stream: half would miss without calibration.
  MarginCalibrator cal(0.05, 0.5);
  std::mt19937_64 rng(5);
  std::lognormal_distribution<double> x(0, 1.0);
  long misses = 0, n = 0;
  for (int i = 0; i < 20000; ++i) {
    const bool miss = x(rng) > 1.0 + cal.margin() * 1.0;
    cal.Update(miss);
    if (i >= 2000) {
      ++n;
      misses += miss ? 1 : 0;
    }
  }
  EXPECT_NEAR(static_cast<double>(misses) / static_cast<double>(n), 0.05, 0.01);
  EXPECT_GT(cal.margin(), 1.0);
}

TEST(Calibration, FarMissesOutOfReachRelaxTheTargetInsteadOfWideningWithoutEnd) {
  // Claims "x <= 1.5 + margin" of x ~ N(0, 1), but 3 % of the x are 100:
  // more than the family's target (0.6·α of a stated α of 0.0455), and no
  // margin short of 98 catches them. Counted as plain misses, the margin
  // grows at every claim; counted as far misses, the target moves up by
  // 0.4 of their share and the margin settles where the other misses fill
  // what is left (~0.9 %), with the miss rate between target and stated.
  const double stated = 0.0455;
  for (const bool tell_far : {false, true}) {
    MarginCalibrator cal(0.6 * stated, 0.2, stated);
    std::mt19937_64 rng(11);
    std::normal_distribution<double> x(0, 1);
    std::bernoulli_distribution far(0.03);
    long misses = 0, n = 0;
    for (int i = 0; i < 20000; ++i) {
      const double v = far(rng) ? 100.0 : x(rng);
      const double claim = 1.5 + cal.margin();
      const bool miss = v > claim;
      cal.Update(miss, tell_far && v > claim + 3);
      if (i >= 4000) {
        ++n;
        misses += miss ? 1 : 0;
      }
    }
    const double rate = static_cast<double>(misses) / static_cast<double>(n);
    if (tell_far) {
      EXPECT_LT(cal.margin(), 1.5);
      EXPECT_GT(rate, 0.6 * stated);
      EXPECT_LT(rate, stated);
      EXPECT_NEAR(cal.target(), 0.6 * stated + 0.4 * 0.03, 0.003);
    } else {
      EXPECT_GT(cal.margin(), 5.0);
      EXPECT_EQ(cal.target(), 0.6 * stated);
    }
  }
}

TEST(Calibration, MeanLossConvergesToTheTargetAndHitsNarrowClaims) {
  // A window [0, w) claimed idle where the real idle lasts X ~ lognormal
  // (median 1): the loss is the fraction of the window not idle. Too wide
  // (w = 3: a mean loss of ~0.6) the margin grows until the mean loss is the
  // target; too narrow (w = 0.5: almost never a loss) it goes negative and
  // the window widens to the target.
  for (const double base : {3.0, 0.5}) {
    MarginCalibrator cal(0.05, 0.2);
    std::mt19937_64 rng(7);
    std::lognormal_distribution<double> x(0, 0.25);
    double loss_sum = 0;
    long n = 0;
    for (int i = 0; i < 40000; ++i) {
      const double w = std::max(base - 0.3 * cal.margin(), 1e-3);
      const double loss = std::max(w - x(rng), 0.0) / w;
      cal.UpdateLoss(std::min(loss, 1.0));
      if (i >= 4000) {
        ++n;
        loss_sum += std::min(loss, 1.0);
      }
    }
    EXPECT_NEAR(loss_sum / static_cast<double>(n), 0.05, 0.01) << base;
    if (base < 1) {
      EXPECT_LT(cal.margin(), 0) << base;
    }
  }
}

TEST(Calibration, TheSizeWeightedLossConvergesToTheTargetWhenClaimSizesDiffer) {
  // Half the claims are small (1) and always hold; the other half large
  // (~10, narrowed or widened by the margin) and sometimes fail. Counted
  // per claim the large ones failed twice as much as the target (mean loss
  // 0.05 over all claims, 0.09 of the claimed time); weighted by their size
  // the claimed time lost is the target.
  MarginCalibrator cal(0.05, 0.2);
  std::mt19937_64 rng(9);
  std::lognormal_distribution<double> x(std::log(10.0), 0.25);
  std::bernoulli_distribution small(0.5);
  double lost = 0, claimed = 0;
  for (int i = 0; i < 40000; ++i) {
    double size = 1, loss = 0;
    if (!small(rng)) {
      size = std::max(10.0 - 3 * cal.margin(), 1e-3);
      loss = std::min(std::max(size - x(rng), 0.0) / size, 1.0);
    }
    cal.UpdateLoss(loss, size);
    if (i >= 4000) {
      lost += loss * size;
      claimed += size;
    }
  }
  EXPECT_NEAR(lost / claimed, 0.05, 0.01);
}

}  // namespace
}  // namespace omni
