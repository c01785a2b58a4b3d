// Empirical quantiles and the online calibrator of the forecaster's claims.
// Private to omni_core.
//
// Thread safety: plain values; not thread-safe.
#pragma once

#include <vector>

namespace omni {

// The level-quantile (0 ≤ level ≤ 1) of `v` by linear interpolation between
// order statistics (type 7). Sorts `v` in place. REQUIRES: !v.empty().
double QuantileInPlace(std::vector<double>& v, double level);
// Same on an already sorted vector.
double QuantileSorted(const std::vector<double>& sorted, double level);

// Adaptive conformal calibration of one family of claims. Each claim made
// with margin m·spread (spread: the claim's own scale) is checked once its
// outcome is known; Update(miss) moves m by gain·(miss − target), so a miss
// widens the next claims a lot and a hit narrows them a little: the long-run
// miss rate converges to `target` whatever the distribution (Gibbs & Candès,
// "Adaptive conformal inference under distribution shift", 2021). The margin
// may go negative (narrowing claims that hold more often than needed), down
// to −kMaxNarrowing spreads. UpdateLoss(loss) does the same with a loss in
// [0, 1] (the fraction of a window's time that was not idle): the long-run
// mean loss then converges to `target` (conformal risk control), which is
// what a time-weighted precision measures.
// How far hits can narrow claims (in spreads; see Summarize in
// forecast_windows.cc for how a negative margin narrows).
inline constexpr double kMaxNarrowing = 1.5;

class MarginCalibrator {
 public:
  MarginCalibrator() : MarginCalibrator(0.05, 0.5) {}
  MarginCalibrator(double target_miss_rate, double gain) : target_(target_miss_rate), gain_(gain) {}
  void Update(bool miss) { UpdateLoss(miss ? 1.0 : 0.0); }
  // REQUIRES: 0 ≤ loss ≤ 1. A claim counts as missed when loss > 0.
  void UpdateLoss(double loss);
  double margin() const { return margin_; }
  long claims() const { return claims_; }
  long misses() const { return misses_; }

 private:
  double target_;
  double gain_;
  double margin_ = 0;
  long claims_ = 0, misses_ = 0;
};

}  // namespace omni
