// Cost of one forecaster update (Forecaster::Observe of a step, then Predict over
// the default 5-minute horizon), on the shipped pipeline+checkpoint trace and
// on a synthetic fast job (10 ms steps: 30000 steps in the horizon, a
// declared 2 s eval every 500); and the
// heap Evaluate holds at its peak beyond the log it scores, per step of a
// long log (evaluate_peak_bytes_per_step: the log's records themselves are
// about 1.6 KB a step); Evaluate's time on the pipeline trace and on a
// recorded job with evals and checkpoints (lm_microbatch); and what the
// telemetry worker spends on the forecaster for each step it drains
// (worker_step_us: Observe, then the next step's bound, on the pipeline trace
// and the fast job).
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "omni/evaluator.h"

namespace {

// The bytes allocated by operator new and not yet freed, and their peak.
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_peak_bytes{0};

void CountAllocated(void* p) {
  const auto n = static_cast<int64_t>(malloc_usable_size(p));
  const int64_t live = g_live_bytes.fetch_add(n, std::memory_order_relaxed) + n;
  int64_t peak = g_peak_bytes.load(std::memory_order_relaxed);
  while (live > peak && !g_peak_bytes.compare_exchange_weak(peak, live)) {
  }
}

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = std::malloc(n == 0 ? 1 : n)) {  // NOLINT(cppcoreguidelines-no-malloc)
    CountAllocated(p);
    return p;
  }
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  if (p != nullptr) {
    g_live_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
  }
  std::free(p);  // NOLINT(cppcoreguidelines-no-malloc)
}
void operator delete(void* p, std::size_t /*n*/) noexcept { operator delete(p); }

namespace {

double NowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Cost {
  double add_us = 0, predict_us = 0, windows = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// What the telemetry worker spends on the forecaster for each step it
// drains: Observe, then the next step's bound (its pacing), without the
// forecasts it publishes at most every publish interval.
double WorkerStepUs(const omni::StepLog& log, const omni::ForecastOptions& fo) {
  auto fc = omni::Forecaster::Create(fo);
  std::vector<double> us;
  for (const omni::StepRecord& rec : log.steps) {
    const double t0 = NowUs();
    if (!fc->Observe(rec, log.header.phases).ok()) continue;
    if (!fc->NextStepBounds(1).ok()) continue;
    us.push_back(NowUs() - t0);
  }
  return Median(us);
}

Cost Measure(const omni::StepLog& log, const omni::ForecastOptions& fo) {
  auto fc = omni::Forecaster::Create(fo);
  std::vector<double> add, pred;
  double windows = 0;
  int n = 0;
  for (const omni::StepRecord& rec : log.steps) {
    double t0 = NowUs();
    if (!fc->Observe(rec, log.header.phases).ok()) continue;
    add.push_back(NowUs() - t0);
    t0 = NowUs();
    auto f = fc->Predict(rec.end_ns);
    if (!f.ok()) continue;
    pred.push_back(NowUs() - t0);
    windows += static_cast<double>(f->windows.size());
    ++n;
  }
  return Cost{Median(add), Median(pred), n ? windows / n : 0};
}

omni::StepLog Synthetic(int steps) {
  omni::StepLog log;
  log.header.eval = omni::PeriodicEvent{500, 499, 2'000'000'000};
  int64_t t = 0;
  for (int s = 0; s < steps; ++s) {
    omni::StepRecord r;
    r.step = s;
    r.start_ns = t;
    const int64_t dw = 1'000'000 + (s % 7) * 300'000;
    const auto span = [&](omni::PhaseId p, int64_t a, int64_t b) {
      r.spans[r.num_spans++] = omni::PhaseSpan{a, b, p, 0};
    };
    span(omni::phase::kDataWait, t, t + dw);
    span(omni::phase::kCompute, t + dw, t + dw + 7'000'000);
    span(omni::phase::kOptimizer, t + dw + 7'000'000, t + dw + 8'000'000);
    r.end_ns = t + dw + 8'000'000;
    if (log.header.eval.OccursAt(s)) {
      // The declared eval does come (a declaration the steps contradict
      // twice in a row is set aside, and with it the event in the horizon).
      span(omni::phase::kEval, r.end_ns, r.end_ns + log.header.eval.expected_ns);
      r.end_ns += log.header.eval.expected_ns;
    }
    t = r.end_ns;
    log.steps.push_back(r);
  }
  return log;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string path =
      argc > 1 ? argv[1] : std::string(OMNI_SOURCE_DIR "/tests/data/pipeline_ckpt.jsonl");
  auto log = omni::ReadStepLog(path);
  if (!log.ok()) {
    std::fprintf(stderr, "%s\n", std::string(log.status().message()).c_str());
    return 1;
  }
  omni::ForecastOptions fo;
  fo.checkpoint = log->header.checkpoint;
  fo.pipeline = log->header.pipeline;
  const Cost pipe = Measure(*log, fo);
  const double worker_us = WorkerStepUs(*log, fo);
  omni::StepLog fast = Synthetic(2000);
  omni::ForecastOptions fo2;
  fo2.eval = fast.header.eval;
  const Cost quick = Measure(fast, fo2);
  const double worker_us_10ms = WorkerStepUs(fast, fo2);
  // The same job over other horizons: Predict jumps from event to event
  // once the normal steps give no window, so its cost should not grow with
  // the horizon (30 s: 3,000 steps; 60 min: 360,000).
  fo2.horizon_ns = 30'000'000'000;
  const Cost quick_30s = Measure(fast, fo2);
  fo2.horizon_ns = 3'600'000'000'000;
  const Cost quick_60min = Measure(fast, fo2);
  const double t0 = NowUs();
  omni::EvaluateOptions eo;
  auto rep = omni::Evaluate(*log, eo);
  const double eval_ms = (NowUs() - t0) / 1e3;
  // A recorded job with evals and checkpoints (the LM trainer: undeclared
  // evals every 60 steps, saves every 200), whose events' models weigh more.
  auto lm = omni::ReadStepLog(OMNI_SOURCE_DIR "/tests/data/lm_microbatch.jsonl");
  const double t1 = NowUs();
  const bool lm_ok = lm.ok() && omni::Evaluate(*lm, eo).ok();
  const double eval_lm_ms = (NowUs() - t1) / 1e3;
  // Evaluate's own heap on a long log (the 10 ms job, 20,000 steps).
  const omni::StepLog long_log = Synthetic(20000);
  const int64_t before = g_live_bytes.load();
  g_peak_bytes.store(before);
  const bool long_ok = omni::Evaluate(long_log, eo).ok();
  const double eval_bytes_per_step = static_cast<double>(g_peak_bytes.load() - before) /
                                     static_cast<double>(long_log.steps.size());
  std::printf("pipeline trace (%zu steps): add %.2f us, predict %.2f us, %.1f windows/forecast\n",
              log->steps.size(), pipe.add_us, pipe.predict_us, pipe.windows);
  std::printf("pipeline trace, the worker's forecaster per step (observe, next bound): %.2f us\n",
              worker_us);
  std::printf("10 ms steps: add %.2f us, predict %.2f us, %.1f windows/forecast, worker %.2f us\n",
              quick.add_us, quick.predict_us, quick.windows, worker_us_10ms);
  std::printf("10 ms steps, predict by horizon: 30 s %.2f us, 5 min %.2f us, 60 min %.2f us\n",
              quick_30s.predict_us, quick.predict_us, quick_60min.predict_us);
  std::printf("evaluate pipeline trace (every step): %.1f ms\n", eval_ms);
  std::printf("evaluate lm_microbatch (every step): %.1f ms\n", eval_lm_ms);
  std::printf("evaluate %zu steps of 10 ms: peak heap %.0f bytes a step beyond the log's %zu\n",
              long_log.steps.size(), eval_bytes_per_step, sizeof(omni::StepRecord));
  std::printf(
      "{\"benchmark\":\"forecast_cost\",\"forecast_update_us\":%.2f,\"stats_add_us\":%.2f,"
      "\"forecast_update_us_10ms_steps\":%.2f,\"predict_us_10ms_steps_30s\":%.2f,"
      "\"predict_us_10ms_steps_5min\":%.2f,\"predict_us_10ms_steps_60min\":%.2f,"
      "\"windows_per_forecast\":%.1f,\"evaluate_trace_ms\":%.1f,\"evaluate_lm_trace_ms\":%.1f,"
      "\"evaluate_peak_bytes_per_step\":%.0f,\"worker_step_us\":%.2f,\"worker_step_us_10ms_steps\":"
      "%.2f}\n",
      pipe.predict_us + pipe.add_us, pipe.add_us, quick.predict_us + quick.add_us,
      quick_30s.predict_us, quick.predict_us, quick_60min.predict_us, pipe.windows,
      rep.ok() ? eval_ms : -1.0, lm_ok ? eval_lm_ms : -1.0, long_ok ? eval_bytes_per_step : -1.0,
      worker_us, worker_us_10ms);
  return rep.ok() && lm_ok && long_ok ? 0 : 1;
}
