// Phases of a training step, and the fixed-size record of one step.
//
// A step is a time interval; phases are named intervals inside it that nest
// (a phase ends before its parent does). Each phase says whether the devices
// are busy during it or idle, and if idle, why (IdleKind). At any instant the
// innermost open phase decides; time inside a step not covered by any phase is
// host-side idle time.
//
// Thread safety: PhaseCatalog is not thread-safe (Telemetry guards its own);
// StepRecord is a plain value.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "omni/export.h"

namespace omni {

using PhaseId = uint8_t;

// Why the devices are idle. kNone means busy.
enum class IdleKind : uint8_t {
  kNone = 0,
  kDataStall,       // waiting for input data
  kCheckpoint,      // saving state
  kEval,            // host-side evaluation work
  kPipelineBubble,  // pipeline-parallel warm-up / cool-down
  kHostSide,        // any other host work (logging, Python, uncovered time)
};
inline constexpr int kNumIdleKinds = 6;

// "busy", "data_stall", "checkpoint", "eval", "pipeline_bubble", "host_side".
OMNI_EXPORT const char* IdleKindName(IdleKind kind);
OMNI_EXPORT absl::StatusOr<IdleKind> ParseIdleKind(std::string_view name);

// Built-in phases; their ids are stable and registered in every catalog.
namespace phase {
inline constexpr PhaseId kDataWait = 0;        // "data_wait",   idle: data_stall
inline constexpr PhaseId kCompute = 1;         // "compute",     busy (forward + backward)
inline constexpr PhaseId kComm = 2;            // "comm",        busy (gradient communication)
inline constexpr PhaseId kOptimizer = 3;       // "optimizer",   busy
inline constexpr PhaseId kCheckpoint = 4;      // "checkpoint",  idle: checkpoint
inline constexpr PhaseId kEval = 5;            // "eval",        idle: eval (nest busy work inside)
inline constexpr PhaseId kPipelineBubble = 6;  // "pipeline_bubble", idle: pipeline_bubble
inline constexpr PhaseId kHost = 7;            // "host",        idle: host_side
inline constexpr int kNumBuiltin = 8;
}  // namespace phase

inline constexpr int kMaxPhases = 32;        // built-in + user-named
inline constexpr int kMaxSpansPerStep = 64;  // phase intervals recorded per step
inline constexpr int kMaxPhaseDepth = 8;     // nesting depth

class OMNI_EXPORT PhaseCatalog {
 public:
  PhaseCatalog();  // holds the built-in phases

  // Adds a user-named phase, or returns the id of an existing phase with the
  // same name and idle kind. Errors: InvalidArgument for an empty name or one
  // with characters other than [A-Za-z0-9_.-/]; AlreadyExists when the name is
  // registered with another idle kind; ResourceExhausted past kMaxPhases.
  absl::StatusOr<PhaseId> Register(std::string_view name, IdleKind idle);
  // NotFound naming the phase when it is not registered.
  absl::StatusOr<PhaseId> Find(std::string_view name) const;

  int size() const { return size_; }
  bool Contains(PhaseId id) const { return id < size_; }
  // REQUIRES: Contains(id).
  const std::string& name(PhaseId id) const { return names_[id]; }
  IdleKind idle_kind(PhaseId id) const { return kinds_[id]; }

 private:
  std::array<std::string, kMaxPhases> names_;
  std::array<IdleKind, kMaxPhases> kinds_{};
  int size_ = 0;
};

// One phase interval inside a step, in absolute clock nanoseconds.
struct PhaseSpan {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  PhaseId phase = 0;
  uint8_t depth = 0;  // 0 = directly inside the step
};

// How a step is attributed in the statistics: a step containing a checkpoint
// (or else an eval) phase counts as such, not as a normal training step.
enum class StepKind : uint8_t { kNormal = 0, kCheckpoint = 1, kEval = 2 };
inline constexpr int kNumStepKinds = 3;
OMNI_EXPORT const char* StepKindName(StepKind kind);

// A completed step. Fixed size: recording one never allocates.
struct OMNI_EXPORT StepRecord {
  int64_t step = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint16_t num_spans = 0;
  bool spans_truncated = false;                   // more than kMaxSpansPerStep phases were opened
  std::array<PhaseSpan, kMaxSpansPerStep> spans;  // in order of phase start

  int64_t duration_ns() const { return end_ns - start_ns; }
  StepKind kind() const;
};

// The largest step number a record may carry: the forecaster reckons with
// the numbers of steps after the last one (in a log of every k-th step, k
// times a cycle of steps ahead), and they must fit in an int64.
inline constexpr int64_t kMaxStepNumber = int64_t{1} << 61;

// The range of a record's clock readings, [0, kMaxClockNs] (2^62 ns, 146
// years: CLOCK_REALTIME reaches it in 2116): the forecaster adds a horizon
// and the lengths of steps ahead to them, and the sums must fit in an int64.
inline constexpr int64_t kMaxClockNs = int64_t{1} << 62;

// Checks a record's invariants: a step number in [0, kMaxStepNumber],
// clock readings in [0, kMaxClockNs], start <= end, spans inside the step,
// properly nested, depths consistent, phase ids known to `catalog`.
// InvalidArgument naming the step and span otherwise.
OMNI_EXPORT absl::Status ValidateStepRecord(const StepRecord& rec, const PhaseCatalog& catalog);

// An idle interval of a step in absolute clock nanoseconds.
struct IdleInterval {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  IdleKind kind = IdleKind::kHostSide;
};

// The idle intervals of a valid record under the innermost-phase rule, in time
// order, adjacent intervals of one kind merged. Calls `out` for each.
template <typename Fn>
void ForEachIdleInterval(const StepRecord& rec, const PhaseCatalog& catalog, Fn&& out);

// A window of a step as the live window notices see it (omni/window_channel.h):
// a maximal interval in which the innermost open phase is one idle `phase`
// (uncovered step time is no window), and its ordinal among that phase's
// windows in the step (0 = the first; an eval phase nesting a forward pass has
// window 0 before it and window 1 after it).
struct PhaseWindow {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  PhaseId phase = 0;
  int ordinal = 0;
};

// The phase windows of a valid record, in time order. Calls `out` for each.
template <typename Fn>
void ForEachPhaseWindow(const StepRecord& rec, const PhaseCatalog& catalog, Fn&& out);

// The time between one step's end and the next step's begin (host work a
// trainer does outside the step hooks: fetching its batch, logging) as the
// live notices see it: a host_side window of this pseudo-phase, which no
// catalog holds, announced by EndStep and closed by BeginStep
// (omni/window_channel.h). Its ordinal is always 0.
inline constexpr PhaseId kBetweenStepsPhase = kMaxPhases;

// The window between steps before `rec`: the gap from the end of step
// rec.step − 1 (`prev_step`, `prev_end_ns`: the step logged before `rec`,
// prev_step −1 for none) to rec's start. False when that step is not the
// one before `rec` (the first step, a sampled log, a dropped record).
inline bool GapWindowBefore(int64_t prev_step, int64_t prev_end_ns, const StepRecord& rec,
                            PhaseWindow* out) {
  if (prev_step < 0 || rec.step != prev_step + 1) return false;
  *out = PhaseWindow{prev_end_ns, std::max(rec.start_ns, prev_end_ns), kBetweenStepsPhase, 0};
  return true;
}

}  // namespace omni

#include "omni/internal/phase_inl.h"  // IWYU pragma: export
