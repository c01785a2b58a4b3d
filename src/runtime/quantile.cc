#include "quantile.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace omni {

namespace {

// The value at 0-based position `pos` of a sorted vector, interpolated
// between its neighbours, clamped to its least and greatest values.
double AtPosition(const std::vector<double>& v, double pos) {
  if (pos <= 0) return v.front();
  const auto i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= v.size()) return v.back();
  const double f = pos - static_cast<double>(i);
  return v[i] + f * (v[i + 1] - v[i]);
}

}  // namespace

double QuantileSorted(const std::vector<double>& v, double level) {
  return AtPosition(v, std::clamp(level, 0.0, 1.0) * static_cast<double>(v.size() - 1));
}

double PredictiveQuantileSorted(const std::vector<double>& v, double level) {
  return AtPosition(v, std::clamp(level, 0.0, 1.0) * static_cast<double>(v.size() + 1) - 1);
}

double QuantileInPlace(std::vector<double>& v, double level) {
  std::sort(v.begin(), v.end());
  return QuantileSorted(v, level);
}

// By bisection of erf(z/√2) = c: 60 evaluations of erf. Its callers ask
// for the same few levels again and again (the live notices' lowest level,
// once per window and step), so the last answer is kept, per thread.
double TwoSidedZ(double c) {
  thread_local double last_c = std::numeric_limits<double>::quiet_NaN();
  thread_local double last_z = 0;
  if (c == last_c) return last_z;
  double lo = 0, hi = 10;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (std::erf(mid / std::sqrt(2.0)) < c ? lo : hi) = mid;
  }
  last_c = c;
  last_z = (lo + hi) / 2;
  return last_z;
}

double StudentT(double z, double nu) {
  if (nu < 2.5) {
    const double p = 0.5 * (1 + std::erf(z / std::sqrt(2.0)));
    return (2 * p - 1) / std::sqrt(2 * p * (1 - p));
  }
  const double z3 = z * z * z, z5 = z3 * z * z, z7 = z5 * z * z;
  return z + (z3 + z) / (4 * nu) + (5 * z5 + 16 * z3 + 3 * z) / (96 * nu * nu) +
         (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * nu * nu * nu);
}

double SmallSampleFactor(double z, double n) { return n >= 3 ? StudentT(z, n - 1) : 1.5 * z; }

size_t LevelShiftStart(const std::vector<double>& seq) {
  size_t start = 0;
  // The level before, seq[start, i - 1): its count, extremes, mean and sum
  // of squared deviations (Welford), kept as i advances (one pass).
  double k = 0, old_lo = 0, old_hi = 0, old_mean = 0, old_ss = 0;
  for (size_t i = 1; i < seq.size(); ++i) {
    const double lo = std::min(seq[i - 1], seq[i]), hi = std::max(seq[i - 1], seq[i]);
    const double gap =
        k == 0 ? 0.0 : (lo > old_hi ? lo - old_hi : (hi < old_lo ? old_lo - hi : 0.0));
    if (gap > 0) {
      // The two groups' pooled standard deviation (k − 1 + 1 degrees of
      // freedom), at least kLevelNoise of the new level.
      const double new_mean = (lo + hi) / 2;
      const double ss = old_ss + (hi - lo) * (hi - lo) / 2;
      const double sd = std::max(std::sqrt(ss / k), kLevelNoise * std::abs(new_mean));
      // Fewer values before: a larger gap (6, 5, then 4 sds; normal noise
      // of 10%, twice the prior, shifts one series of 30 values in 200).
      const double sds = k < 2 ? kLevelShiftSds + 2 : (k < 3 ? kLevelShiftSds + 1 : kLevelShiftSds);
      if (gap > sds * sd) {
        start = i - 1;
        k = 0;
      }
    }
    // seq[i - 1] joins the level before the next pair (seq[i], seq[i + 1]).
    const double x = seq[i - 1];
    if (k == 0) {
      old_lo = old_hi = old_mean = x;
      old_ss = 0;
    } else {
      old_lo = std::min(old_lo, x);
      old_hi = std::max(old_hi, x);
      const double delta = x - old_mean;
      old_mean += delta / (k + 1);
      old_ss += delta * (x - old_mean);
    }
    ++k;
  }
  return start;
}

namespace {
// The rate of the recent mean claim size (about the last 20 claims), the
// claims before a loss is weighted by size (a few first sizes are no
// yardstick: one early miss weighted 8x wiped a heavy-tailed stall's claims
// out for good), and the most one claim's loss weighs against a claim of
// the mean size.
constexpr double kSizeRate = 0.05;
constexpr long kWeightAfterClaims = 20;
constexpr double kMaxLossWeight = 4.0;
}  // namespace

// Hits can narrow claims below the plain quantiles by at most
// kMaxNarrowing spreads, so that one good spell cannot bank unbounded credit
// for a later shift.
void MarginCalibrator::UpdateLoss(double loss, double size) {
  ++claims_;
  if (loss > 0) ++misses_;
  size = size > 0 && std::isfinite(size) ? size : 1.0;
  mean_size_ = mean_size_ > 0 ? mean_size_ + kSizeRate * (size - mean_size_) : size;
  const double weight =
      claims_ > kWeightAfterClaims ? std::min(size / mean_size_, kMaxLossWeight) : 1.0;
  margin_ =
      std::max(margin_ + gain_ * weight * (std::clamp(loss, 0.0, 1.0) - target()), -kMaxNarrowing);
}

void MarginCalibrator::Update(bool miss, bool far) {
  // Counted before the update: a far miss is judged against the target it
  // shows to be out of reach.
  if (miss && far) ++far_;
  UpdateLoss(miss ? 1.0 : 0.0);
}

double MarginCalibrator::target() const {
  if (stated_ <= target_ || far_ == 0) return target_;
  // A lower bound of their rate: a few chance ones relax nothing.
  const auto far = static_cast<double>(far_);
  const double far_rate = (far - std::sqrt(far)) / (static_cast<double>(claims_) + kFarPriorClaims);
  return target_ + (1 - target_ / stated_) * std::min(far_rate, kFarRelaxUpTo * stated_);
}

}  // namespace omni
