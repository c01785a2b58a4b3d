#include "rhythm.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "quantile.h"

namespace omni {

int ChoosePeriod(const std::vector<int64_t>& steps, const std::vector<double>& values,
                 int max_period, double penalty, int min_per_class, double search_penalty) {
  const size_t n = values.size();
  if (n < 2 * static_cast<size_t>(min_per_class)) return 1;
  std::vector<double> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  const double clip = std::min(0.02, 0.5 / std::max(max_period, 1));
  const double lo = QuantileSorted(sorted, clip), hi = QuantileSorted(sorted, 1 - clip);
  const double scale = std::max(std::abs(sorted.back()), std::abs(sorted.front())) + 1.0;
  const double floor = 1e-8 * scale * scale;
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::clamp(values[i], lo, hi);
  const int limit = std::min<int>(max_period, static_cast<int>(n) / min_per_class);
  std::vector<double> sum, sq;
  std::vector<int> cnt;
  const double ln_n = std::log(static_cast<double>(n));
  const double search_cost = search_penalty * std::log(static_cast<double>(std::max(limit, 1)));
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
                         penalty * classes * ln_n + (p > 1 ? search_cost : 0.0);
    if (p == 1 || score < best_score) {
      best = p;
      best_score = score;
    }
  }
  return best;
}

bool ClassesHoldOutOfSample(const std::vector<int64_t>& steps, const std::vector<double>& values,
                            int period, double z, double min_cv) {
  const auto p = static_cast<int64_t>(std::max(period, 1));
  const auto residue = [p](int64_t s) { return ((s % p) + p) % p; };
  for (size_t i = 0; i < values.size(); ++i) {
    // The other values of i's class, in log space (a length of 0 is none).
    double n = 0, sum = 0, sq = 0;
    for (size_t j = 0; j < values.size(); ++j) {
      if (j == i || residue(steps[j]) != residue(steps[i]) || !(values[j] > 0)) continue;
      const double x = std::log(values[j]);
      n += 1;
      sum += x;
      sq += x * x;
    }
    if (n == 0) continue;
    const double mean = sum / n;
    const double sd =
        std::max(n > 1 ? std::sqrt(std::max(sq - n * mean * mean, 0.0) / (n - 1)) : 0.0, min_cv);
    const double bound = std::exp(mean - SmallSampleFactor(z, n) * sd * std::sqrt(1 + 1 / n));
    if (values[i] < bound) return false;
  }
  return true;
}

namespace {

int64_t FloorDiv(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }  // b > 0

}  // namespace

bool SpacingRule::OccursAt(int64_t step) const {
  if (every <= 0 || step < 0) return false;
  if (den == 1) return step % every == offset;
  // Occurrence k covers the steps s with s·den ≤ k·every + offset < (s+1)·den.
  const int64_t x = step * den - offset;
  return CeilDiv(x, every) * every < x + den;
}

int64_t SpacingRule::NextAt(int64_t from) const {
  if (den == 1) return from + (((offset - from) % every) + every) % every;
  const int64_t k = CeilDiv(from * den - offset, every);
  return FloorDiv(k * every + offset, den);
}

int64_t SpacingRule::Index(int64_t step) const {
  if (den == 1) return FloorDiv(step, every);
  return FloorDiv(step * den - offset + den - 1, every);
}

SpacingRule LearnSpacing(const std::vector<int64_t>& occ) {
  const size_t n = occ.size();
  if (n < 3) return {};
  const int64_t d1 = occ[n - 2] - occ[n - 3], d2 = occ[n - 1] - occ[n - 2];
  if (d1 != d2 || d1 < 2) return {};
  return SpacingRule{d1, occ[n - 1] % d1};
}

SpacingRule SpacingAcrossGaps(const std::vector<int64_t>& occ) {
  const size_t n = occ.size();
  if (n < 3) return {};
  const int64_t d1 = occ[n - 2] - occ[n - 3], d2 = occ[n - 1] - occ[n - 2];
  if (d1 == d2 || d1 <= 0 || d2 <= 0) return {};
  const int64_t d = std::gcd(d1, d2);
  if (d < kMinSpacingFromTwo || d1 / d > kMaxGapMultiple || d2 / d > kMaxGapMultiple) return {};
  return SpacingRule{d, occ[n - 1] % d};
}

SpacingRule SpacingFromTwo(const std::vector<int64_t>& occ, int64_t first_step) {
  if (occ.size() != 2) return {};
  const int64_t d = occ[1] - occ[0];
  if (d < kMinSpacingFromTwo || occ[0] - d >= first_step) return {};
  return SpacingRule{d, occ[1] % d};
}

namespace {

// FractionalSpacing's fit over occ[first, end), whose gaps are g or g + 1.
SpacingRule FitFraction(const std::vector<int64_t>& occ, size_t first, size_t end, int64_t g) {
  bool short_gap = false, long_gap = false;
  for (size_t i = first + 1; i < end; ++i) (occ[i] - occ[i - 1] == g ? short_gap : long_gap) = true;
  if (end - first < kMinFractionalGaps + 1 || !short_gap || !long_gap) return {};
  // The least den that explains the gaps (the simplest fraction: a spacing
  // of samples over a batch size reduces to a small one more often than
  // not; a wrong guess costs one false claim, then the rule ends at the step
  // it named and is learned again from more occurrences).
  for (int64_t den = 2; den <= kMaxSpacingDen; ++den) {
    SpacingRule found;
    std::array<int64_t, kFractionalAgreement> agreed{};
    for (int64_t every = g * den + 1; every < (g + 1) * den; ++every) {
      if (std::gcd(every, den) != 1) continue;  // a smaller den has it
      // Occurrence i (from `first`) at floor((i·every + phi) / den): phi in
      // [max r_i, min r_i + den) with r_i = occ·den − i·every.
      int64_t lo = std::numeric_limits<int64_t>::min();
      int64_t hi = std::numeric_limits<int64_t>::max();
      for (size_t i = first; i < end; ++i) {
        const int64_t r = occ[i] * den - static_cast<int64_t>(i - first) * every;
        lo = std::max(lo, r);
        hi = std::min(hi, r + den);
      }
      if (lo >= hi) continue;
      // Every phi in [lo, hi), with every numerator of this den that fits,
      // must put the next occurrences at the same steps.
      for (const int64_t phi : {lo, hi - 1}) {
        std::array<int64_t, kFractionalAgreement> next{};
        for (size_t j = 0; j < next.size(); ++j) {
          next[j] = FloorDiv(static_cast<int64_t>(end - first + j) * every + phi, den);
        }
        if (found.every == 0) {
          agreed = next;
          found = SpacingRule{every, ((phi % every) + every) % every, den};
        } else if (next != agreed) {
          return {};
        }
      }
    }
    // Two whole cycles of its pattern of gaps, at least: a fraction of den
    // 4 from four gaps is as often a wall-time checkpoint's jitter (gaps
    // 85, 85, 85, 84 steps) as a rule.
    if (found.every > 0) {
      return end - first - 1 >= static_cast<size_t>(2 * den) ? found : SpacingRule{};
    }
  }
  return {};
}

}  // namespace

SpacingRule FractionalSpacing(const std::vector<int64_t>& occ) {
  const size_t n = occ.size();
  if (n < 3) return {};
  const int64_t g = std::min(occ[n - 1] - occ[n - 2], occ[n - 2] - occ[n - 3]);
  if (g < kMinSpacingFromTwo) return {};
  size_t first = n - 1;  // the run of gaps in {g, g + 1} at the end
  while (first > 0 && occ[first] - occ[first - 1] >= g && occ[first] - occ[first - 1] <= g + 1) {
    --first;
  }
  // Out of sample: the rule of the occurrences before the last must have
  // put the last one where it came. Steps whose spacing only looks
  // fractional (a checkpoint every 20 s of wall time: gaps 85, 85, 85, 84,
  // 85, 86 steps) rarely pass. The longest run that fits, from its first
  // occurrence on or later (a first stall at step 0, then one every 62.5
  // steps from 62: the run from 62 fits, the one from 0 does not).
  for (; first + kMinFractionalGaps + 2 <= n; ++first) {
    const SpacingRule before = FitFraction(occ, first, n - 1, g);
    if (before.every > 0 && before.NextAt(occ[n - 2] + 1) == occ[n - 1]) {
      return FitFraction(occ, first, n, g);
    }
  }
  return {};
}

namespace {

// The median of x[from, to) (to − from ≤ 16).
double WindowMedian(const std::vector<double>& x, size_t from, size_t to) {
  std::array<double, 16> buf{};
  const size_t n = to - from;
  std::copy(x.begin() + static_cast<std::ptrdiff_t>(from),
            x.begin() + static_cast<std::ptrdiff_t>(to), buf.begin());
  std::sort(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n));
  return n % 2 == 1 ? buf[n / 2] : 0.5 * (buf[n / 2 - 1] + buf[n / 2]);
}

double Width(std::vector<double>& v, double lo, double hi) {
  std::sort(v.begin(), v.end());
  return QuantileSorted(v, hi) - QuantileSorted(v, lo);
}

}  // namespace

void LevelResiduals(const std::vector<double>& x, int k, std::vector<double>& out) {
  out.clear();
  const auto ku = static_cast<size_t>(k);
  for (size_t i = ku; i < x.size(); ++i) out.push_back(x[i] - WindowMedian(x, i - ku, i));
}

double RecentLevel(const std::vector<double>& x, int k) { return LevelBefore(x, x.size(), k); }

double LevelBefore(const std::vector<double>& x, size_t end, int k) {
  return WindowMedian(x, end - static_cast<size_t>(k), end);
}

int ChooseLevelWindow(const std::vector<std::vector<double>>& classes, double lo, double hi,
                      size_t min_n) {
  std::vector<double> dev, r, one;
  for (const std::vector<double>& c : classes) {
    if (c.empty()) continue;
    std::vector<double> sorted = c;
    const double median = QuantileInPlace(sorted, 0.5);
    for (const double x : c) dev.push_back(x - median);
  }
  if (dev.size() < min_n) return 0;
  double best = kLevelGain * Width(dev, lo, hi);
  int best_k = 0;
  for (const int k : kLevelWindows) {
    r.clear();
    for (const std::vector<double>& c : classes) {
      LevelResiduals(c, k, one);
      r.insert(r.end(), one.begin(), one.end());
    }
    if (r.size() < min_n) break;
    const double width = Width(r, lo, hi);
    if (width < best) {
      best = width;
      best_k = k;
    }
  }
  return best_k;
}

}  // namespace omni
