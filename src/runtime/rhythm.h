// The job's rhythm: periods learned from a step-indexed series, and events
// learned from the steps at which something happened. Private to omni_core.
//
// Thread safety: pure functions and plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace omni {

// The period P in [1, max_period] whose residue classes (step mod P) explain
// `values` best: least squares per class after winsorising the values at
// their 1/(2·max_period) and 1 − 1/(2·max_period) quantiles, at most 2%
// (so single outliers buy nothing, while a class of the longest period,
// 1/max_period of the values, is not clipped: a stall in one step of 50),
// scored
//   n·ln(SSE_P/n + floor) + penalty·(non-empty classes)·ln(n)
// (BIC with a doubled penalty, so that noise does not select a period).
// Periods with fewer than `min_per_class` values per class on average are
// not considered. Any period above 1 pays `search_penalty`·ln(the number
// of periods tried) on top: the price of having looked at that many (each
// relearn tries up to 64, and a chance split passes the doubled BIC now
// and then: a 2-or-30 ms wait as a coin falls, 9 short ones in 256 odd
// steps against 34 in the even ones, chose period 2, and the odd steps'
// waits were claimed at 27 ms).
// REQUIRES: steps.size() == values.size(), min_per_class ≥ 2.
int ChoosePeriod(const std::vector<int64_t>& steps, const std::vector<double>& values,
                 int max_period, double penalty = 2.0, int min_per_class = 3,
                 double search_penalty = 0.0);

// The search penalty the forecaster's steps' and slots' periods pay: with
// 64 periods tried, ln 64 ≈ 4.2 on top of the 2·ln n (12.5 at 512 values)
// each class costs. On 193 logs (the corpus, 150 fresh draws of its
// generators, the real recordings) it changed 19, every one by a hair but
// the coin's (precision 0.9525 → 0.9618 against a claim of 0.9545).
inline constexpr double kPeriodSearchPenalty = 1.0;

// Whether the residue classes (step mod `period`) of `values` hold each of
// their members out of sample: every value is at least the lower bound of
// a prediction from its class's other values (log scale: the others' mean
// less SmallSampleFactor(z, n)·s·√(1 + 1/n), s their standard deviation, at
// least `min_cv`), wherever its class has another value. A period that
// noise bought fails it: seven lognormal lengths of σ 0.5 split by 3 gave
// a class of 313, 311 and 224 ms, whose first two bound the third at ~237.
// REQUIRES: steps.size() == values.size(), period ≥ 1.
bool ClassesHoldOutOfSample(const std::vector<int64_t>& steps, const std::vector<double>& values,
                            int period, double z, double min_cv);

// An event seen at equally spaced steps: with den == 1 it occurs at every
// step s with s % every == offset; with den > 1 its spacing is the fraction
// every / den (an eval every 10,000 samples at 32 a step: 625 / 2, steps
// 312 and 313 apart in turn), and its k-th occurrence is at step
// floor((k·every + offset) / den). None when every == 0.
// INVARIANT: 0 ≤ offset < every, den ≥ 1, every ≥ den.
struct SpacingRule {
  int64_t every = 0;
  int64_t offset = 0;
  int64_t den = 1;
  bool OccursAt(int64_t step) const;
  // The first step ≥ `from` (≥ 0) at which the event occurs. REQUIRES: every > 0.
  int64_t NextAt(int64_t from) const;
  // The number k of the occurrence at `step` (an occurrence: consecutive
  // occurrences have consecutive numbers); step / every when den == 1.
  // REQUIRES: every > 0.
  int64_t Index(int64_t step) const;
};

// The rule behind the last occurrences (ascending steps): the last three
// must be equally spaced (spacing ≥ 2). Otherwise no rule.
SpacingRule LearnSpacing(const std::vector<int64_t>& occurrences);

// The rule behind the last three occurrences when steps are missing from
// the log (a telemetry ring that dropped steps, a sampled log whose stride
// is no divisor of the event's): the two gaps are multiples (at most
// kMaxGapMultiple) of one spacing d ≥ kMinSpacingFromTwo, their greatest
// common divisor, and not equal (LearnSpacing's case). The caller must check
// that every logged step where the rule puts the event has it: the rule
// skips only steps that are not in the log. Otherwise no rule.
inline constexpr int64_t kMaxGapMultiple = 8;
SpacingRule SpacingAcrossGaps(const std::vector<int64_t>& occurrences);

// The rule behind an event's only two occurrences a < b (the caller knows
// there were no others), when their spacing d = b − a is at least
// kMinSpacingFromTwo and the rule explains the whole log: the occurrence
// before a, at a − d, would have come before the log's first step
// `first_step` (a periodic eval or checkpoint whose first occurrence falls
// in the first period of the log). A rare slot at random steps rarely
// passes (its first gap would have to exceed its first step), and one that
// does costs one false claim before its rule fails. Otherwise no rule.
inline constexpr int64_t kMinSpacingFromTwo = 8;
SpacingRule SpacingFromTwo(const std::vector<int64_t>& occurrences, int64_t first_step);

// The fractional rule (den in 2..kMaxSpacingDen) behind the last
// occurrences when their gaps take two values g and g + 1 (g ≥
// kMinSpacingFromTwo). The fit of a run of such gaps is the fraction
// every/den in (g, g + 1) of least den, with an offset, that puts
// consecutive occurrences exactly there, from two whole cycles of its
// pattern of gaps at least (2·den gaps, both values among them); when that
// den has several such fractions or offsets, they must put the next
// kFractionalAgreement occurrences at the same steps (otherwise the
// occurrences do not decide yet: none). A larger den that fits as well is
// not ruled out (625/2 and 937/3 both fit gaps 312, 313, 312). So a rule is
// returned only when the fit of the run without its last occurrence put
// that occurrence where it came (out of sample); then it is the fit of the
// whole run. The run is the longest one at the end for which that holds (a
// first occurrence off the rhythm, like a stall at step 0, is left out). A
// wrong guess after that fails at the step it names, and the caller learns
// again from more occurrences.
inline constexpr int64_t kMaxSpacingDen = 8;
inline constexpr size_t kMinFractionalGaps = 4;  // two cycles of den 2
inline constexpr int kFractionalAgreement = 2;
SpacingRule FractionalSpacing(const std::vector<int64_t>& occurrences);

// The recent level of a series with memory (a slow drift, contention that
// comes and goes): the next value is predicted by the median of the last k
// values, with a residual distributed like the past residuals about their
// own preceding k. `classes` are the series of a quantity's residue classes
// (oldest first each). Returns the k from kLevelWindows whose residuals,
// pooled over the classes, give the narrowest interval [q(lo), q(hi)]; 0
// when none is narrower than kLevelGain of the same interval of the values'
// deviations from their class medians (a series without memory), or when
// fewer than `min_n` residuals can be formed.
inline constexpr int kLevelWindows[] = {1, 2, 4, 8, 16};
inline constexpr double kLevelGain = 0.9;
int ChooseLevelWindow(const std::vector<std::vector<double>>& classes, double lo, double hi,
                      size_t min_n);
// x[i] − (median of x[i−k, i)) for i ≥ k, in order. REQUIRES: k ≥ 1.
void LevelResiduals(const std::vector<double>& x, int k, std::vector<double>& out);
// The median of the last k values. REQUIRES: 1 ≤ k ≤ 16, x.size() ≥ k.
double RecentLevel(const std::vector<double>& x, int k);
// The median of the k values before x[end]. REQUIRES: 1 ≤ k ≤ 16, k ≤ end ≤ x.size().
double LevelBefore(const std::vector<double>& x, size_t end, int k);

}  // namespace omni
