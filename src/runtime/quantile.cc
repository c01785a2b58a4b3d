#include "quantile.h"

#include <algorithm>
#include <cmath>

namespace omni {

double QuantileSorted(const std::vector<double>& v, double level) {
  const double pos = std::clamp(level, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const auto i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= v.size()) return v.back();
  const double f = pos - static_cast<double>(i);
  return v[i] + f * (v[i + 1] - v[i]);
}

double QuantileInPlace(std::vector<double>& v, double level) {
  std::sort(v.begin(), v.end());
  return QuantileSorted(v, level);
}

// By bisection of erf(z/√2) = c.
double TwoSidedZ(double c) {
  double lo = 0, hi = 10;
  for (int i = 0; i < 60; ++i) {
    const double mid = (lo + hi) / 2;
    (std::erf(mid / std::sqrt(2.0)) < c ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
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

// Hits can narrow claims below the plain quantiles by at most
// kMaxNarrowing spreads, so that one good spell cannot bank unbounded credit
// for a later shift.
void MarginCalibrator::UpdateLoss(double loss) {
  ++claims_;
  if (loss > 0) ++misses_;
  margin_ = std::max(margin_ + gain_ * (std::clamp(loss, 0.0, 1.0) - target_), -kMaxNarrowing);
}

}  // namespace omni
