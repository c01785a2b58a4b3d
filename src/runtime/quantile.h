// Empirical quantiles and the online calibrator of the forecaster's claims.
// Private to omni_core.
//
// Thread safety: plain values; not thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "omni/export.h"
#include "omni/phase.h"
#include "omni/stats.h"
#include "omni/window_channel.h"

namespace omni {

// The level-quantile (0 ≤ level ≤ 1) of `v` by linear interpolation between
// order statistics (type 7). Sorts `v` in place. REQUIRES: !v.empty().
double QuantileInPlace(std::vector<double>& v, double level);
// Same on an already sorted vector.
double QuantileSorted(const std::vector<double>& sorted, double level);
// The level-quantile of a sorted vector as a bound on the next value
// (type 6: the order statistic at level·(n + 1), interpolated, clamped to
// the least and the greatest value).
double PredictiveQuantileSorted(const std::vector<double>& sorted, double level);

// The normal quantile z with P(|Z| ≤ z) = c (0 ≤ c < 1): z = 1.96 at 0.95;
// a one-sided level 1 − p is TwoSidedZ(1 − 2p).
double TwoSidedZ(double c);
// The Student-t quantile with `nu` degrees of freedom matching the normal
// quantile z: exact for nu = 2, else the Cornish-Fisher expansion to third
// order (within 1% for nu ≥ 3 and z ≤ 2.5).
double StudentT(double z, double nu);
// The multiplier of the standard deviation in a small sample's prediction
// interval: Student-t with n − 1 degrees of freedom from n = 3 on; 1.5·z
// below, where the standard deviation comes mostly from a prior.
double SmallSampleFactor(double z, double n);

// Where the latest level of `seq` (one quantity's values in time order)
// begins: 0, or the index of the first of two consecutive values that lie
// on one side of every value since the level before began, farther from the
// nearest of them than kLevelShiftSds standard deviations (the two groups'
// pooled one, at least kLevelNoise of the new level: the noise prior
// Summarize uses for small samples; 2 and 1 more where the level before has
// 1 and 2 values). An event's length can shift while the
// steps around it do not (an eval whose generated answers grow shorter as
// the model learns), which the step-level regime detector does not see; the
// values of the level that ended would otherwise stay in the event's sample
// for a whole history window and shorten its guarantee (or, for a few
// values, leave it at the old level's). Two values are the least that show
// a level; noise of a stable level puts two in a row that far out about
// never (on the corpus and 180 fresh draws of its generators it fires only
// where a first occurrence stood apart; a heavy tail, lognormal of σ 0.3,
// does in one series of eight). Exported for its unit test.
inline constexpr double kLevelShiftSds = 4;
inline constexpr double kLevelNoise = 0.05;
OMNI_EXPORT size_t LevelShiftStart(const std::vector<double>& seq);

// The window-duration quantiles a live notice may claim from (the table the
// telemetry worker publishes, and the notice replay of omni eval): the
// upper half as QuantilesOf; each lower grid level p conservative for a
// new window, P(D ≥ q(p)) ≥ 1 − p:
//  - from the order statistic x(k), k = floor(p·(n + 1)), where k ≥ 1
//    (distribution-free for exchangeable durations; QuantilesOf's
//    interpolation is above it);
//  - below 1/(n + 1), where no measured duration vouches for the level, the
//    small-sample prediction bound min(mean, median) − t·s·√(1 + 1/n)
//    (Student-t, n − 1 degrees of freedom; s at least 5% of the mean below
//    5 values), at 0 at worst: no claim (RemainingGivenElapsed does not
//    count a grid point at 0 as time the window outlived).
// All from the values' latest level on (LevelShiftStart; `values` oldest
// first) where the values before it stand far above it (kLevelShiftSds of
// its spread, at least kLevelNoise of its mean) and it has 3 values: a
// first window that ran 5x the later ones (an eval compiling its kernels)
// would keep the small-sample bound at 0 and the upper quantiles long.
// So a window measured 3 times is not claimed at its shortest measured
// length, which a 4th window undercuts one time in four. The whole sample's
// s, not the lower half's as the forecaster's windows use: with the lower
// half's, the claims held 0.89-0.93 on normal durations from 5 and 8
// values (tests/unit/window_channel_test.cc). Defined beside QuantilesOf
// (window_notice.cc); exported for that test. Likewise a run of the last
// values below every one of 20 or more before them by a quarter of their
// least (a level of any shape before it: waits that grew through an epoch,
// then short again): 1 or 2 such values make no claim (every level 0), 3 or
// more are the sample.
OMNI_EXPORT DurationQuantiles ClaimableQuantilesOf(std::vector<double> values);

// The remaining duration an open window's reader states: the quantile
// table's (`table_ns`, RemainingGivenElapsed; -1 when nothing was measured)
// or, while the forecast's guaranteed length for the window has not
// elapsed, what is left of it when that is longer. One rule for the channel
// reader and omni eval's notice replay.
inline int64_t WithForecastClaim(int64_t table_ns, int64_t guaranteed_ns, int64_t elapsed_ns) {
  return guaranteed_ns > elapsed_ns ? std::max(table_ns, guaranteed_ns - elapsed_ns) : table_ns;
}

// Where RemainingGivenElapsed(q, elapsed_ns, confidence) ≤ 0: the least
// elapsed time after elapsed_ns at which it may be positive again (it is a
// step function of the elapsed time over q's grid, but for its cap of
// (1 − c)/c · elapsed while that is below a nanosecond); INT64_MAX where it
// never is (elapsed past the last grid point, or nothing measured). Lets a
// replay skip the polls in between (notice_replay.cc). Exported for its
// test.
OMNI_EXPORT int64_t NoClaimUntil(const DurationQuantiles& q, int64_t elapsed_ns, double confidence);

// The guaranteed length of the claim in [begin, end) for the window of
// (step, phase, kind, ordinal): 0 when there is none.
inline int64_t ClaimFor(const ForecastClaim* begin, const ForecastClaim* end, int64_t step,
                        PhaseId phase, IdleKind kind, int ordinal) {
  for (const ForecastClaim* c = begin; c != end; ++c) {
    if (c->step == step && c->phase == phase && c->kind == kind && c->ordinal == ordinal) {
      return c->guaranteed_ns;
    }
  }
  return 0;
}

// The factor the forecast's guaranteed lengths are scaled by before a
// notice may claim them, per (phase, window ordinal), so that the claim at
// a window's open, the longer of the table's and the forecast's, holds at
// `confidence` for a new window. The forecast's windows are calibrated on
// the share of their claimed time that was idle (time-weighted), not on how
// many windows outlasted their guarantee, and the longer of two claims that
// each hold at c holds only at 2c − 1 at worst; so each matched window's
// outcome is recorded as the largest factor f at which the longer claim
// would have held, max(t, f·g) ≤ D: D / g, or 0 when the table's claim t
// alone failed. The factor is the claimable quantile of the last `window`
// of them at `confidence` (ClaimableQuantilesOf, RemainingGivenElapsed at
// elapsed 0), at most 1: a new window's outcome undercuts it with
// probability at most 1 − confidence, so the longer claim holds at
// `confidence`. 0 (no forecast claim) below `min_samples` recorded windows.
// A claim is scaled by the outcomes of the claims of its own level (the
// guaranteed lengths within the same power of two) where they are enough
// for the measured order statistic to vouch for the confidence
// (MinWindowSamples: 20 at 0.95), else by the slot's all: the forecast's
// claims for a (phase, ordinal) differ in how well they hold by what they
// claim (a stall every 5th step against the 1 ms waits of the other steps,
// an eval measured once against one measured ten times), and the pooled
// factor held a well-measured level to its worst neighbour's outcomes.
// One rule for the telemetry worker, which scales the claims it publishes,
// and omni eval's notice replay.
//
// Thread safety: not thread-safe.
class OMNI_EXPORT ForecastClaimScale {
 public:
  ForecastClaimScale(int window, int min_samples, double confidence);
  // A window of (phase, ordinal) the forecast guaranteed `guaranteed_ns`
  // (unscaled; > 0) lasted `duration_ns`; the table claimed `table_ns` at
  // its open (≤ 0: nothing).
  void Record(PhaseId phase, int ordinal, int64_t duration_ns, int64_t table_ns,
              int64_t guaranteed_ns);
  // In [0, 1]: a forecast claim is never lengthened. At `confidence` when
  // it is above the one given at construction (NoticeClaimLevel's).
  double Factor(PhaseId phase, int ordinal, double confidence = 0) const;
  // The factor for a claim of `guaranteed_ns`: its level's where that has
  // MinWindowSamples outcomes, else Factor.
  double FactorAt(PhaseId phase, int ordinal, int64_t guaranteed_ns, double confidence = 0) const;
  // guaranteed_ns scaled by FactorAt (0: no claim).
  int64_t Scaled(PhaseId phase, int ordinal, int64_t guaranteed_ns, double confidence = 0) const;

 private:
  struct LevelFactor {
    double level, confidence, factor;
  };
  static double Level(int64_t guaranteed_ns);  // floor(log2(guaranteed_ns))
  size_t Slot(PhaseId phase, int ordinal) const;
  int min_samples_;
  double confidence_;
  std::vector<RollingWindow> outcomes_;  // per (phase, ordinal)
  std::vector<RollingWindow> levels_;    // the Level of each outcome's claim
  // Computed when asked for, per slot; cleared by the slot's next Record.
  mutable std::vector<std::vector<LevelFactor>> level_factors_;
  // Computed when asked for after a Record (the worker records every step
  // and asks at most once per published forecast).
  mutable std::vector<double> factor_;
  mutable std::vector<double> factor_confidence_;  // what factor_ was computed at
  mutable std::vector<char> stale_;
};

// The confidence a window notice's claims are computed at, per (phase,
// window ordinal), so that the claims at the open hold for at least the
// stated confidence of the windows: a table drawn from windows that are not
// alike (lengths that drift, or change for a stretch of steps) claims at
// its 1 − c quantile more than 1 − c of the windows do not reach. Adaptive
// conformal inference (Gibbs & Candès 2021): the miss rate the claims are
// computed at moves by gain · (1 − c − missed) after each window, a miss
// lowering it much and a hit raising it a little, never above 1 − c (the
// stated confidence is the least) nor below 0 (the shortest window the
// table vouches for). One rule for the telemetry worker, which publishes
// the confidence with each table (DurationQuantiles::claim_confidence), and
// omni eval's notice replay.
//
// Thread safety: not thread-safe.
class OMNI_EXPORT NoticeClaimLevel {
 public:
  explicit NoticeClaimLevel(double confidence, double gain = kNoticeLevelGain);
  // A window of (phase, ordinal) whose notice made a claim at the open
  // lasted at least that long (`held`) or not.
  void Record(PhaseId phase, int ordinal, bool held);
  // In [confidence, 1].
  double Confidence(PhaseId phase, int ordinal) const;
  // A miss lowers the miss rate by 0.0095 at 0.95 (a table's 129-point grid
  // is one point per 0.0078), a hit raises it by 0.0005.
  static constexpr double kNoticeLevelGain = 0.01;

 private:
  double target_;
  double gain_;
  std::vector<double> miss_rate_;
};

// Adaptive conformal calibration of one family of claims. Each claim made
// with margin m·spread (spread: the claim's own scale) is checked once its
// outcome is known; Update(miss) moves m by gain·(miss − target), so a miss
// widens the next claims a lot and a hit narrows them a little: the long-run
// miss rate converges to `target` whatever the distribution (Gibbs & Candès,
// "Adaptive conformal inference under distribution shift", 2021). The margin
// may go negative (narrowing claims that hold more often than needed), down
// to −kMaxNarrowing spreads. UpdateLoss(loss, size) does the same with a
// loss in [0, 1] (the fraction of a window's time that was not idle),
// weighted by the claim's size against the family's recent mean size (from
// the 21st claim on, at most 4x): the long-run size-weighted mean loss then
// converges to `target` (conformal risk control), which is what a
// time-weighted precision measures. Unweighted, a family of small claims that hold and
// large ones that fail met its target per claim while its precision fell
// below it (waits of 30 ms on 9 steps of 10 and 2 ms on the tenth: 6-7 ms
// claims failing among 2 ms ones that held, precision 0.949).
// How far hits can narrow claims (in spreads; see Summarize in
// forecast_windows.cc for how a negative margin narrows).
inline constexpr double kMaxNarrowing = 1.5;

// Far misses. A family may aim below the rate it states (target < `stated`:
// a margin of safety). Some misses no reachable margin catches: a step
// that a pause of 100-300 ms lengthened is 10-30 spreads beyond a bound of
// steps that vary by a few ms. Where those come in a share r of the claims
// near the safety margin or above it (3 % of GC pauses against a target of
// 2.7 %), the target cannot be met short of covering the pauses: the
// margin grew by gain·(r − target) at every claim, without end (gc_pauses
// over 5,000 steps: median slack 1.11 in the first 500, 1.49 by step
// 4,000, coverage 0.957-0.982 in each 500). Update(miss, far = true) counts
// such a miss; the family then aims at
//   target + (1 − target/stated)·min(r_far, kFarRelaxUpTo·stated)
// (r_far a low estimate of the far misses' share of its claims: (f − √f)
// of f far misses over the claims and kFarPriorClaims more, so that a few
// chance ones relax nothing): the same share of the miss budget left over
// the far misses is kept as the margin of safety, and never less than
// (1 − kFarRelaxUpTo)·(stated − target): where far misses alone come near
// the stated rate, some of them must be covered. With stated ≤ target
// nothing changes.
inline constexpr double kFarPriorClaims = 50;
inline constexpr double kFarRelaxUpTo = 0.75;

class MarginCalibrator {
 public:
  MarginCalibrator() : MarginCalibrator(0.05, 0.5) {}
  MarginCalibrator(double target_miss_rate, double gain, double stated_miss_rate = 0)
      : target_(target_miss_rate), gain_(gain), stated_(stated_miss_rate) {}
  // `far`: a miss that no margin near the present one would have caught
  // (above). Ignored unless `miss`.
  void Update(bool miss, bool far = false);
  // REQUIRES: 0 ≤ loss ≤ 1, size > 0. A claim counts as missed when loss > 0.
  void UpdateLoss(double loss, double size = 1.0);
  double margin() const { return margin_; }
  long claims() const { return claims_; }
  long misses() const { return misses_; }
  // The miss rate the family aims at now (above).
  double target() const;

 private:
  double target_;
  double gain_;
  double stated_;
  double margin_ = 0;
  double mean_size_ = 0;  // 0: no claim yet
  long claims_ = 0, misses_ = 0, far_ = 0;
};

}  // namespace omni
