// Demo-only eval scoring of omni_train (not part of how a trainer uses
// Omni): token accuracy, perplexity, calibration error, a bootstrap interval
// and a temperature sweep, on the host, in double precision.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "data.h"

namespace omni_train {

struct EvalResult {
  double token_accuracy = 0;       // argmax == (noisy) target
  double clean_accuracy = 0;       // argmax == noise-free caption token
  double perplexity = 0;           // exp(mean NLL) against the targets
  double ece = 0;                  // expected calibration error, 10 bins
  double ci_low = 0, ci_high = 0;  // bootstrap 95% interval of clean accuracy
  double temperature = 1;          // calibration temperature minimizing the NLL
  double calibrated_perplexity = 0;
};

// Host-side scoring of eval logits [B, n, V] (CPU, double precision).
EvalResult ScoreEval(const torch::Tensor& logits_in, const torch::Tensor& targets_in,
                     const Batch& batch, const DataConfig& data, uint64_t seed);

}  // namespace omni_train
