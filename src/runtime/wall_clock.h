// Events by wall time: a checkpoint every 20 s, an eval every 10 minutes.
// The job checks a timer once per step and runs the event at the first step
// whose check comes at least T after the timer last restarted, so the
// spacing in steps wanders with the steps' durations (85, 85, 84, 86 steps)
// and no step rule (SpacingRule) holds for long. Private to omni_core.
//
// Thread safety: pure functions and plain values.
#pragma once

#include <cstdint>
#include <deque>

namespace omni {

// What a log shows of one occurrence, and of the step logged last before it
// after the occurrence before.
struct TimedOccurrence {
  int64_t step = 0;
  int64_t start_ns = 0;                    // its step's start
  int64_t event_a_ns = 0, event_b_ns = 0;  // the event's span in its step
  // The step logged last before it, after the occurrence before (-1: none,
  // the two are consecutive logged steps): its start and end.
  int64_t quiet_step = -1, quiet_start_ns = 0, quiet_end_ns = 0;
  // Every step between the occurrence before and this one is logged (so
  // no occurrence can hide between them).
  bool all_logged = false;
};

// Where a job checks its timer, and where the timer restarts.
enum class WallClockCheck : uint8_t {
  // At each step's start; the timer restarts at the event step's start.
  kStepStart,
  // When a step's training work ends (the event's start in its step, the
  // step's end in the others); the timer restarts there.
  kWorkEnd,
  // There too; the timer restarts when the event ends (time since the
  // last save finished).
  kEventEnd,
};
inline constexpr int kNumWallClockChecks = 3;

// The rule behind the last occurrences: under `check`, the event comes at
// the first step whose check time is at least T after the last
// occurrence's anchor, with T in (t_lo, t_hi]. Learned from consecutive
// occurrences: each pair bounds T from above (the later one came) and from
// below (the step logged last before it did not). None when pairs == 0.
// With `lag` > 0 (declared only: PeriodicEvent::wall_lag_steps) the event
// comes `lag` steps after that first step.
struct WallClockRule {
  int64_t t_lo = 0, t_hi = 0;
  int pairs = 0;
  // Of the pairs, those far enough apart to span an occurrence the log does
  // not show (steps not logged between them): the rule holds only if there
  // was one.
  int skips = 0;
  int64_t lag = 0;
  WallClockCheck check = WallClockCheck::kStepStart;
  bool valid() const { return pairs > 0; }
  // Where the timer restarted at occurrence `o`.
  int64_t Anchor(const TimedOccurrence& o) const;
  // The check time of a logged step without the event.
  int64_t QuietCheck(int64_t start_ns, int64_t end_ns) const;
  // The check time of occurrence `o`.
  int64_t EventCheck(const TimedOccurrence& o) const;
};

// Pairs of occurrences a rule needs (kMinWallClockLower of them bounding T
// from below), and the most it is learned from (the latest).
inline constexpr int kMinWallClockPairs = 3;
inline constexpr int kMinWallClockLower = 2;
inline constexpr int kMaxWallClockPairs = 8;

// The rule behind `occ` (ascending steps, consecutive logged occurrences)
// under `check`: its bounds on T must agree (t_lo < t_hi + tol_ns: `tol_ns`
// allows for a check a little off the logged times) over the last
// kMaxWallClockPairs + 1 occurrences, or with `latest_run` over the longest
// run of them that ends with the last (after the job's period changed: the
// pairs since; a caller asks for it when no check fits the whole), of
// kMinWallClockPairs pairs at least, every pair at least
// kMinWallClockSpacing steps apart (a rare event, not a phase of most
// steps). A pair with steps not logged between them may span an occurrence
// the log does not show: its lower bound counts only when its spacing is
// below kWallClockSkipFactor × t_hi (then it cannot hold two). Otherwise
// none. Steps of ~200 ms and saves with 5 % noise leave two or three checks
// agreeing over 8 pairs as often as not (the checks differ by a step's work
// or a save's length, whose noise seldom ends the agreement in so few
// pairs), so a caller asks each check and claims only what all that agree
// say.
inline constexpr int64_t kMinWallClockSpacing = 8;
inline constexpr double kWallClockSkipFactor = 1.5;
WallClockRule LearnWallClock(const std::deque<TimedOccurrence>& occ, WallClockCheck check,
                             int64_t tol_ns, bool latest_run = false);

}  // namespace omni
