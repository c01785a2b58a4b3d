#include "runtime/wall_clock.h"

#include <algorithm>
#include <limits>

namespace omni {

int64_t WallClockRule::Anchor(const TimedOccurrence& o) const {
  switch (check) {
    case WallClockCheck::kStepStart:
      return o.start_ns;
    case WallClockCheck::kWorkEnd:
      return o.event_a_ns;
    case WallClockCheck::kEventEnd:
      return o.event_b_ns;
  }
  return o.start_ns;
}

int64_t WallClockRule::QuietCheck(int64_t start_ns, int64_t end_ns) const {
  return check == WallClockCheck::kStepStart ? start_ns : end_ns;
}

int64_t WallClockRule::EventCheck(const TimedOccurrence& o) const {
  return check == WallClockCheck::kStepStart ? o.start_ns : o.event_a_ns;
}

namespace {

// The rule of occurrences occ[first, n) under `check`, or none.
WallClockRule Fit(const std::deque<TimedOccurrence>& occ, size_t first, WallClockCheck check,
                  int64_t tol_ns) {
  const size_t n = occ.size();
  WallClockRule r;
  r.check = check;
  r.t_hi = std::numeric_limits<int64_t>::max();
  for (size_t i = first + 1; i < n; ++i) {
    r.t_hi = std::min(r.t_hi, r.EventCheck(occ[i]) - r.Anchor(occ[i - 1]));
  }
  if (r.t_hi <= 0) return {};
  r.t_lo = std::numeric_limits<int64_t>::min();
  int lower = 0;
  for (size_t i = first + 1; i < n; ++i) {
    const TimedOccurrence& o = occ[i];
    if (o.quiet_step < 0) continue;
    const int64_t anchor = r.Anchor(occ[i - 1]);
    const bool one_period = o.all_logged || static_cast<double>(r.EventCheck(o) - anchor) <
                                                kWallClockSkipFactor * static_cast<double>(r.t_hi);
    if (!one_period) {
      ++r.skips;
      continue;
    }
    r.t_lo = std::max(r.t_lo, r.QuietCheck(o.quiet_start_ns, o.quiet_end_ns) - anchor);
    ++lower;
  }
  if (lower < kMinWallClockLower || r.t_lo >= r.t_hi + tol_ns) return {};
  r.pairs = static_cast<int>(n - first - 1);
  return r;
}

}  // namespace

WallClockRule LearnWallClock(const std::deque<TimedOccurrence>& occ, WallClockCheck check,
                             int64_t tol_ns, bool latest_run) {
  const size_t n = occ.size();
  if (n < static_cast<size_t>(kMinWallClockPairs) + 1) return {};
  size_t first = n - std::min(n, static_cast<size_t>(kMaxWallClockPairs) + 1);
  for (size_t i = first + 1; i < n; ++i) {
    if (occ[i].step - occ[i - 1].step < kMinWallClockSpacing) return {};
  }
  if (!latest_run) return Fit(occ, first, check, tol_ns);
  for (; first + static_cast<size_t>(kMinWallClockPairs) + 1 <= n; ++first) {
    const WallClockRule r = Fit(occ, first, check, tol_ns);
    if (r.valid()) return r;
  }
  return {};
}

}  // namespace omni
