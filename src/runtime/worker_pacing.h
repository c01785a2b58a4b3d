// When the telemetry worker looks at the ring of completed steps again.
// Private to omni_core (telemetry.cc).
//
// The worker has nothing to do until a step ends. Polling every
// TelemetryOptions::worker_poll (2 ms) wakes it ~25 times in a 50 ms step,
// each wake-up taking a core from whatever runs there (a co-located guest,
// the job's own threads). So once it has seen a few steps it sleeps until
// shortly before the next step can end at the earliest (the end of the last
// step plus 90% of the shortest of the recent steps, or of the forecast's
// lower bound for the next step when that is longer: an eval step is slept
// through), then polls again. A step's end is still picked up within a
// poll, and the worker wakes a few times per step. It polls all the time
// while a sink is attached (sinks forward live window notices and outlooks
// to other hosts as they happen) and until kPacingSteps steps were seen.
// Flush and shutdown wake it at once whatever the wait.
//
// Thread safety: one owner (the worker thread).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "absl/time/time.h"

namespace omni::internal {

class WorkerPacing {
 public:
  // Steps seen before the worker sleeps between them (the shortest of these
  // bounds the sleep).
  static constexpr int kPacingSteps = 16;
  // The longest sleep (long steps: the worker still looks this often).
  static constexpr absl::Duration kMaxSleep = absl::Milliseconds(100);

  // A completed step taken from the ring (clock nanoseconds).
  void Note(int64_t start_ns, int64_t end_ns) {
    recent_[static_cast<size_t>(seen_ % kPacingSteps)] = end_ns - start_ns;
    ++seen_;
    last_end_ns_ = std::max(last_end_ns_, end_ns);
  }

  // The lower end of the next step's duration bound (the forecaster's, after
  // the steps taken from the ring; 0 = none).
  void ExpectNext(int64_t lo_ns) { next_lo_ns_ = lo_ns; }

  // How long to wait at `now_ns` (the steps' clock): `poll` while `prompt`
  // (sinks attached) or fewer than kPacingSteps steps were seen; else until
  // 90% of the next step's shortest expected length after the last step's
  // end (the longer of the shortest recent step and the next step's lower
  // bound), within [poll, max(poll, kMaxSleep)].
  absl::Duration Next(int64_t now_ns, absl::Duration poll, bool prompt) const {
    if (prompt || seen_ < kPacingSteps) return poll;
    const int64_t shortest =
        std::max(*std::min_element(recent_.begin(), recent_.end()), next_lo_ns_);
    const int64_t due = last_end_ns_ + shortest / 10 * 9;
    return std::clamp(absl::Nanoseconds(due - now_ns), poll, std::max(poll, kMaxSleep));
  }

 private:
  std::array<int64_t, kPacingSteps> recent_{};
  int64_t seen_ = 0;
  int64_t last_end_ns_ = 0;
  int64_t next_lo_ns_ = 0;
};

}  // namespace omni::internal
