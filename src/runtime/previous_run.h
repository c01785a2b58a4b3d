// A resumed job's forecaster learns from the end of its previous run's step
// log (private): TelemetryOptions::learn_previous_steps, and the same replay
// in Evaluate (EvaluateOptions::previous), so that `omni eval` scores what
// the live forecaster did.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "omni/phase.h"
#include "omni/step_log.h"

namespace omni::internal {

// The steps of `previous` to learn before `first`, this run's first step:
// those numbered before it (a resume redoes the steps after its checkpoint),
// at most the last `max_steps` of them, with their phases renamed into
// `catalog`, and their times moved so that the last one ends one usual gap
// (the median between its steps) before `first` starts. The time between
// the runs is no part of the job's rhythm, and the two runs' clocks may not
// be comparable (another host, a reboot). Steps that would start before the
// clock's 0 are left out. Empty when none is before `first`.
// Errors: FailedPrecondition naming a phase of `previous` that `catalog`
// lacks or registers as another idle kind (the job changed: nothing of the
// previous run is to be learned).
absl::StatusOr<std::vector<StepRecord>> PreviousRunSteps(const StepLog& previous,
                                                         const StepRecord& first,
                                                         const PhaseCatalog& catalog,
                                                         int max_steps);

}  // namespace omni::internal
