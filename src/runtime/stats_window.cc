#include <algorithm>
#include <cmath>

#include "omni/stats.h"

namespace omni {

RollingWindow::RollingWindow(int capacity) : values_(static_cast<size_t>(std::max(capacity, 1))) {}

void RollingWindow::Add(double value) {
  const int cap = capacity();
  if (count_ == cap) {
    const double old = values_[static_cast<size_t>(next_)];
    sum_ -= old;
    sum_sq_ -= old * old;
  } else {
    ++count_;
  }
  values_[static_cast<size_t>(next_)] = value;
  sum_ += value;
  sum_sq_ += value * value;
  next_ = (next_ + 1) % cap;
  // Subtracting evicted values accumulates rounding error; recompute exactly
  // once per window turn (amortized O(1)).
  if (++adds_since_recompute_ >= cap) Recompute();
}

void RollingWindow::Recompute() {
  adds_since_recompute_ = 0;
  sum_ = 0;
  sum_sq_ = 0;
  for (int i = 0; i < count_; ++i) {
    const double v = values_[static_cast<size_t>(i)];
    sum_ += v;
    sum_sq_ += v * v;
  }
}

double RollingWindow::mean() const { return count_ == 0 ? 0.0 : sum_ / count_; }

double RollingWindow::stddev() const {
  if (count_ < 2) return 0.0;
  const double m = mean();
  const double var = sum_sq_ / count_ - m * m;
  return var > 0 ? std::sqrt(var) : 0.0;
}

double RollingWindow::RecentMean(int k) const {
  k = std::min(k, count_);
  if (k <= 0) return 0.0;
  const int cap = capacity();
  double sum = 0;
  for (int i = 1; i <= k; ++i) sum += values_[static_cast<size_t>((next_ - i + cap) % cap)];
  return sum / k;
}

std::vector<double> RollingWindow::Values() const {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(count_));
  const int cap = capacity();
  const int first = count_ == cap ? next_ : 0;
  for (int i = 0; i < count_; ++i) out.push_back(values_[static_cast<size_t>((first + i) % cap)]);
  return out;
}

namespace {
// Linear interpolation between closest ranks (numpy's default), q in [0, 1].
double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}
}  // namespace

Summary RollingWindow::Summarize() const {
  Summary s;
  s.count = count_;
  if (count_ == 0) return s;
  std::vector<double> v = Values();
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (const double x : v) sum += x;
  s.mean = sum / count_;
  double sq = 0;
  for (const double x : v) sq += (x - s.mean) * (x - s.mean);
  s.stddev = count_ > 1 ? std::sqrt(sq / count_) : 0.0;
  s.p50 = Quantile(v, 0.5);
  s.p95 = Quantile(v, 0.95);
  s.min = v.front();
  s.max = v.back();
  return s;
}

}  // namespace omni
