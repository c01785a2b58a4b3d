// Replays the live window notices a guest on the same host would have read
// from a step log, and scores the remaining durations they stated: the idle
// phases' windows and the gaps between consecutive steps (announced while one
// of the last `window` gaps lasted `min_window_ns`, as the telemetry does). Private
// to omni_core (Evaluate calls it).
//
// Thread safety: a pure function.
#pragma once

#include <vector>

#include "omni/evaluator.h"
#include "omni/window_channel.h"

namespace omni {

// The window durations a (phase, ordinal) had before each step (the
// telemetry worker's tables: the last `window` windows, none below
// `min_samples`), and at each window of the log a guest that reads the
// remaining duration at the window's open and every `poll` after while it
// is open, using each claim to its end. Scores the union of the claims
// against the window, per idle kind.
// `claims` (may be null): the claimed stretches in the log's time, per
// window in time order (a stretch may run past its window's close).
// `forecast` (may be null): per step of the log, the claims of the outlook
// a reader found when that step ran (WindowOutlook::claims of the forecast
// made after the step before, none when it could not be made); a window
// matched to one is claimed as the channel reader claims it
// (WithForecastClaim).
// `learned`: steps before the log's, learned from only (a previous run's,
// EvaluateOptions::previous; the gap between them and the log's first step
// is neither learned nor scored).
EvaluationReport::NoticeScore ReplayNotices(const StepLog& log,
                                            const std::vector<StepRecord>& learned,
                                            const NoticeReplayOptions& o, int64_t min_window_ns,
                                            const std::vector<std::vector<ForecastClaim>>* forecast,
                                            std::vector<NoticeClaim>* claims);

}  // namespace omni
