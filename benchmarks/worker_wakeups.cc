// How often the telemetry worker wakes while a job trains, side by side:
// paced (no sink attached: it sleeps through a step, src/runtime/
// worker_pacing.h) against polling every worker_poll (2 ms; the same
// Telemetry with a no-op sink attached, which keeps the worker polling).
//
// Each run trains the same schedule on the real clock: 10 ms steps (a data
// wait, then compute) and every 10th step an eval of 100 ms, 150 steps
// (about 2.8 s). Figures per step: worker_wakeups_per_step_paced,
// worker_wakeups_per_step_polling and their ratio. Also how long after the
// end of a step the worker has taken it from the ring (its statistics count
// it): processed_lag_ms_paced / _polling, the median over every 10th step
// (polled every 0.2 ms; goal: within a poll, a few ms).
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "omni/sinks.h"
#include "omni/telemetry.h"

namespace {

constexpr int kSteps = 150;
constexpr int kEvalEvery = 10;

class NoopSink final : public omni::ForecastSink {
 public:
  absl::Status Publish(const omni::Forecast&) override { return absl::OkStatus(); }
  std::string Describe() const override { return "noop"; }
};

struct Run {
  double wakeups_per_step = 0;
  double lag_ms_median = 0;
};

Run TrainOnce(bool polling) {
  omni::TelemetryOptions o;
  o.forecast.eval.every_steps = kEvalEvery;
  o.forecast.eval.offset = kEvalEvery - 1;
  auto tel = omni::Telemetry::Create(o).value();
  if (polling) tel->AddSink(std::make_unique<NoopSink>());
  const int64_t before = tel->Counters().worker_wakeups;
  std::vector<double> lags;
  for (int s = 0; s < kSteps; ++s) {
    (void)tel->BeginStep();
    {
      omni::PhaseScope p(*tel, omni::phase::kDataWait);
      absl::SleepFor(absl::Milliseconds(2));
    }
    {
      omni::PhaseScope p(*tel, omni::phase::kCompute);
      absl::SleepFor(absl::Milliseconds(8));
    }
    if (s % kEvalEvery == kEvalEvery - 1) {
      omni::PhaseScope p(*tel, omni::phase::kEval);
      absl::SleepFor(absl::Milliseconds(100));
    }
    (void)tel->EndStep();
    if (s % 10 == 5) {
      // How long until the worker has taken this step from the ring.
      const absl::Time end = absl::Now();
      const int64_t want = s + 1;
      while (tel->Snapshot().steps_seen < want && absl::Now() - end < absl::Milliseconds(200)) {
        absl::SleepFor(absl::Microseconds(200));
      }
      lags.push_back(absl::ToDoubleMilliseconds(absl::Now() - end));
    }
  }
  Run r;
  r.wakeups_per_step = static_cast<double>(tel->Counters().worker_wakeups - before) / kSteps;
  std::sort(lags.begin(), lags.end());
  r.lag_ms_median = lags.empty() ? 0 : lags[lags.size() / 2];
  return r;
}

}  // namespace

int main() {
  const Run paced = TrainOnce(false);
  const Run polling = TrainOnce(true);
  std::printf("worker wake-ups per step: paced %.2f, polling every 2 ms %.2f\n",
              paced.wakeups_per_step, polling.wakeups_per_step);
  std::printf("worker done with a step after its end (median): paced %.2f ms, polling %.2f ms\n",
              paced.lag_ms_median, polling.lag_ms_median);
  std::printf(
      "{\"benchmark\":\"worker_wakeups\",\"steps\":%d,\"worker_wakeups_per_step_paced\":%.2f,"
      "\"worker_wakeups_per_step_polling\":%.2f,\"ratio\":%.3f,\"processed_lag_ms_paced\":%.2f,"
      "\"processed_lag_ms_polling\":%.2f}\n",
      kSteps, paced.wakeups_per_step, polling.wakeups_per_step,
      polling.wakeups_per_step > 0 ? paced.wakeups_per_step / polling.wakeups_per_step : 0.0,
      paced.lag_ms_median, polling.lag_ms_median);
  return 0;
}
