#include "eval.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace omni_train {
namespace {

constexpr int kBootstrapRounds = 1000;
constexpr int kTemperatures = 64;  // calibration sweep over [0.5, 2.5]

}  // namespace

EvalResult ScoreEval(const torch::Tensor& logits_in, const torch::Tensor& targets_in,
                     const Batch& batch, const DataConfig& data, uint64_t seed) {
  const torch::Tensor logits = logits_in.to(torch::kCPU, torch::kFloat).contiguous();
  const torch::Tensor targets = targets_in.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t b = logits.size(0), n = logits.size(1), v = logits.size(2);
  const float* lp = logits.data_ptr<float>();
  const int64_t* tp = targets.data_ptr<int64_t>();
  const int64_t offset = kTextLen - n;  // target j is caption token offset + j

  constexpr int kBins = 10;
  std::vector<double> bin_conf(kBins), bin_acc(kBins);
  std::vector<double> per_sample_clean(static_cast<size_t>(b));
  double nll = 0, correct = 0, clean = 0;
  for (int64_t i = 0; i < b; ++i) {
    const size_t si = static_cast<size_t>(i);
    const std::vector<int64_t> caption = CaptionOf(data, batch.labels[si], batch.quadrants[si]);
    double sample_clean = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float* row = lp + (i * n + j) * v;
      const int64_t target = tp[i * n + j];
      int64_t best = 0;
      for (int64_t k = 1; k < v; ++k) best = row[k] > row[best] ? k : best;
      double denom = 0;
      for (int64_t k = 0; k < v; ++k) denom += std::exp(static_cast<double>(row[k] - row[best]));
      const double log_z = static_cast<double>(row[best]) + std::log(denom);
      nll += log_z - static_cast<double>(row[target]);
      const bool hit = best == target;
      correct += hit ? 1 : 0;
      sample_clean += best == caption[static_cast<size_t>(offset + j)] ? 1 : 0;
      const double conf = 1.0 / denom;  // softmax probability of the argmax
      const int bin = std::min(kBins - 1, static_cast<int>(conf * kBins));
      bin_conf[static_cast<size_t>(bin)] += conf;
      bin_acc[static_cast<size_t>(bin)] += hit ? 1 : 0;
    }
    per_sample_clean[si] = sample_clean / static_cast<double>(n);
    clean += sample_clean;
  }
  const double total = static_cast<double>(b * n);
  EvalResult r;
  r.token_accuracy = correct / total;
  r.clean_accuracy = clean / total;
  r.perplexity = std::exp(nll / total);
  for (int k = 0; k < kBins; ++k) {
    const size_t sk = static_cast<size_t>(k);
    r.ece += std::abs(bin_conf[sk] - bin_acc[sk]) / total;
  }

  // Bootstrap over samples (deterministic: a fixed LCG seeded by the run seed).
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  std::vector<double> means(kBootstrapRounds);
  for (double& m : means) {
    double s = 0;
    for (int64_t i = 0; i < b; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      s += per_sample_clean[static_cast<size_t>((state >> 33) % static_cast<uint64_t>(b))];
    }
    m = s / static_cast<double>(b);
  }
  std::sort(means.begin(), means.end());
  r.ci_low = means[static_cast<size_t>(0.025 * kBootstrapRounds)];
  r.ci_high = means[static_cast<size_t>(0.975 * kBootstrapRounds) - 1];

  // Temperature scaling: the temperature minimizing the held-out NLL.
  double best_nll = nll / total;
  for (int k = 0; k < kTemperatures; ++k) {
    const double temp = 0.5 + 2.0 * k / (kTemperatures - 1);
    double t_nll = 0;
    for (int64_t row = 0; row < b * n; ++row) {
      const float* x = lp + row * v;
      const double mx = *std::max_element(x, x + v);
      double denom = 0;
      for (int64_t c = 0; c < v; ++c) denom += std::exp((static_cast<double>(x[c]) - mx) / temp);
      t_nll += (mx - static_cast<double>(x[tp[row]])) / temp + std::log(denom);
    }
    t_nll /= total;
    if (t_nll < best_nll) {
      best_nll = t_nll;
      r.temperature = temp;
    }
  }
  r.calibrated_perplexity = std::exp(best_nll);
  return r;
}

}  // namespace omni_train
