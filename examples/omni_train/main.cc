// omni_train: a small LibTorch trainer shaped like a real multimodal one,
// instrumented with Omni telemetry. See --help and data.h / model.h.
//
// Per step:  data_wait (pop a prepared batch from the loader thread)
//            compute   (forward + backward)
//            optimizer (AdamW step)
//            eval      (every --eval-every steps: nested compute for the
//                       forward pass over a held-out batch, then host-side
//                       scoring)
//            host      (loss.item(), logging)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "data.h"
#include "flags.h"
#include "model.h"
#include "omni/forecast.h"
#include "omni/hash.h"
#include "omni/phase.h"
#include "omni/sinks.h"
#include "omni/telemetry.h"
#include "omni/torch/params.h"

namespace omni_train {
namespace {

constexpr int kPrefetchBatches = 2;
constexpr int kEvalSamples = 256;  // held-out set: eval steps are long, as in real jobs
constexpr int kBootstrapRounds = 1000;
constexpr int kTemperatures = 64;  // calibration sweep over [0.5, 2.5]
constexpr int kProgressEvery = 50;

struct BatchTensors {
  torch::Tensor images;  // undefined when text-only
  torch::Tensor text;
};

BatchTensors ToTensors(Batch& b) {
  BatchTensors t;
  if (!b.images.empty()) {
    t.images = torch::from_blob(b.images.data(), {b.size, kChannels, kImageSize, kImageSize},
                                torch::kFloat)
                   .clone();
  }
  t.text = torch::from_blob(b.text.data(), {b.size, kTextLen}, torch::kLong).clone();
  return t;
}

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

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "omni_train: %s\n", status.ToString().c_str());
  return 1;
}

int Run(const TrainFlags& flags) {
  torch::set_num_threads(flags.threads);
  torch::manual_seed(flags.seed);

  // ---- telemetry
  omni::TelemetryOptions options;
  options.source = "omni_train";
  options.stats.window = flags.window;
  options.step_log_path = flags.log_path;
  options.trace_path = flags.trace_path;
  if (flags.eval_every > 0) {
    options.forecast.eval.every_steps = flags.eval_every;
    options.forecast.eval.offset = flags.eval_every - 1;
  }
  absl::StatusOr<std::unique_ptr<omni::Telemetry>> created = omni::Telemetry::Create(options);
  if (!created.ok()) return Fail(created.status());
  omni::Telemetry& tel = **created;
  if (!flags.forecast_path.empty()) {
    absl::StatusOr<std::unique_ptr<omni::ForecastSink>> sink =
        omni::MakeFileSink(flags.forecast_path);
    if (!sink.ok()) return Fail(sink.status());
    tel.AddSink(*std::move(sink));
  }

  // ---- model, optimizer, data
  ModelConfig model_config;
  model_config.vocab = kVocab;
  model_config.text_len = kTextLen;
  MultimodalLm model(model_config);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(flags.lr).weight_decay(0.01));

  DataConfig data;
  data.seed = flags.seed;
  data.batch = flags.batch;
  data.text_only = flags.text_only;
  data.stall_scale = flags.stall_scale;

  DataConfig eval_data = data;
  eval_data.batch = kEvalSamples;
  Batch eval_batch = MakeBatch(eval_data, kEvalStream, 0, /*decode=*/false);
  const BatchTensors eval_tensors = ToTensors(eval_batch);

  DataLoader loader(data, flags.steps, kPrefetchBatches);

  // ---- training loop
  const auto t0 = std::chrono::steady_clock::now();
  int64_t completed = 0;
  float last_loss = std::nanf("");
  float first_loss = std::nanf("");
  for (int64_t step = 0; step < flags.steps; ++step) {
    omni::StepScope step_scope(tel, step);

    BatchTensors batch;
    {
      omni::PhaseScope p(tel, omni::phase::kDataWait);
      absl::StatusOr<Batch> next = loader.Next();
      if (!next.ok()) return Fail(next.status());
      batch = ToTensors(*next);
    }

    torch::Tensor loss;
    {
      omni::PhaseScope p(tel, omni::phase::kCompute);
      optimizer.zero_grad();
      auto [logits, targets] = model->NextTokenLogits(batch.images, batch.text);
      loss = NextTokenLoss(logits, targets);
      loss.backward();
    }

    {
      omni::PhaseScope p(tel, omni::phase::kOptimizer);
      optimizer.step();
    }

    if (flags.eval_every > 0 && step % flags.eval_every == flags.eval_every - 1) {
      omni::PhaseScope eval_scope(tel, omni::phase::kEval);
      torch::Tensor logits, targets;
      {
        omni::PhaseScope p(tel, omni::phase::kCompute);
        torch::NoGradGuard no_grad;
        model->eval();
        std::tie(logits, targets) = model->NextTokenLogits(eval_tensors.images, eval_tensors.text);
        model->train();
      }
      const EvalResult r = ScoreEval(logits, targets, eval_batch, data, flags.seed);
      if (!flags.quiet) {
        std::printf("eval  step=%" PRId64
                    " token_acc=%.3f clean_acc=%.3f [%.3f, %.3f] ppl=%.3f ece=%.3f"
                    " temp=%.2f ppl@temp=%.3f\n",
                    step, r.token_accuracy, r.clean_accuracy, r.ci_low, r.ci_high, r.perplexity,
                    r.ece, r.temperature, r.calibrated_perplexity);
      }
    }

    {
      omni::PhaseScope p(tel, omni::phase::kHost);
      last_loss = loss.item<float>();
      if (step == 0) first_loss = last_loss;
      completed = step + 1;
      if (!flags.quiet && (step % kProgressEvery == 0 || step + 1 == flags.steps)) {
        std::printf("train step=%" PRId64 " loss=%.4f\n", step, static_cast<double>(last_loss));
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- report
  const absl::Status closed = tel.Close();
  if (!flags.quiet) {
    std::printf("\ntrained %" PRId64 " steps in %.2f s (%.2f ms/step), loss %.4f -> %.4f\n",
                completed, seconds,
                1e3 * seconds / static_cast<double>(std::max<int64_t>(completed, 1)),
                static_cast<double>(first_loss), static_cast<double>(last_loss));
    if (!flags.text_only) {
      std::printf("decode passes: %" PRId64 " total, %" PRId64 " max per sample (stall scale %g)\n",
                  loader.total_decode_passes(), loader.max_sample_decode_passes(),
                  flags.stall_scale);
    }
    std::printf("\n%s\n", tel.Snapshot().ToTable().c_str());
    absl::StatusOr<omni::Forecast> forecast = tel.LatestForecast();
    if (forecast.ok()) {
      std::printf("%s\n", omni::ForecastToTable(*forecast).c_str());
    } else {
      std::printf("no forecast: %s\n", forecast.status().ToString().c_str());
    }
    const omni::TelemetryCounters counters = tel.Counters();
    if (counters.misuse_errors > 0 || counters.steps_dropped > 0 || counters.steps_rejected > 0 ||
        counters.export_errors > 0) {
      std::printf("telemetry: %" PRId64 " misuse errors, %" PRId64 " steps dropped, %" PRId64
                  " rejected, %" PRId64 " export errors (last: %s)\n",
                  counters.misuse_errors, counters.steps_dropped, counters.steps_rejected,
                  counters.export_errors, counters.last_error.ToString().c_str());
    }
    if (!flags.log_path.empty()) std::printf("step log: %s\n", flags.log_path.c_str());
    if (!flags.trace_path.empty()) std::printf("trace:    %s\n", flags.trace_path.c_str());
    if (!flags.forecast_path.empty()) std::printf("forecast: %s\n", flags.forecast_path.c_str());
  }

  const absl::StatusOr<uint64_t> digest = omni::torch_ext::ParamsXxh3(*model);
  if (!digest.ok()) return Fail(digest.status());
  std::printf("final step=%" PRId64 " params_xxh3=%s loss=%.6f\n", completed,
              omni::HexDigest(*digest).c_str(), static_cast<double>(last_loss));
  std::fflush(stdout);
  if (!closed.ok()) return Fail(closed);
  return 0;
}

}  // namespace
}  // namespace omni_train

int main(int argc, char** argv) {
  absl::StatusOr<omni_train::TrainFlags> flags = omni_train::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "omni_train: %s\nRun 'omni_train --help' for usage.\n",
                 std::string(flags.status().message()).c_str());
    return 2;
  }
  if (flags->help) {
    std::fputs(omni_train::Usage().c_str(), stdout);
    return 0;
  }
  try {
    return omni_train::Run(*flags);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "omni_train: LibTorch error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "omni_train: error: %s\n", e.what());
  }
  return 1;
}
