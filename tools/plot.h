// `omni plot LOG [--out FILE.svg] [--from-step N] [--to-step N] [--k K] [--horizon-s S] [--guest
// G.jsonl]`: an SVG timeline of a step log's real idle time against the forecast windows, one lane
// per idle kind, made by replaying the log through the forecaster as the live runtime would have
// (each forecast shown from its step boundary until the next one, as `omni eval` scores it).
//
// Thread safety: the functions are pure; call them from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/forecast.h"
#include "omni/stats.h"
#include "omni/step_log.h"

namespace omni::cli {

// Another job's work drawn in its own lane under the host's idle time (a
// co-located guest's units) and labelled vertical marks (e.g. a replica
// killed), on the same CLOCK_MONOTONIC nanoseconds as the step log.
struct GuestTrack {
  std::string label;                                   // lane title, e.g. "guest units"
  std::vector<std::pair<int64_t, int64_t>> units;      // [start_ns, end_ns)
  std::vector<std::pair<int64_t, std::string>> marks;  // t_ns, label
};

// Reads a guest's JSON Lines file: {"start_ns": A, "end_ns": B} per unit and
// {"t_ns": T, "mark": "label"} per mark; other lines are skipped.
// InvalidArgument naming the file and line for malformed JSON.
absl::StatusOr<GuestTrack> ReadGuestTrack(const std::string& path);

struct PlotOptions {
  int64_t from_step = -1;    // first step shown (-1: the first in the log)
  int64_t to_step = -1;      // last step shown (-1: the last in the log)
  ForecastOptions forecast;  // events are taken from the log header
  double width_px = 1400;
  std::string title;  // e.g. the log's path
  GuestTrack guest;   // drawn when it has units or marks
  // A resumed run's log: the run before it, learned first as the live
  // telemetry did (PreviousRunSteps); null: none.
  const StepLog* previous = nullptr;
};

// The SVG document. InvalidArgument for an empty log or a step range with no
// step in it; FailedPrecondition when the log never allows a forecast.
absl::StatusOr<std::string> PlotTimeline(const StepLog& log, const PlotOptions& options);

// Tells on stderr that ReadStepLog left out `log`'s unfinished last line
// (a running job's log); nothing when there was none. For every subcommand
// that reads a step log.
void NoteUnfinishedTail(const std::string& path, const StepLog& log);

// The `omni plot` subcommand (argv as given to main). Exit code 0, 1 (the
// operation failed, message on stderr) or 2 (usage).
int PlotCommand(int argc, char** argv);

}  // namespace omni::cli
