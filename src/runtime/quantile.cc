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

// Hits can narrow claims below the plain quantiles by at most
// kMaxNarrowing spreads, so that one good spell cannot bank unbounded credit
// for a later shift.
void MarginCalibrator::UpdateLoss(double loss) {
  ++claims_;
  if (loss > 0) ++misses_;
  margin_ = std::max(margin_ + gain_ * (std::clamp(loss, 0.0, 1.0) - target_), -kMaxNarrowing);
}

}  // namespace omni
