// Step hooks: measure every step and its phases, keep rolling statistics,
// forecast idle windows, and export a step log, a Perfetto trace and forecasts.
//
//   auto tel = omni::Telemetry::Create(options).value();
//   for (...) {
//     omni::StepScope step(*tel);
//     { omni::PhaseScope p(*tel, omni::phase::kDataWait); batch = loader.Next(); }
//     { omni::PhaseScope p(*tel, omni::phase::kCompute);  loss = Forward(batch); Backward(); }
//     { omni::PhaseScope p(*tel, omni::phase::kOptimizer); opt.step(); }
//   }
//
// The hooks (BeginStep, EndStep, BeginPhase, EndPhase, RecordPhase) are the
// per-step path: they read the clock, write into a preallocated ring of
// StepRecords and never allocate, lock or do I/O (on success). Entering and
// leaving an idle phase also writes a window notice into a seqlock record
// (omni/window_channel.h), likewise without allocating or locking; so do
// EndStep and BeginStep for the gap between steps, while the host's gaps are
// long enough to matter (at least the forecast's min_window). A worker thread
// drains the ring: statistics, step log, trace, forecasts, sinks, and the
// window channel's phase table and outlook (the next forecast window per idle
// kind, for guests deciding whether to wait). Misuse
// (a step ended twice, phases that do not nest, a non-finite duration) returns
// an error Status, is counted, and leaves telemetry working; the step it
// happened in is still recorded when it can be, and dropped otherwise.
//
// Thread safety: the hooks must be called from one thread at a time (the
// training thread). Everything else may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/export.h"
#include "omni/forecast.h"
#include "omni/phase.h"
#include "omni/sinks.h"
#include "omni/stats.h"
#include "omni/window_channel.h"

namespace omni {

struct TelemetryOptions {
  StepStatsOptions stats;
  ForecastOptions forecast;
  bool forecast_enabled = true;
  // Forecasts are computed and published at most this often (clock time);
  // 0 = after every step.
  int64_t publish_interval_ns = 1'000'000'000;
  std::string step_log_path;  // JSON Lines step log; empty = none
  std::string trace_path;     // Chrome-trace / Perfetto JSON; empty = none
  // An existing step log or trace (a resumed job's earlier run) is moved to
  // the first free "<path>.N" instead of being truncated.
  bool keep_previous_outputs = false;
  // With keep_previous_outputs and a step log, when an earlier run's log was
  // moved aside: the forecaster (and the live notices' table of window
  // lengths) learns that run's last `learn_previous_steps` steps numbered
  // before this run's first, as if the job had not stopped, so that a
  // resumed job forecasts its rhythm from its first step rather than after
  // hundreds. Its clock is moved so that its last step ends one usual gap
  // before this run's first begins. The log's tail is read on the worker
  // thread (ReadStepLogTail), and learned when the first step is drained;
  // the statistics, step log and trace hold this run's steps only. A log
  // that cannot be read, or whose phases this run registers otherwise
  // (TelemetryCounters::previous_log_status says which), is not learned
  // from; the run goes on. 0 = start from nothing.
  int learn_previous_steps = 1024;
  std::string source = "omni";
  int ring_capacity = 256;  // completed steps buffered for the worker (power of two)
  // How often the worker looks for completed steps while one may be due.
  // Once it has seen 16 steps, and while no sink is attached, it sleeps
  // until shortly before the next step can end (90% of the shortest recent
  // step, or of the forecast's lower bound for the next step when that is
  // longer, after the last step's end; at most 100 ms at a time), so it
  // wakes a few times per step rather than every poll. With a sink attached
  // (they forward live notices and outlooks) it polls all the time. Flush
  // and destruction wake it at once.
  absl::Duration worker_poll = absl::Milliseconds(2);
  // Live window notices ("idle now" / "busy again", omni/window_channel.h):
  // the shared-memory channel of that name for readers on this host (empty =
  // the notices stay in this process: LatestWindow() and the sinks), and the
  // confidence of the remaining durations they state.
  std::string window_channel_name;
  double window_confidence = 0.95;
  // The fewest measured windows of a (phase, window ordinal) before notices
  // of it state a remaining duration (fewer: -1, no claim). At
  // MinWindowSamples(window_confidence) (20 at 0.95) the stated confidence
  // holds for a new window without further assumptions; the default uses
  // rare windows (an eval every N steps) sooner, at a weaker guarantee while
  // few are measured. At least 1.
  int window_min_samples = 3;
};

struct TelemetryCounters {
  int64_t steps_recorded = 0;   // handed to the worker
  int64_t steps_dropped = 0;    // ring full, or the step was misused beyond repair
  int64_t misuse_errors = 0;    // hook calls that returned an error
  int64_t spans_truncated = 0;  // steps with more than kMaxSpansPerStep phases
  int64_t steps_rejected = 0;   // records the statistics refused (e.g. clock went backwards)
  // Steps the forecaster skipped while the worker was more than half the
  // ring behind (steps shorter than its model building, on a busy host):
  // the statistics, step log and trace still have them, and the forecaster
  // learns from the others as from a sampled log.
  int64_t steps_not_forecast = 0;
  int64_t forecasts_published = 0;
  int64_t export_errors = 0;  // step log / trace / sink failures
  // The previous run's steps the forecaster learned
  // (TelemetryOptions::learn_previous_steps), and why none were, when it
  // was to learn some (OK otherwise).
  int64_t previous_steps_learned = 0;
  absl::Status previous_log_status;
  // Times the worker thread woke to look for completed steps (each poll;
  // see TelemetryOptions::worker_poll): what it costs the other threads.
  int64_t worker_wakeups = 0;
  absl::Status last_error;  // the most recent of the errors above
};

class OMNI_EXPORT Telemetry {
 public:
  // Errors: InvalidArgument naming the option (window, warm-up, forecast
  // options, ring capacity, window channel name or confidence,
  // learn_previous_steps); the step log
  // or trace path not writable, or the window channel not creatable (naming
  // the path and the OS error).
  static absl::StatusOr<std::unique_ptr<Telemetry>> Create(const TelemetryOptions& options,
                                                           const Clock* clock = Clock::Real());
  virtual ~Telemetry() = default;  // implies Close()

  // Adds a user-named phase (see PhaseCatalog::Register). Not on the per-step
  // path: register phases before the loop. Thread-safe.
  virtual absl::StatusOr<PhaseId> RegisterPhase(std::string_view name, IdleKind idle) = 0;
  virtual absl::StatusOr<PhaseId> FindPhase(std::string_view name) const = 0;
  // Adds a forecast sink. Thread-safe.
  virtual void AddSink(std::unique_ptr<ForecastSink> sink) = 0;

  // ---- per-step hooks (training thread) ----
  // Begins step `step` (must be after the last one), or the next step.
  // FailedPrecondition while a step is open (the open step is kept).
  virtual absl::Status BeginStep(int64_t step) = 0;
  virtual absl::Status BeginStep() = 0;
  // FailedPrecondition when no step is open; phases still open are closed at
  // this time and counted as misuse.
  virtual absl::Status EndStep() = 0;
  // FailedPrecondition outside a step; InvalidArgument for an unknown phase
  // or nesting deeper than kMaxPhaseDepth.
  virtual absl::Status BeginPhase(PhaseId phase) = 0;
  // InvalidArgument when `phase` is not the innermost open phase (phases must
  // nest); the open phases are left as they were.
  virtual absl::Status EndPhase(PhaseId phase) = 0;
  // Ends `phase`, as EndPhase does, but records it as `recorded_as`: for a
  // phase found to be something else only at its end (a save abandoned
  // because another replica failed is recorded as host-side time, so that
  // the save bound learns from saves only). A live window notice opened for
  // `phase` is closed as for EndPhase. Errors as EndPhase's, and
  // InvalidArgument for an unknown `recorded_as`.
  virtual absl::Status EndPhaseAs(PhaseId phase, PhaseId recorded_as) = 0;
  // A phase measured elsewhere (e.g. with device events) that ended now and
  // lasted `seconds`. InvalidArgument for a non-finite or negative duration or
  // one longer than the time since the step (or enclosing phase) began.
  virtual absl::Status RecordPhase(PhaseId phase, double seconds) = 0;

  // ---- any thread ----
  // Waits until the worker has processed every step completed before the call
  // and, when there were new steps, made and published a forecast for them
  // (ignoring publish_interval). DeadlineExceeded after `timeout`.
  virtual absl::Status Flush(absl::Duration timeout = absl::Seconds(30)) = 0;
  virtual StatsSnapshot Snapshot() const = 0;
  // The most recent forecast the worker made (FailedPrecondition before the
  // statistics are stationary or when forecasting is off).
  virtual absl::StatusOr<Forecast> LatestForecast() const = 0;
  // Bounds of the durations of the next `n` steps from the worker's latest
  // model (see Forecaster::NextStepBounds), and of a save (the checkpoint
  // phase; NotFound until one was seen). FailedPrecondition before the model
  // is ready or when forecasting is off.
  virtual absl::StatusOr<std::vector<StepBound>> NextStepBounds(int n) const = 0;
  virtual absl::StatusOr<StepBound> SaveBound() const = 0;
  virtual TelemetryCounters Counters() const = 0;
  // The current window notice: open (with the remaining duration given the
  // time elapsed, at options.window_confidence) or closed. Sinks receive each
  // new notice from the worker (ForecastSink::PublishWindow).
  virtual WindowNotice LatestWindow() const = 0;
  // The host's outlook as the window channel carries it (WindowOutlook,
  // omni/window_channel.h): with each forecast the worker publishes, per
  // idle kind the next window it lists (or none within the horizon, or
  // unknown), and the busy period announced below.
  virtual WindowOutlook LatestOutlook() const = 0;
  // The host states that none of its idle windows will open before
  // `until_ns` (on this telemetry's clock): a long stretch without idle time
  // it knows of and its forecast cannot (a compile, a long collective, a
  // phase of pure compute). A guest waiting for a window reads it from the
  // channel (WindowOutlook::busy_until_ns) and may leave instead of waiting
  // (docs/colocation.md). It replaces an earlier announcement; 0 (or any
  // past time) withdraws it. The live notices are unaffected: a window the
  // host opens anyway is announced as usual. Not a per-step hook: it takes a
  // lock (never one the hooks take). InvalidArgument for a negative time;
  // FailedPrecondition after Close().
  virtual absl::Status AnnounceBusy(int64_t until_ns) = 0;
  virtual PhaseCatalog Phases() const = 0;
  // The forecaster learns on the worker thread: other threads may read only
  // its options() through this reference.
  virtual const Forecaster& forecaster() const = 0;
  // Drains the ring, closes the step log and trace (fsynced) and joins the
  // worker. Returns the first export error seen, if any. Idempotent; the
  // hooks return FailedPrecondition afterwards.
  virtual absl::Status Close() = 0;
};

// RAII step: BeginStep in the constructor, EndStep in the destructor. Errors
// are counted in Telemetry::Counters(), never thrown.
class StepScope {
 public:
  explicit StepScope(Telemetry& t) : t_(t) { ok_ = t_.BeginStep().ok(); }
  StepScope(Telemetry& t, int64_t step) : t_(t) { ok_ = t_.BeginStep(step).ok(); }
  ~StepScope() {
    if (ok_) t_.EndStep().IgnoreError();
  }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
  bool ok() const { return ok_; }

 private:
  Telemetry& t_;
  bool ok_ = false;
};

// RAII phase inside a step.
class PhaseScope {
 public:
  PhaseScope(Telemetry& t, PhaseId phase) : t_(t), phase_(phase) {
    ok_ = t_.BeginPhase(phase_).ok();
  }
  ~PhaseScope() {
    if (ok_) t_.EndPhase(phase_).IgnoreError();
  }
  // Ends the phase now, recorded as `recorded_as` (Telemetry::EndPhaseAs).
  void EndAs(PhaseId recorded_as) {
    if (ok_) t_.EndPhaseAs(phase_, recorded_as).IgnoreError();
    ok_ = false;
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Telemetry& t_;
  PhaseId phase_;
  bool ok_ = false;
};

}  // namespace omni
