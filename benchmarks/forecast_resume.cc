// A resumed run's forecasts (TelemetryOptions::learn_previous_steps) on the
// trace corpus: each trace is cut so that its last 300 steps (half of a
// shorter one) are a resumed run, and that run is scored on its own, as a
// forecaster starting from nothing would forecast it, and after the earlier
// steps were learned (EvaluateOptions::previous, the live telemetry's
// replay). Beside the scores, what the replay costs the telemetry worker
// once at a resume: reading a log's tail (ReadStepLogTail) and learning
// 1,024 steps.
// Prints a table, then one JSON line ("forecast_resume").
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "omni/evaluator.h"
#include "omni/forecast.h"
#include "omni/step_log.h"

namespace {

constexpr size_t kResumedSteps = 300;
constexpr int kLearnSteps = 1024;

double Median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

struct Side {
  std::vector<double> recall, bounded;
  int precision_below = 0, coverage_below = 0;
  void Add(const omni::EvaluationReport& r, size_t steps) {
    const double p = r.total.precision();
    if (!std::isnan(r.total.recall())) recall.push_back(r.total.recall());
    if (!std::isnan(p) && p < r.claimed_confidence) ++precision_below;
    if (r.next_step.coverage() < r.claimed_confidence) ++coverage_below;
    bounded.push_back(static_cast<double>(r.next_step.steps) / static_cast<double>(steps));
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::string(OMNI_SOURCE_DIR "/tests/data");
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".jsonl") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  Side cold, warm;
  int up = 0, down = 0;
  std::vector<double> read_ms, learn_ms;
  std::printf("%-26s %13s %13s %13s\n", "trace", "recall", "coverage", "bounded");
  std::printf("%-26s %6s %6s %6s %6s %6s %6s\n", "", "cold", "warm", "cold", "warm", "cold",
              "warm");
  for (const std::string& path : files) {
    auto log = omni::ReadStepLog(path);
    if (!log.ok()) {
      std::fprintf(stderr, "%s\n", std::string(log.status().message()).c_str());
      return 1;
    }
    const size_t n = log->steps.size();
    if (n < 100) continue;
    const size_t k = n - std::min(kResumedSteps, n / 2);
    omni::StepLog previous{log->header, {log->steps.begin(), log->steps.begin() + k}, 0};
    omni::StepLog resumed{log->header, {log->steps.begin() + k, log->steps.end()}, 0};
    omni::EvaluateOptions o;
    auto c = omni::Evaluate(resumed, o);
    o.previous = &previous;
    auto w = omni::Evaluate(resumed, o);
    if (!c.ok() || !w.ok()) {
      std::fprintf(stderr, "%s: %s\n", path.c_str(),
                   std::string((c.ok() ? w.status() : c.status()).message()).c_str());
      return 1;
    }
    cold.Add(*c, n - k);
    warm.Add(*w, n - k);
    const double rc = c->total.recall(), rw = w->total.recall();
    up += rw > rc + 0.005 ? 1 : 0;
    down += rw < rc - 0.005 ? 1 : 0;
    // The worker's cost at a resume: the tail of the whole log, and its
    // steps learned by a fresh forecaster.
    const auto t0 = std::chrono::steady_clock::now();
    auto tail = omni::ReadStepLogTail(path, kLearnSteps);
    const auto t1 = std::chrono::steady_clock::now();
    omni::ForecastOptions fo;
    fo.checkpoint = log->header.checkpoint;
    fo.eval = log->header.eval;
    fo.pipeline = log->header.pipeline;
    auto f = omni::Forecaster::Create(fo);
    if (!tail.ok() || !f.ok()) return 1;
    for (const omni::StepRecord& rec : tail->steps)
      f->Observe(rec, tail->header.phases).IgnoreError();
    const auto t2 = std::chrono::steady_clock::now();
    read_ms.push_back(Ms(t1 - t0));
    learn_ms.push_back(Ms(t2 - t1) * kLearnSteps / static_cast<double>(tail->steps.size()));
    std::printf("%-26s %6.3f %6.3f %6.3f %6.3f %6.3f %6.3f\n",
                std::filesystem::path(path).stem().c_str(), rc, rw, c->next_step.coverage(),
                w->next_step.coverage(), cold.bounded.back(), warm.bounded.back());
  }
  std::printf(
      "{\"benchmark\":\"forecast_resume\",\"traces\":%zu,\"resumed_steps\":%zu,"
      "\"recall_median_cold\":%.4f,\"recall_median_warm\":%.4f,\"recall_up\":%d,"
      "\"recall_down\":%d,\"bounded_share_median_cold\":%.4f,\"bounded_share_median_warm\":%.4f,"
      "\"precision_below_claim_cold\":%d,\"precision_below_claim_warm\":%d,"
      "\"coverage_below_claim_cold\":%d,\"coverage_below_claim_warm\":%d,"
      "\"read_tail_ms_median\":%.2f,\"learn_1024_steps_ms_median\":%.1f,"
      "\"learn_1024_steps_ms_max\":%.1f}\n",
      cold.recall.size(), kResumedSteps, Median(cold.recall), Median(warm.recall), up, down,
      Median(cold.bounded), Median(warm.bounded), cold.precision_below, warm.precision_below,
      cold.coverage_below, warm.coverage_below, Median(read_ms), Median(learn_ms),
      learn_ms.empty() ? 0.0 : *std::max_element(learn_ms.begin(), learn_ms.end()));
  return 0;
}
