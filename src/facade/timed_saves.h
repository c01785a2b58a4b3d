// The Runtime's checkpoints by wall time (private; RuntimeOptions::
// ckpt_every_time): a save at the first step boundary at which the interval
// has passed, on the Runtime's clock, since the boundary of the last one
// that succeeded (since Start at first), as PyTorch Lightning's
// `train_time_interval`.
//
// In an elastic group the replicas' clocks and boundaries differ, and they
// must save at one boundary (a job-level save is collective). The first
// replica whose interval has passed proposes the boundary after the next
// step under key "<k>" of the generation's prefix (the k-th timed save of
// that generation, created once by compare-and-set: the first proposal
// wins); every replica reads that key at each boundary and saves there. A
// replica may be a boundary ahead of the proposer, never two (the step's
// collective waits for it), so the next boundary is one all replicas still
// reach. A change of generation drops a proposal not yet reached; the
// proposer's interval is still past, and it proposes again in the new one.
//
// Thread safety: used by the Runtime's training thread only.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/store.h"

namespace omni::internal {

// One replica's interval.
class SaveTimer {
 public:
  SaveTimer(absl::Duration every, const Clock* clock)
      : every_ns_(absl::ToInt64Nanoseconds(every)), clock_(clock), since_ns_(clock->NowNanos()) {}
  // The interval counts from `now_ns` (the boundary of a save).
  void RestartAt(int64_t now_ns) { since_ns_ = now_ns; }
  // Whether the interval has passed.
  bool Due() const { return clock_->NowNanos() - since_ns_ >= every_ns_; }

 private:
  int64_t every_ns_;
  const Clock* clock_;
  int64_t since_ns_;
};

// The replicas' agreement on the boundaries of timed saves in one
// generation; `store` is the generation's prefix for it (not owned).
class SaveAgreement {
 public:
  explicit SaveAgreement(Store& store) : store_(store) {}
  // At the boundary after step `step`: whether the replicas save here.
  // `due`: this replica's interval has passed (it proposes step + 1 when no
  // proposal is pending). Store errors as the store returns them (an
  // answer is idempotent: retry it); InvalidArgument naming the key for a
  // malformed record; Internal when this replica is past the agreed
  // boundary (the replicas are not in lockstep).
  absl::StatusOr<bool> AtBoundary(int64_t step, bool due);

 private:
  Store& store_;
  int64_t index_ = 0;    // the timed saves of this generation so far
  int64_t agreed_ = -1;  // the pending one's step; -1: none read yet
};

}  // namespace omni::internal
