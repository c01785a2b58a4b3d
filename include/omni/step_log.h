// The JSON Lines step log: a header line, then one line per step (and a
// "phase" line whenever a phase is registered after the header). The schema is
// documented in docs/telemetry.md and versioned ("omni.steplog", version 1).
//
// Thread safety: a StepLogWriter is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/forecast.h"
#include "omni/phase.h"

namespace omni {

struct StepLogHeader {
  static constexpr int kSchemaVersion = 1;
  int version = kSchemaVersion;
  std::string source;  // who wrote it (e.g. "omni_train", "omni_tracegen")
  PhaseCatalog phases;
  // The periodic events declared by the writer, so a replay forecasts with the
  // same knowledge the live run had.
  PeriodicEvent checkpoint;
  PeriodicEvent eval;
  PipelineSchedule pipeline;
};

struct StepLog {
  StepLogHeader header;
  std::vector<StepRecord> steps;
  // Bytes of an unfinished last line that ReadStepLog left out (0: none):
  // the log is still being written, or its writer stopped mid-line.
  size_t unfinished_tail_bytes = 0;
};

// The longest line ReadStepLog accepts (a step of kMaxSpansPerStep spans
// takes well under this; parsing costs tens of times the bytes in memory).
inline constexpr size_t kMaxStepLogLineBytes = size_t{1} << 20;

// Reads a whole log. Errors name the file and line: NotFound / PermissionDenied
// for the file, FailedPrecondition for a file that is not a regular file (a
// FIFO is refused without blocking) or a newer schema version,
// InvalidArgument for malformed JSON, a field of the wrong type (each
// reported as "path:line: ..."), a line longer than kMaxStepLogLineBytes, a
// record that fails ValidateStepRecord, a step number not after the previous
// one, or a step that starts before the previous one started (the clock went
// back: two runs in one file). A last line without its newline
// that is not JSON is the line a live writer has not finished (a running
// job's log, or one whose writer was killed mid-line): it is left out and
// counted in unfinished_tail_bytes, not an error.
OMNI_EXPORT absl::StatusOr<StepLog> ReadStepLog(const std::string& path);

// Reads the header, the phase lines before the first step and the last
// `max_steps` lines of a log, without reading what lies between: a resumed
// job learns from the end of its previous run's log, which may be gigabytes
// (TelemetryOptions::learn_previous_steps). At most 64 MiB of the head
// and of the end are read (lines that long leave fewer steps). The lines read are checked as
// ReadStepLog checks them; errors as ReadStepLog's, with the line's byte
// offset instead of its number in the tail, and InvalidArgument for
// max_steps < 1, a stretch without a newline longer than a line may be (a
// log whose end a crash filled with zeros: refused as soon as it is read),
// or a phase registered between the head and the tail (its "phase" line is
// not read, so a step naming it is refused).
OMNI_EXPORT absl::StatusOr<StepLog> ReadStepLogTail(const std::string& path, int max_steps);

// A resumed run learns from the run before it (TelemetryOptions::
// learn_previous_steps, EvaluateOptions::previous, `omni forecast|plot
// --previous`): the steps of `previous` to learn before `first`, this run's
// first step. Those numbered before it (a resume redoes the steps after its
// checkpoint), at most the last `max_steps` of them, with their phases
// renamed into `catalog` by name, and their times moved so that the last one
// ends one usual gap (the median between its steps) before `first` starts:
// the time between the runs is no part of the job's rhythm, and the two
// runs' clocks may not be comparable (another host, a reboot). Steps that
// would start before the clock's 0 are left out. Empty when none is before
// `first`. Errors: FailedPrecondition naming a phase of `previous` that
// `catalog` lacks or registers as another idle kind (the job changed:
// nothing of the previous run is to be learned); InvalidArgument for a
// step of `previous` that ValidateStepRecord refuses, or steps out of
// order (a log built in code).
OMNI_EXPORT absl::StatusOr<std::vector<StepRecord>> PreviousRunSteps(const StepLog& previous,
                                                                     const StepRecord& first,
                                                                     const PhaseCatalog& catalog,
                                                                     int max_steps);

class OMNI_EXPORT StepLogWriter {
  struct Private {};

 public:
  // Creates or truncates `path` and writes the header. With keep_previous,
  // an existing `path` (an earlier run of a resumed job) is moved to the
  // first free "<path>.N" instead of being truncated. Errors name the path.
  static absl::StatusOr<std::unique_ptr<StepLogWriter>> Open(const std::string& path,
                                                             const StepLogHeader& header,
                                                             bool keep_previous = false);
  StepLogWriter(Private, std::FILE* file, std::string path, int phases_announced);  // use Open
  // Where Open moved the earlier run's log ("<path>.N"); empty when it moved
  // none.
  const std::string& previous_path() const { return previous_path_; }
  ~StepLogWriter();
  StepLogWriter(const StepLogWriter&) = delete;
  StepLogWriter& operator=(const StepLogWriter&) = delete;

  // `catalog` resolves phase names (it may have grown since the header; new
  // phases are announced with a "phase" line first).
  absl::Status Append(const StepRecord& rec, const PhaseCatalog& catalog, bool warmup);
  absl::Status Flush();
  // Flushes, fsyncs and closes; idempotent.
  absl::Status Close();

 private:
  std::FILE* file_;
  std::string path_;
  int phases_announced_;
  std::string previous_path_;
  std::string line_;  // reused buffer
};

}  // namespace omni
