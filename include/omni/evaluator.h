// Replays a step log against the forecasts that would have been made at each
// step boundary and scores them:
//   precision = forecast idle time that really was idle / forecast idle time
//   recall    = real idle time that was forecast / real idle time
// Real idle time is what ForEachIdleInterval finds in the logged steps, plus
// the gaps between consecutive steps (host-side). In a sampled log (one that
// records every N-th step) only logged time is scored: the time of the steps
// in between is unknown, so forecast windows there count neither way.
//
// Next-step bounds are scored too: before each logged step is replayed, the
// bound the model gives for it (from the past only) is checked against its
// duration: coverage = fraction inside, slack = bound's upper end / duration.
//
// Two ways to score:
//  - kLive (default): each forecast is scored while it is the current one, from
//    its boundary to the next forecast's (what a scheduler that re-reads the
//    latest forecast experiences); a claim that began before the next
//    forecast counts to its own end in the precision (a guest that started
//    to use a window keeps it);
//  - kHorizon: each forecast is scored over its whole horizon (clipped to the
//    end of the log): how good the long-range predictions are.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/forecast.h"
#include "omni/stats.h"
#include "omni/step_log.h"

namespace omni {

enum class Scoring { kLive, kHorizon };

// How Evaluate replays the live window notices (omni/window_channel.h): the
// telemetry's defaults (TelemetryOptions::window_confidence,
// window_min_samples, StatsOptions::window) and a guest that reads the
// remaining duration every `poll_ns` while a window is open (the co-location
// guest's ChannelSourceOptions::poll).
struct NoticeReplayOptions {
  double confidence = 0.95;
  int min_samples = 3;
  int window = 200;
  int64_t poll_ns = 500'000;
  // Whether a notice is matched to the forecast's windows (the channel
  // reader's WindowNotice::forecast_guaranteed_ns); false: the quantile
  // table alone.
  bool match_forecast = true;
};

struct EvaluateOptions {
  // Events default to the log header's. `omni eval --window N` sets
  // forecast.history_steps (the steps of the current regime it learns from).
  ForecastOptions forecast;
  bool events_from_header = true;
  int stride_steps = 1;  // forecast at every stride-th boundary
  Scoring scoring = Scoring::kLive;
  NoticeReplayOptions notices;
  // Whether the report keeps the notices' claims and the union of them and
  // the windows' (EvaluationReport::notice_claims, combined_claims): what a
  // guest reading the live notices, or the notices and the forecasts, was
  // told, for a model of such a guest (benchmarks/cluster_sim_model.cc).
  bool keep_notice_claims = false;
  // A resumed run's log is scored as the live telemetry forecast it
  // (TelemetryOptions::learn_previous_steps): the forecaster and the
  // notices' tables first learn the last `previous_steps` steps of the
  // previous run's log numbered before this log's first, which are not
  // scored (the live telemetry learns fewer where a job's steps are so short
  // that its ring would fill meanwhile). Null: the log is scored on its
  // own. Must outlive the call.
  const StepLog* previous = nullptr;
  int previous_steps = 1024;
};

// The time a published window lets a guest use, as Evaluate scores it: its
// sure part [start_ns, start_ns + duration_ns), and its guaranteed length from
// the moment the window's slot (its kind and ordinal) actually opened in
// `step_record`, the record of w.step (when the live window-open notice is
// written). A window whose slot does not open in that step claimed its
// guaranteed length from its latest start (false time). `step_record` nullptr
// (the step is not in the log): the sure part only. Disjoint, in time order.
// `prev_end_ns`: the end of step w.step − 1 when it is logged (else -1),
// where a window before the step (IdleWindow::before_step) opens; such a
// window of a step whose predecessor is not logged opened at a time the log
// does not show: the sure part only, as for an unlogged step.
struct ClaimedSpan {
  int64_t start_ns = 0, end_ns = 0;
};

// A stretch of time claimed idle without a break, and the kind of the
// window whose claim began it: by the replayed live notices (each claim used
// to its end; it may run past its window's close), or by them and the
// forecasts' windows together (EvaluationReport::combined_claims).
struct NoticeClaim {
  int64_t start_ns = 0, end_ns = 0;
  IdleKind kind = IdleKind::kNone;
};
OMNI_EXPORT std::vector<ClaimedSpan> WindowClaimedSpans(const IdleWindow& w,
                                                        const StepRecord* step_record,
                                                        const PhaseCatalog& catalog,
                                                        const ForecastOptions& options,
                                                        int64_t prev_end_ns = -1);

struct OMNI_EXPORT EvaluationReport {
  struct Score {
    int64_t forecast_ns = 0;       // forecast idle time
    int64_t forecast_true_ns = 0;  // ... of it really idle (any kind)
    int64_t real_ns = 0;           // real idle time inside scored ranges
    int64_t real_covered_ns = 0;   // ... of it forecast (any kind)
    double precision() const;
    double recall() const;
  };
  // Next-step bounds of one kind of step (or of all).
  struct BoundScore {
    int64_t steps = 0;        // steps that had a bound
    int64_t covered = 0;      // ... whose duration fell inside it
    double slack_median = 0;  // median of hi / duration
    double coverage() const;
  };
  Scoring scoring = Scoring::kLive;
  int64_t forecasts = 0;
  int64_t windows = 0;
  double claimed_confidence = 0;  // what every window and bound states
  int64_t regime_changes = 0;
  int64_t transients = 0;  // changes taken back (Forecaster::transients)
  Score total;
  std::array<Score, kNumIdleKinds> by_kind;  // indexed by IdleKind
  BoundScore next_step;
  std::array<BoundScore, kNumStepKinds> next_step_by_kind;  // indexed by StepKind
  // The live notices replayed: at each window of an idle phase in the log
  // and each gap between consecutive steps (announced while one of the last
  // `window` gaps lasted ForecastOptions::min_window_ns, as the telemetry
  // does), the remaining durations a guest reading every
  // NoticeReplayOptions::poll_ns was told (from the windows measured before
  // that step, and the guaranteed length of the forecast window it was
  // matched to, from the forecast made after the step before, scaled as the
  // telemetry worker scales it: as the channel reader states them), each
  // used to its end. forecast_ns is the claimed time, forecast_true_ns the
  // part of it inside the window; real_ns the windows' and gaps' time.
  // first_claims: windows whose notice at the open claimed a remaining
  // duration; first_claims_held: ... that lasted it.
  struct NoticeScore {
    Score total;
    std::array<Score, kNumIdleKinds> by_kind;
    int64_t first_claims = 0;
    int64_t first_claims_held = 0;
    // Windows whose notice carried a forecast window's guaranteed length
    // (matched, and scaled to more than 0 by how such claims fared:
    // WindowNotice::forecast_guaranteed_ns).
    int64_t forecast_matched = 0;
  };
  NoticeReplayOptions notice_options;
  NoticeScore notices;
  // The notices' claims in time order, per window (EvaluateOptions::
  // keep_notice_claims; else empty).
  std::vector<NoticeClaim> notice_claims;
  // A guest acting on both: each forecast window's claim (as scored above)
  // and the notices' claims, their union, over the logged time from the
  // first forecast on. by_kind: the precision of each kind's claims, the
  // recall of each kind's real idle time by any claim.
  Score combined_total;
  std::array<Score, kNumIdleKinds> combined_by_kind;
  // That union's claims, every kind's merged, in time order, cut to the
  // logged time (EvaluateOptions::keep_notice_claims; else empty).
  std::vector<NoticeClaim> combined_claims;

  std::string ToJson() const;
  std::string ToTable() const;
};

// InvalidArgument for bad options (stride_steps, previous_steps < 0, the notices' confidence
// outside (0, 1), a non-positive min_samples, window or poll_ns), an empty
// log, or a step that starts before the previous one started (the clock went
// back); FailedPrecondition when no forecast could be made (too few steps in
// any regime), or naming a phase of `previous` this log lacks or has as
// another idle kind.
OMNI_EXPORT absl::StatusOr<EvaluationReport> Evaluate(const StepLog& log,
                                                      const EvaluateOptions& options);

}  // namespace omni
