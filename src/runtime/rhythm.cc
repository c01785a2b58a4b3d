#include "rhythm.h"

#include <algorithm>
#include <cmath>

#include "quantile.h"

namespace omni {

int ChoosePeriod(const std::vector<int64_t>& steps, const std::vector<double>& values,
                 int max_period, double penalty) {
  const size_t n = values.size();
  if (n < 6) return 1;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const double lo = QuantileSorted(sorted, 0.02), hi = QuantileSorted(sorted, 0.98);
  const double scale = std::max(std::abs(sorted.back()), std::abs(sorted.front())) + 1.0;
  const double floor = 1e-8 * scale * scale;
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::clamp(values[i], lo, hi);
  const int limit = std::min<int>(max_period, static_cast<int>(n / 3));
  std::vector<double> sum, sq;
  std::vector<int> cnt;
  const double ln_n = std::log(static_cast<double>(n));
  int best = 1;
  double best_score = 0;
  for (int p = 1; p <= limit; ++p) {
    sum.assign(p, 0);
    sq.assign(p, 0);
    cnt.assign(p, 0);
    for (size_t i = 0; i < n; ++i) {
      const auto c = static_cast<size_t>(((steps[i] % p) + p) % p);
      sum[c] += v[i];
      sq[c] += v[i] * v[i];
      ++cnt[c];
    }
    double sse = 0;
    int classes = 0;
    for (int c = 0; c < p; ++c) {
      if (cnt[c] == 0) continue;
      ++classes;
      sse += std::max(sq[c] - sum[c] * sum[c] / cnt[c], 0.0);
    }
    const double score = static_cast<double>(n) * std::log(sse / static_cast<double>(n) + floor) +
                         penalty * classes * ln_n;
    if (p == 1 || score < best_score) {
      best = p;
      best_score = score;
    }
  }
  return best;
}

SpacingRule LearnSpacing(const std::vector<int64_t>& occ) {
  const size_t n = occ.size();
  if (n < 3) return {};
  const int64_t d1 = occ[n - 2] - occ[n - 3], d2 = occ[n - 1] - occ[n - 2];
  if (d1 != d2 || d1 < 2) return {};
  return SpacingRule{d1, occ[n - 1] % d1};
}

SpacingRule SpacingFromTwo(const std::vector<int64_t>& occ, int64_t first_step) {
  if (occ.size() != 2) return {};
  const int64_t d = occ[1] - occ[0];
  if (d < kMinSpacingFromTwo || occ[0] - d >= first_step) return {};
  return SpacingRule{d, occ[1] % d};
}

}  // namespace omni
