// Idle-window forecasts: when will the devices be idle, and with what confidence.
//
// The forecaster turns the rolling statistics (StepStats) and declared
// periodic events (checkpoint every N steps, eval every M steps, a pipeline
// schedule) into a list of idle windows over a horizon. Each future segment's
// start and end are uncertain; the uncertainty accumulates step after step as
// independent normal errors (variance of a step = σ²). A window is published
// as [latest plausible start, earliest plausible end] with
//   start = μ_start + k·σ_start,  end = μ_end − k·σ_end,
// i.e. busy steps are predicted as μ + k·σ before an idle window and idle
// phases as μ − k·σ, so the window is idle with probability at least
// 1 − 2·(1 − Φ(k)) (the reported confidence; 0.954 for k = 2). Windows shorter
// than min_window are not published. The step level follows drift (see
// level_window); its uncertainty grows linearly with the lead time.
//
// Thread safety: Forecaster is immutable after Create and may be shared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/phase.h"
#include "omni/stats.h"

namespace omni {

// An event that happens in every step s with s % every_steps == offset
// (disabled when every_steps == 0). Until its phase has been measured, its
// duration is taken as expected_ns (and it is not forecast when that is 0).
struct PeriodicEvent {
  int64_t every_steps = 0;
  int64_t offset = 0;
  int64_t expected_ns = 0;
  bool OccursAt(int64_t step) const {
    return every_steps > 0 && step >= 0 && step % every_steps == offset;
  }
};

// GPipe-style schedule of one pipeline stage: `micro_batches` forward passes,
// then as many backward passes taking `backward_over_forward` times as long.
// The compute phase of a step spans (m + p − 1)·(t_f + t_b); stage r idles r·t_f
// before its first forward, (p−1−r)·(t_f + t_b) between its last forward and
// its first backward, and r·t_b after its last backward: a bubble fraction of
// (p − 1)/(m + p − 1) on every stage. Disabled when stages == 1.
struct PipelineSchedule {
  int stages = 1;
  int micro_batches = 1;
  int stage = 0;
  double backward_over_forward = 2.0;
};

// (p − 1)/(m + p − 1). REQUIRES: p ≥ 1, m ≥ 1.
OMNI_EXPORT double PipelineBubbleFraction(int stages, int micro_batches);

struct ForecastOptions {
  int64_t horizon_ns = 300'000'000'000;  // 5 minutes
  double k = 2.0;
  int64_t min_window_ns = 1'000'000;  // 1 ms
  int max_windows = 4096;
  // The level of each step kind's duration is the mean of its newest
  // `level_window` steps, so forecasts follow a drifting step time. The
  // level's own uncertainty (its standard error, plus its distance from the
  // whole window's mean as a measure of drift) adds up linearly over future
  // steps, on top of the random √n spread.
  int level_window = 50;
  PeriodicEvent checkpoint;  // steps that contain the checkpoint phase
  PeriodicEvent eval;        // steps that contain the eval phase
  PipelineSchedule pipeline;
};

// InvalidArgument naming the field: non-positive horizon, negative or
// non-finite k, negative min_window, negative every/offset/expected, offset ≥
// every, pipeline stages < 1, micro_batches < 1, stage outside [0, stages),
// non-finite or negative backward_over_forward.
OMNI_EXPORT absl::Status ValidateForecastOptions(const ForecastOptions& options);

struct IdleWindow {
  int64_t start_ns = 0;  // clock nanoseconds (same clock as the steps)
  int64_t duration_ns = 0;
  IdleKind kind = IdleKind::kHostSide;
  double confidence = 0;  // lower bound on P(the whole window is idle)
  int64_t step = 0;       // the step the window falls in
};

struct OMNI_EXPORT Forecast {
  static constexpr int kSchemaVersion = 1;
  int64_t made_at_ns = 0;
  int64_t horizon_ns = 0;
  int64_t last_step = -1;      // last completed step the forecast is based on
  int64_t steps_observed = 0;  // post-warm-up steps in the statistics
  double k = 0;
  // "When must I be gone?": the earliest plausible time (μ − k·σ) after
  // made_at at which the devices are needed again.
  int64_t devices_needed_at_ns = 0;
  std::vector<IdleWindow> windows;  // in time order, non-overlapping

  int64_t total_idle_ns() const;
  // The window containing t, or nullptr.
  const IdleWindow* WindowAt(int64_t t_ns) const;
};

// What a co-located (guest) job needs to finish: one more step, then a save.
struct GuestCost {
  double step_mean_ns = 0, step_stddev_ns = 0;
  double save_mean_ns = 0, save_stddev_ns = 0;
};

struct FitCheck {
  bool fits = false;
  int64_t needed_ns = 0;     // μ_step + μ_save + k·sqrt(σ_step² + σ_save²)
  int64_t available_ns = 0;  // deadline − now
};

class OMNI_EXPORT Forecaster {
 public:
  static absl::StatusOr<Forecaster> Create(const ForecastOptions& options);

  // Forecast over [now, now + horizon) for the steps after stats.last_step(),
  // the next one starting at stats.last_end_ns() (calls are meant for step
  // boundaries; windows already past `now` are clipped or dropped).
  // FailedPrecondition while stats has no post-warm-up normal step.
  absl::StatusOr<Forecast> Predict(const StepStats& stats, int64_t now_ns) const;

  // "Will one more of my steps plus my save fit before `deadline_ns`?"
  // InvalidArgument for negative or non-finite costs.
  absl::StatusOr<FitCheck> FitsBefore(const GuestCost& guest, int64_t now_ns,
                                      int64_t deadline_ns) const;

  const ForecastOptions& options() const { return options_; }

 private:
  explicit Forecaster(const ForecastOptions& options) : options_(options) {}
  ForecastOptions options_;
};

// A fixed-width table of the first `max_rows` windows, times relative to
// made_at, for terminals.
OMNI_EXPORT std::string ForecastToTable(const Forecast& forecast, int max_rows = 20);

// Versioned JSON (schema "omni.forecast", version 1; docs/telemetry.md).
OMNI_EXPORT std::string ForecastToJson(const Forecast& forecast);
// InvalidArgument naming the field for malformed input; FailedPrecondition for
// a newer schema version.
OMNI_EXPORT absl::StatusOr<Forecast> ForecastFromJson(const std::string& json);

}  // namespace omni
