// "Idle now" / "busy again": live window notices for schedulers on the same
// host, through a shared-memory seqlock record cheap enough to poll every
// millisecond.
//
// When the training thread enters an idle phase (IdleKind != kNone) the
// telemetry hooks write a window-open notice (phase, kind, step, the time it
// opened, and which of the phase's windows in the step it is); when the
// innermost open phase is no longer that idle phase they write a closed
// notice. So an idle phase that nests busy work (eval around a forward pass)
// has several windows per step: window 0 before the busy work, window 1
// after it, and so on. The worker thread writes, in a second record, each
// phase's name and, for each window ordinal, the quantiles of the window's
// duration (learned from the step records, ForEachPhaseWindow in
// omni/phase.h): empirical above the median, below it what a new window can
// be claimed at (order statistics, and a small-sample bound where too few
// windows were measured; docs/telemetry.md). A reader combines the two:
// the remaining duration of an open window given the time already elapsed,
// at a stated confidence, is the conditional quantile of that (phase,
// ordinal)'s window duration (see RemainingGivenElapsed); no claim (-1)
// while fewer than TelemetryOptions::window_min_samples windows of it were
// measured.
//
// The time between one step's end and the next step's begin (host work the
// trainer does outside the step hooks) has notices too, once it matters:
// while one of the last StatsOptions::window gaps lasted at least the
// forecast's min_window, EndStep opens a host_side window of the pseudo-phase
// kBetweenStepsPhase (WindowNotice::before_step; `step` is the step that
// follows) and BeginStep closes it. Its quantiles are the gaps' (every gap,
// the short ones too), learned like a phase's.
//
//   // In the training process (Telemetry owns the writer):
//   TelemetryOptions o;  o.window_channel_name = "job-42";
//   // In a scheduler on the same host:
//   auto r = omni::WindowChannelReader::Open("job-42").value();
//   for (;;) {
//     auto n = r->WaitForChange(absl::Milliseconds(100));
//     if (n.ok() && n->state == omni::WindowState::kOpen) Use(n->remaining_ns);
//   }
//
// The channel is the POSIX shared-memory object "/omni-window.<name>" (on
// Linux the file /dev/shm/omni-window.<name>); its layout is versioned
// (magic, schema version, size) and described in docs/telemetry.md. Readers
// never block the writer: a read that overlaps a write is retried.
//
// The worker also writes, with each forecast, the host's outlook: per idle
// kind the next window its forecast lists (earliest start) or none within
// the horizon, a busy period the host announced, and the forecast's windows
// by (step, phase, ordinal) (WindowOutlook, below). A window's notice
// matched to one of those states, while the forecast's guaranteed length
// has not elapsed, a remaining duration of at least what is left of it
// (WindowNotice::forecast_guaranteed_ns).
//
// Thread safety: a WindowChannelWriter's notice methods (Open/CloseWindow)
// must be called from one thread at a time (the training thread) and never
// allocate, lock or do I/O; PublishPhases from one thread at a time (the
// worker). A WindowChannelReader may be used from one thread at a time; any
// number of readers in any number of processes may read one channel.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/export.h"
#include "omni/forecast.h"
#include "omni/phase.h"

namespace omni {

// Quantiles of a window's duration at probabilities i / (kDurationQuantiles-1).
inline constexpr int kDurationQuantiles = 129;
// Windows of one phase in a step with their own quantiles; the last table
// holds every later window of the phase in a step as well (a phase split into
// many pieces: its claims conditional on the elapsed time tell the long
// pieces from the short ones).
inline constexpr int kMaxWindowOrdinals = 4;

// The quantile table of a phase's window number `ordinal` in its step.
inline int WindowTableOf(int ordinal) { return std::clamp(ordinal, 0, kMaxWindowOrdinals - 1); }

// The phases with notices: a catalog's (kMaxPhases) and the gap between
// steps (kBetweenStepsPhase, omni/phase.h).
inline constexpr int kNoticePhases = kMaxPhases + 1;
// The index of (phase, ordinal)'s table among kNoticePhases ×
// kMaxWindowOrdinals; REQUIRES phase < kNoticePhases.
inline size_t NoticeTableIndex(PhaseId phase, int ordinal) {
  return static_cast<size_t>(phase) * kMaxWindowOrdinals +
         static_cast<size_t>(WindowTableOf(ordinal));
}

struct DurationQuantiles {
  int64_t samples = 0;                          // 0 = nothing measured yet
  std::array<double, kDurationQuantiles> ns{};  // non-decreasing
  // The confidence the claims are computed at when it is above the stated
  // one (0: the stated one). The telemetry worker raises it per (phase,
  // window ordinal) while that table's claims at the open held less often
  // than stated (NoticeClaimLevel; docs/telemetry.md).
  double claim_confidence = 0;
};

// The empirical quantiles of `values` (nanoseconds, any order; may be empty).
OMNI_EXPORT DurationQuantiles QuantilesOf(std::vector<double> values);

// The duration r a window of a phase with duration quantiles `q` still lasts,
// having lasted `elapsed_ns`, with probability at least `confidence`:
//   P(D ≥ elapsed + r | D > elapsed) ≥ confidence,
// i.e. elapsed + r = Q(1 − confidence·(1 − F(elapsed))) with F and Q the
// distribution and quantile functions, both rounded to the grid in the
// conservative direction (r is never longer than the grid can vouch for; the
// claim holds on the measured durations themselves). A grid point at 0 is
// a lower tail nothing vouches for, not time the window outlived: it makes
// no claim at the open (0). The claim at the open is computed at
// max(confidence, q.claim_confidence) and stands however long the window
// lasted; the claims conditional on the elapsed time at no more than
// 1 − (1 − confidence)/2, and, while fewer than c/(1 − c) measured windows
// outlived `elapsed_ns`, at most (1 − c)/c · elapsed_ns past the claim at
// the open (a reader that reads again is told of the rest as it comes;
// docs/telemetry.md). 0 when the window already lasted longer than anything
// measured; -1 when nothing was measured (q.samples == 0).
// REQUIRES: 0 ≤ confidence ≤ 1.
OMNI_EXPORT int64_t RemainingGivenElapsed(const DurationQuantiles& q, int64_t elapsed_ns,
                                          double confidence);

enum class WindowState : uint8_t {
  kNone = 0,    // no idle phase was entered yet
  kOpen = 1,    // the devices are idle now
  kClosed = 2,  // the last window has closed: busy again
};
OMNI_EXPORT const char* WindowStateName(WindowState state);  // "none", "open", "closed"

// The fewest measured windows from which a claim at `confidence` holds for a
// new window without further assumptions: ceil(1 / (1 - confidence)), so that
// the 1 - confidence tail holds at least one measured window (20 at 0.95).
OMNI_EXPORT int64_t MinWindowSamples(double confidence);

// Per phase (index = PhaseId; kBetweenStepsPhase: the gaps between steps)
// and window ordinal, the window durations' quantiles.
using WindowQuantileTable =
    std::array<std::array<DurationQuantiles, kMaxWindowOrdinals>, kNoticePhases>;

struct WindowNotice {
  uint64_t sequence = 0;  // notices written so far (each open and each close)
  WindowState state = WindowState::kNone;
  PhaseId phase = 0;
  std::string phase_name;  // "" until the worker published the phase names
  IdleKind kind = IdleKind::kNone;
  int64_t step = -1;
  int ordinal = 0;  // which window of the phase in the step (0 = first)
  // The window is the gap before `step`, between steps (phase
  // kBetweenStepsPhase, phase_name "", kind host_side).
  bool before_step = false;
  int64_t opened_ns = 0;  // writer's clock (CLOCK_MONOTONIC: comparable on one host)
  int64_t closed_ns = 0;  // 0 while open
  // Filled by the reader at `read_at_ns` (its clock) from the phase's
  // quantiles; -1 when not open or not yet measured.
  int64_t read_at_ns = 0;
  int64_t elapsed_ns = 0;
  double confidence = 0;             // the writer's stated confidence
  int64_t remaining_ns = -1;         // at `confidence` (RemainingGivenElapsed)
  int64_t remaining_median_ns = -1;  // at confidence 0.5
  int64_t phase_samples = 0;         // window durations the quantiles come from
  // The guaranteed length the host's latest outlook claims for this window
  // (WindowOutlook::GuaranteedFor; 0: none): the forecast's, scaled by how
  // such claims fared, so that the longer of it and the table's claim holds
  // at `confidence` (docs/telemetry.md). While it has not elapsed,
  // remaining_ns is at least what is left of it.
  int64_t forecast_guaranteed_ns = 0;
  bool writer_closed = false;  // the writer has shut down; no more notices
};

// ---- the host's outlook: when can its next window of a kind start?
//
// Besides the live notices, the telemetry worker writes into the channel,
// with every forecast it publishes, the next window of each idle kind that
// the forecast lists (the earliest and latest time it can start, how long it
// lasts once started) or that it lists none within the forecast's horizon;
// and a host that knows it enters a long stretch without idle time says so
// with Telemetry::AnnounceBusy. A guest that waits for a window of its kinds
// reads it to decide whether waiting is worth it (omni/colocate_guest.h,
// GuestLoopOptions::max_wait).

// What the host's latest forecast says about one idle kind.
enum class KindOutlook : uint8_t {
  // Nothing: the forecast's model has not seen a window of this kind in the
  // steps it learned from (never, or before its history or regime), so the
  // absence of such windows in the forecast means nothing.
  kUnknown = 0,
  kNext = 1,  // the forecast lists a window of this kind: `next` (NextIdleWindow)
  // The model learned from steps with windows of this kind and lists none
  // within the horizon (none expected, or none it can claim: a guaranteed
  // length below the forecast's min_window).
  kNone = 2,
};
OMNI_EXPORT const char* KindOutlookName(KindOutlook o);  // "unknown", "next", "none"

struct NextIdleWindow {
  KindOutlook outlook = KindOutlook::kUnknown;
  int64_t windows = 0;  // windows of this kind the forecast lists within its horizon
  // The first of them (by earliest start; kNext only), as IdleWindow states it.
  int64_t earliest_start_ns = 0;
  int64_t latest_start_ns = 0;
  int64_t guaranteed_ns = 0;
  int64_t expected_ns = 0;
  int64_t step = -1;
  // The last step in which the host had a window of this kind (-1: none
  // yet), whatever the forecast.
  int64_t last_seen_step = -1;
};

// A window of the host's forecast as a live notice finds it: the window
// of `kind` that opens as window `ordinal` of `phase` in `step` lasts at
// least guaranteed_ns from its open (IdleWindow::guaranteed_ns; in the
// channel scaled so that a notice's claim holds at the stated confidence).
// The gap before `step` (IdleWindow::before_step) is phase
// kBetweenStepsPhase, ordinal 0.
struct ForecastClaim {
  int64_t step = -1;
  int64_t guaranteed_ns = 0;
  PhaseId phase = 0;
  IdleKind kind = IdleKind::kNone;
  int ordinal = 0;
};
// The forecast windows an outlook carries for the notices: the first ones
// the forecast lists, in its order (covering the steps until the next
// forecast is published, TelemetryOptions::publish_interval_ns, unless the
// steps are very short or have many windows).
inline constexpr int kMaxForecastClaims = 64;

enum class OutlookState : uint8_t {
  kNone = 0,      // no forecast yet (or forecasting is off)
  kForecast = 1,  // from the forecast made at made_at_ns
  // The host has no forecast now (a regime change, or a forecast without any
  // window: the model suspends windows after a step far outside its bound);
  // the earlier one is void.
  kWithdrawn = 2,
};
OMNI_EXPORT const char* OutlookStateName(OutlookState s);  // "none", "forecast", "withdrawn"

struct OMNI_EXPORT WindowOutlook {
  uint64_t sequence = 0;  // outlooks written (each forecast, withdrawal and announcement)
  OutlookState state = OutlookState::kNone;
  // The forecast's (kForecast): when it was made (the writer's clock), its
  // horizon, and the time up to which its list of windows is complete:
  // made_at + horizon, earlier when the list was cut at max_windows.
  int64_t made_at_ns = 0;
  int64_t horizon_ns = 0;
  int64_t covered_until_ns = 0;
  double confidence = 0;  // the forecast's stated confidence
  int64_t last_step = -1;
  // Telemetry::AnnounceBusy: no window of any kind before this time (0: none
  // announced), and when it was announced.
  int64_t busy_until_ns = 0;
  int64_t busy_announced_ns = 0;
  std::array<NextIdleWindow, kNumIdleKinds> next{};  // index: IdleKind (kNone unused)
  // The forecast's windows a notice can be matched to (kForecast only).
  std::array<ForecastClaim, kMaxForecastClaims> claims{};
  int num_claims = 0;
  bool writer_closed = false;
  // When the worker published this copy to its sinks (the writer's clock):
  // a reader on another host maps the writer's times to its own clock from
  // it (ShiftedBy). 0 in the channel, whose readers share the writer's clock.
  int64_t published_ns = 0;

  // The earliest time a window of one of `kinds` (a bit per IdleKind: 1 <<
  // kind) can start, as the host states it: the later of the announced busy
  // period and, from a forecast, the earliest of the kinds' next windows'
  // earliest starts (covered_until for a kind with none listed). 0 when the
  // host states nothing for these kinds: no forecast, a withdrawn one, a
  // kind it knows nothing about (KindOutlook::kUnknown), and no busy period
  // announced. May be in the past (a window may be due now).
  int64_t NoWindowBeforeNs(uint32_t kinds) const;

  // The guaranteed length of the forecast's window that opens as window
  // `ordinal` of `phase` (an idle phase of `kind`) in `step`: 0 when the
  // outlook is not a forecast or lists no such window.
  int64_t GuaranteedFor(int64_t step, PhaseId phase, IdleKind kind, int ordinal) const;

  // The same outlook with every time on the clock (made_at, covered_until,
  // busy_until, busy_announced, published, the next windows' starts) moved
  // by `delta_ns`: from the writer's clock to a reader's (0 stays 0).
  WindowOutlook ShiftedBy(int64_t delta_ns) const;
};

// The outlook of `forecast` (state kForecast). `max_windows`: the forecast's
// ForecastOptions::max_windows (a list that long was cut: covered_until is
// then the earliest start of the last step it reached). `last_seen_step`:
// per IdleKind the last step with a window of that kind (-1: none);
// a kind is kUnknown unless that step is one the forecast's model learned
// from (after last_step - steps_observed). A forecast without any window is
// kWithdrawn (see OutlookState).
// `catalog` (may be null: no claims): the phases the windows' names refer
// to. The claims are the forecast's first kMaxForecastClaims windows with a
// guaranteed length that are a gap before a step (phase kBetweenStepsPhase)
// or whose phase the catalog names with the window's kind,
// except where a step lists windows of one kind in several phases (the
// forecast counts a step's windows per kind, the notices per phase: their
// ordinals could then name different windows).
OMNI_EXPORT WindowOutlook OutlookOf(const Forecast& forecast, int max_windows,
                                    const std::array<int64_t, kNumIdleKinds>& last_seen_step,
                                    const PhaseCatalog* catalog = nullptr);

// Versioned JSON (schema "omni.outlook", version 2; docs/telemetry.md): what
// a store sink writes under <prefix>/outlook for guests on other hosts. The
// claims of gaps between steps go in "gap_claims" (step and guaranteed_ns),
// which a reader that predates them ignores.
OMNI_EXPORT std::string WindowOutlookToJson(const WindowOutlook& outlook);
// InvalidArgument naming the field for malformed input (a missing or
// mistyped field, an unknown state, a negative horizon or count);
// FailedPrecondition for another schema or a newer version. Kinds this
// version does not know (a newer writer's) are skipped.
OMNI_EXPORT absl::StatusOr<WindowOutlook> WindowOutlookFromJson(const std::string& json);

// Versioned JSON (schema "omni.window", version 1; docs/telemetry.md).
OMNI_EXPORT std::string WindowNoticeToJson(const WindowNotice& notice);
// InvalidArgument naming the field for malformed input; FailedPrecondition for
// another schema or a newer version.
OMNI_EXPORT absl::StatusOr<WindowNotice> WindowNoticeFromJson(const std::string& json);

class OMNI_EXPORT WindowChannelWriter {
 public:
  // Creates the shared-memory channel `name` (1..100 characters of
  // [A-Za-z0-9_.-]), replacing one left by a writer that closed or died.
  // Errors: InvalidArgument naming a bad name or a confidence outside
  // (0, 1); AlreadyExists naming the channel and the pid of a running writer
  // that still owns it; the OS error naming the object when it cannot be
  // created or mapped.
  static absl::StatusOr<std::unique_ptr<WindowChannelWriter>> Create(const std::string& name,
                                                                     double confidence = 0.95);
  // The same record in this process's memory only (no reader elsewhere can
  // see it; Telemetry uses it when no channel is named).
  static std::unique_ptr<WindowChannelWriter> CreateInProcess(double confidence = 0.95);
  virtual ~WindowChannelWriter() = default;  // marks the channel closed, unlinks it

  // Training thread: allocation-, lock- and I/O-free. `ordinal`: which
  // window of `phase` in the step this is (0 = first); `phase` a catalog's
  // or kBetweenStepsPhase (the gap before `step`).
  virtual void OpenWindow(PhaseId phase, IdleKind kind, int64_t step, int ordinal,
                          int64_t now_ns) = 0;
  void OpenWindow(PhaseId phase, IdleKind kind, int64_t step, int64_t now_ns) {
    OpenWindow(phase, kind, step, 0, now_ns);
  }
  virtual void CloseWindow(int64_t now_ns) = 0;

  // Worker thread: each phase's name and, per window ordinal, the window
  // duration quantiles (quantiles[kBetweenStepsPhase][0]: the gaps between
  // steps'). May allocate.
  virtual void PublishWindowQuantiles(const PhaseCatalog& catalog,
                                      const WindowQuantileTable& quantiles) = 0;
  // The same with one table per phase for every ordinal (no gap table).
  void PublishPhases(const PhaseCatalog& catalog,
                     const std::array<DurationQuantiles, kMaxPhases>& quantiles);

  // The host's outlook (everything but sequence and writer_closed, which the
  // writer keeps). Any thread, one at a time (Telemetry serialises the
  // worker's forecasts and AnnounceBusy). Allocation- and lock-free.
  virtual void PublishOutlook(const WindowOutlook& outlook) = 0;

  // Tells readers that no notice will follow (WindowNotice::writer_closed).
  // Any thread; idempotent. The destructor does it too.
  virtual void MarkClosed() = 0;

  // The current notice, as a reader at `now_ns` on the writer's clock sees it.
  virtual WindowNotice Latest(int64_t now_ns) const = 0;
  // "" for an in-process channel.
  virtual const std::string& name() const = 0;
};

class OMNI_EXPORT WindowChannelReader {
 public:
  // Maps the channel `name` read-only. A channel its writer is creating
  // (the object exists, its header is not written yet) is waited for, for
  // real, up to 200 ms. Errors: InvalidArgument for a bad name; NotFound
  // naming the channel when no writer created it; FailedPrecondition naming
  // it when it is corrupt (size or magic), of another schema version
  // (stating both versions), or still not initialised after the wait (its
  // writer died while creating it).
  static absl::StatusOr<std::unique_ptr<WindowChannelReader>> Open(
      const std::string& name, const Clock* clock = Clock::Real());
  virtual ~WindowChannelReader() = default;

  // The current notice (a consistent copy; a read overlapping a write is
  // retried). Unavailable when the writer stayed mid-write for 10,000
  // retries (it died while writing). A few tens of nanoseconds when no write
  // overlaps, plus, while a window is open, a scan of the outlook's forecast
  // claims (up to kMaxForecastClaims).
  virtual absl::StatusOr<WindowNotice> Read() = 0;
  // Polls every `poll` until the notice's sequence differs from the last one
  // this reader returned (from Read or WaitForChange), then returns it.
  // DeadlineExceeded after `timeout` (a timeout <= 0 checks once);
  // Unavailable as Read. Time is measured on the reader's clock; the polls
  // sleep for real.
  virtual absl::StatusOr<WindowNotice> WaitForChange(
      absl::Duration timeout, absl::Duration poll = absl::Microseconds(50)) = 0;
  // The host's latest outlook (a consistent copy). Unlike the other methods
  // it may be called from any thread, concurrently with them. Unavailable as
  // Read.
  virtual absl::StatusOr<WindowOutlook> ReadOutlook() const = 0;
};

}  // namespace omni
