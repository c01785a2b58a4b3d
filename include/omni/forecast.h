// Idle-window forecasts: when will the devices be idle, with what confidence,
// and how long will each of the next steps take.
//
// The model (docs/telemetry.md, "The forecasting model"):
//  - Every observed step is reduced to its idle intervals relative to the
//    step's start, keyed by (idle kind, ordinal in the step): a "slot".
//  - Rhythm: a future step's kind comes from the declared events
//    (checkpoint / eval every N, ForecastOptions) and from events learned in
//    the log (a slot seen at equally spaced steps). Within a kind, each
//    quantity (step duration, each slot's idle time) is conditioned on the
//    step's residue modulo a period P ∈ [1, 64] chosen per quantity by a
//    penalised least-squares fit (BIC-like: n·ln(SSE/n) + 2·classes·ln n),
//    so a stall every 3rd step is forecast on those steps only and noise does
//    not buy spurious periods.
//  - Bounds are empirical quantiles of the matching past steps (no normal
//    assumption), widened by an online calibrator per claim family (windows,
//    step bounds): every claim is checked when its step completes and the
//    widening grows after a miss and shrinks after a hit, so the realised
//    rate converges to at least the stated confidence (adaptive conformal
//    inference on a margin). Where step times have memory (contention that
//    comes and goes, a slow drift) the next step's bound is the recent
//    level of its class plus the quantiles of past residuals about such
//    levels; most of a bound's miss budget is above it.
//  - An undeclared event is learned from its spacing: from its third
//    occurrence when its first two explain the whole log, else once three
//    (four below a spacing of 8) are equally spaced, or spaced by multiples
//    of one spacing that skip only steps missing from the log. An eval or
//    checkpoint by wall time (every 20 s: 85, 85, 84, 86 steps apart) is
//    learned from the times of its last occurrences and claimed only at the
//    next logged step, where its timer surely passes its period.
//  - An event's length is claimed from its latest level (a drop is a new
//    level from two lengths on, a rise from three above every length
//    before it) and, where its lengths follow a rhythm of its occurrences
//    (a quick and a full eval in turn), from the next one's class; a
//    rhythm must hold each class's lengths out of sample, or noise bought
//    it. No claim from two or three occurrences tells an event of two
//    random modes from a steady one (docs/telemetry.md).
//  - Regime changes: a step outside its bound by a wide margin suspends
//    windows until steps fit again; three clear misses on the same side
//    (beyond the bound by a quarter of its width) start a new regime (older
//    steps are forgotten), and so do 5 clear misses on either side among
//    the last 20 steps (a changed rhythm); leading steps of a regime more
//    than 3× its median (compile warm-up) are dropped. When, within 64 steps
//    of a change from a run of misses, 8 normal steps in a row fit the old
//    regime's bounds, the change was a transient (a slow spell that
//    passed): the old history comes back without the steps that missed,
//    and no change since it is counted (transients() counts these).
//  - Windows are anchored to steps: each has its step, kind, earliest and
//    latest start, a duration guaranteed once it started and an expected
//    duration; far-ahead windows keep their length, only their start spreads.
//
// Implementation: src/runtime/forecast.cc (learning), forecast_windows.cc
// (publishing), forecast_json.cc (the format); learners in rhythm.cc,
// quantile.cc, wall_clock.cc and step_slots.cc.
//
// Thread safety: Forecaster is not thread-safe (it learns online); Telemetry
// owns one on its worker thread and hands out copies of its forecasts and
// bounds. options() is immutable and may be read from any thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/phase.h"

namespace omni {

// An event that happens in every step s with s % every_steps == offset
// (disabled when every_steps == 0). Until its phase has been measured, its
// duration is taken as expected_ns (and it is not forecast when that is 0),
// and 80% of it is claimed idle from the moment its idle time opens (no time
// is claimed by the clock: busy work nested first, an eval's forward pass,
// would be claimed): declare the time the devices are idle in it (an eval
// that runs forward passes inside its phase declares its time without them,
// or 0), or the first occurrence's claim may outlast its idle time.
//
// Or by wall time (every_ns > 0, every_steps 0): the event comes in the
// first step whose training work ends at least every_ns after the last
// occurrence began (the job checks a timer at each step boundary and
// restarts it as the event begins: omni::Runtime's ckpt_every_time in one
// process). Its steps follow no step rule, and none is learned for it; from
// its first occurrence on, the step of the next is forecast where the
// steps' lengths make it sure (a far-ahead window is not published).
// With wall_lag_steps > 0 (every_ns only; at most kMaxWallLagSteps) the
// event comes that many steps after that first step instead: the replicas
// of an elastic group agree on the boundary after the next step from the
// first due one's (omni::Runtime's ckpt_every_time there: 1).
struct PeriodicEvent {
  static constexpr int64_t kMaxWallLagSteps = 8;
  int64_t every_steps = 0;
  int64_t offset = 0;
  int64_t expected_ns = 0;
  int64_t every_ns = 0;
  int64_t wall_lag_steps = 0;
  bool OccursAt(int64_t step) const {
    return every_steps > 0 && step >= 0 && step % every_steps == offset;
  }
};

// GPipe-style schedule of one pipeline stage: `micro_batches` forward passes,
// then as many backward passes taking `backward_over_forward` times as long.
// The compute phase of a step spans (m + p − 1)·(t_f + t_b); stage r idles r·t_f
// before its first forward, (p−1−r)·(t_f + t_b) between its last forward and
// its first backward, and r·t_b after its last backward: a bubble fraction of
// (p − 1)/(m + p − 1) on every stage. Disabled when stages == 1. When a log
// carries no pipeline_bubble phases, the bubbles are derived from the compute
// phase with this schedule.
struct PipelineSchedule {
  int stages = 1;
  int micro_batches = 1;
  int stage = 0;
  double backward_over_forward = 2.0;
};

// (p − 1)/(m + p − 1). REQUIRES: p ≥ 1, m ≥ 1.
OMNI_EXPORT double PipelineBubbleFraction(int stages, int micro_batches);

// The longest forecast horizon, 2^61 ns (73 years): added to a clock
// reading of at most kMaxClockNs, the sum fits in an int64.
inline constexpr int64_t kMaxForecastHorizonNs = int64_t{1} << 61;

struct ForecastOptions {
  int64_t horizon_ns = 300'000'000'000;  // 5 minutes; at most kMaxForecastHorizonNs
  // Stated confidence of every window and bound. 0 = derive it from k as the
  // two-sided normal coverage erf(k/√2) (0.954 for the default k = 2).
  double confidence = 0;
  double k = 2.0;
  int64_t min_window_ns = 1'000'000;  // 1 ms
  int max_windows = 4096;
  int history_steps = 512;  // steps of the current regime kept for learning
  int min_steps = 5;        // steps a regime needs before anything is published
  int max_period = 64;      // longest residue-class period searched
  // Steps that contain the checkpoint / eval phase. A declaration by steps
  // whose event is missing from two logged declared steps in a row is set
  // aside until a declared step has it again (the event's own steps are
  // then learned, as an undeclared event's are).
  PeriodicEvent checkpoint;
  PeriodicEvent eval;
  PipelineSchedule pipeline;
  // Level window of the previous model; kept for option compatibility (the
  // regime detector replaces it). Must be positive.
  int level_window = 50;

  // The confidence in effect (confidence, or erf(k/√2) when it is 0).
  double StatedConfidence() const {
    return confidence > 0 ? confidence : std::erf(k / std::sqrt(2.0));
  }
};

// InvalidArgument naming the field: horizon outside (0,
// kMaxForecastHorizonNs], negative or non-finite k, confidence outside
// [0, 1), a k that states no confidence in (0, 1) when confidence is 0
// (k = 0, or k above about 8.37, where erf(k/√2) rounds to 1), negative
// min_window, history_steps < 8, min_steps < 2, max_period outside
// [1, 256], negative every/offset/expected, offset ≥ every,
// pipeline stages < 1, micro_batches < 1, stage outside [0, stages),
// non-finite or negative backward_over_forward.
OMNI_EXPORT absl::Status ValidateForecastOptions(const ForecastOptions& options);

// Windows of one kind in a step the forecaster tells apart (IdleWindow::ordinal).
inline constexpr int kMaxIdleOrdinals = 16;

struct IdleWindow {
  // The interval that is idle at the stated confidence: [latest start,
  // earliest start + guaranteed). Zero-length when the start is too
  // uncertain (far ahead); the window is still listed with its durations.
  int64_t start_ns = 0;  // clock nanoseconds (same clock as the steps)
  int64_t duration_ns = 0;
  IdleKind kind = IdleKind::kHostSide;
  double confidence = 0;  // stated P(the claim holds); what replay measures
  int64_t step = 0;       // the step the window falls in
  // Anchoring (schema version 2).
  std::string phase;              // the phase whose idle time it is ("" = between phases)
  int64_t earliest_start_ns = 0;  // earliest / latest time the idle time starts
  int64_t latest_start_ns = 0;
  int64_t guaranteed_ns = 0;  // lasts at least this long once started
  int64_t expected_ns = 0;    // median length
  // Which of the step's windows of this kind it is (0 = the first). With one
  // phase of the kind (the built-in phases) it is the live notice's ordinal
  // (omni/window_channel.h): a guest that sees the window-open notice of
  // (step, phase, ordinal) may use guaranteed_ns from that moment on. In a
  // step with more than kMaxIdleOrdinals windows of the kind, the last
  // ordinal stands for the step's last such window (an eval split into many
  // decode passes keeps the idle time after its last one); no notice is
  // matched to that ordinal, since a window's open does not tell whether it
  // is the last.
  int ordinal = 0;
  // The host-side time between steps: from the end of step `step` − 1 to
  // the start of `step` (kind kHostSide, phase "", ordinal 0). Such a gap
  // has no live notice: nothing in the step hooks marks it as idle.
  bool before_step = false;
};

// "How long will step `step` take?": its duration lies in [lo_ns, hi_ns]
// with probability `confidence` (calibrated online).
struct StepBound {
  int64_t step = 0;
  int64_t lo_ns = 0, hi_ns = 0;
  double confidence = 0;
  // The host-side time before the step, from the end of the one before it
  // (a batch fetched or a flush done outside the step hooks), is at most
  // this at the same confidence: the step's own gap where its model has
  // one (IdleWindow::before_step), else the upper quantile of the gaps
  // before the past steps of its residue class; 0 when no gaps were
  // measured (a sampled log). The time from one step's
  // end to the next one's is at most gap_hi_ns + hi_ns.
  int64_t gap_hi_ns = 0;
};

struct OMNI_EXPORT Forecast {
  // Version 2 (was 1): windows carry phase, earliest/latest start,
  // guaranteed and expected duration; the forecast carries its confidence and
  // the next-step bounds. Version-1 readers that ignore unknown fields still
  // read it; version-1 files are read by this version.
  static constexpr int kSchemaVersion = 2;
  int64_t made_at_ns = 0;
  int64_t horizon_ns = 0;
  int64_t last_step = -1;      // last completed step the forecast is based on
  int64_t steps_observed = 0;  // steps of the current regime the model learned from
  double k = 0;
  double confidence = 0;  // stated confidence of the windows and bounds
  // "When must I be gone?": the earliest plausible time after made_at at
  // which the devices are needed again.
  int64_t devices_needed_at_ns = 0;
  std::vector<IdleWindow> windows;    // in order of start_ns, non-overlapping
  std::vector<StepBound> next_steps;  // bounds of the next few steps
  int64_t save_hi_ns = 0;             // save (checkpoint phase) bound; 0 = none measured

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
  Forecaster(Forecaster&&) noexcept;
  Forecaster& operator=(Forecaster&&) noexcept;
  ~Forecaster();

  // Learns from one completed step (in step order; `catalog` resolves its
  // phases). Also scores the claims the model made about this step (window
  // and bound calibration) and checks for a regime change. InvalidArgument
  // for a record that fails ValidateStepRecord or is not after the last one
  // (the model is then unchanged).
  absl::Status Observe(const StepRecord& rec, const PhaseCatalog& catalog);

  // Forecast over [now, now + horizon) for the steps after the last observed
  // one (calls are meant for step boundaries). FailedPrecondition while the
  // current regime has fewer than min_steps steps. While the newest step
  // broke its bound widely (a suspected regime change), the forecast has no
  // windows. InvalidArgument for a `now_ns` outside [0, kMaxClockNs] (the
  // range of a record's clock readings).
  absl::StatusOr<Forecast> Predict(int64_t now_ns);

  // Bounds of the durations of the next `n` steps (n ≥ 1), in step order;
  // fewer (possibly none) where they stop before a step whose length is
  // unknown: an event of a kind not measured in the current regime and not
  // declared with a length (PeriodicEvent::expected_ns).
  // FailedPrecondition like Predict; InvalidArgument for n < 1.
  absl::StatusOr<std::vector<StepBound>> NextStepBounds(int n) const;

  // Bound of a save (the checkpoint phase's idle time), `step` = the next
  // declared or learned checkpoint step (−1 when unknown). NotFound when no
  // checkpoint phase was observed.
  absl::StatusOr<StepBound> SaveBound() const;

  // "Will one more of my steps plus my save fit before `deadline_ns`?"
  // InvalidArgument for negative or non-finite costs.
  absl::StatusOr<FitCheck> FitsBefore(const GuestCost& guest, int64_t now_ns,
                                      int64_t deadline_ns) const;

  const ForecastOptions& options() const;
  int64_t last_step() const;
  int64_t regime_changes() const;  // regimes started after the first
  int64_t transients() const;      // changes taken back (a slow spell that passed)

  class Impl;

 private:
  explicit Forecaster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A fixed-width table of the first `max_rows` windows, times relative to
// made_at, for terminals.
OMNI_EXPORT std::string ForecastToTable(const Forecast& forecast, int max_rows = 20);

// Versioned JSON (schema "omni.forecast", version 2; docs/telemetry.md).
OMNI_EXPORT std::string ForecastToJson(const Forecast& forecast);
// InvalidArgument naming the field for malformed input; FailedPrecondition for
// a newer schema version.
OMNI_EXPORT absl::StatusOr<Forecast> ForecastFromJson(const std::string& json);

}  // namespace omni
