// Graceful preemption: signals, scheduler notices and deadlines, acted upon
// at step boundaries only. Signal handlers only touch lock-free atomics (and
// read CLOCK_MONOTONIC, which is async-signal-safe).
//
// Time: every deadline is on the monitor's Clock. A signal's arrival is taken
// from the handler's CLOCK_MONOTONIC reading when that clock is Clock::Real();
// on any other clock (e.g. a FakeClock in tests) the arrival is the clock's
// reading at the first observation of the signal, by AtBoundary(), pending()
// or the watcher thread (every notice_poll), whichever looks first.
//
// Thread safety: AtBoundary is called by the training thread; Notice() and the
// accessors may be called from any thread.
#pragma once

#include <csignal>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/export.h"
#include "omni/store.h"

namespace omni {

// Exit codes of a job that stops because it was preempted.
inline constexpr int kExitPreempted = 75;        // saved a durable checkpoint: resumable
inline constexpr int kExitPreemptedNoSave = 76;  // could not save before the deadline

struct PreemptionOptions {
  // Signals that request preemption (Kubernetes: SIGTERM; Slurm --signal:
  // SIGUSR1; Ctrl-C: SIGINT). A second one escalates: save at the next
  // boundary.
  std::vector<int> signals = {SIGTERM, SIGUSR1, SIGINT};
  // A file a scheduler writes to ask for the devices back, JSON:
  //   {"deadline_unix_ms": 1764432000000}  or  {"yield_in_s": 30}
  // Checked by a watcher thread every notice_poll. Empty = none. The file is
  // written by an agent on the same host (write it atomically: temp + rename):
  // a wall-clock deadline is converted to the monitor's clock once, when a
  // new content is first read, and wall clocks are never compared across
  // hosts; yield_in_s counts from that read. A missing or empty file is no
  // notice; a malformed one is ignored and kept as last_notice_error(). When
  // several notices arrive (file contents, Notice()) the earliest deadline
  // holds: a notice cannot be withdrawn or extended.
  std::string notice_file;
  // A store key a scheduler writes, e.g. in the job's rendezvous store, with
  // the same JSON but only {"yield_in_s": S} (counted from when the
  // content is first read): a store is shared between hosts, and wall
  // clocks of different hosts are never compared, so deadline_unix_ms is
  // refused there (kept as last_notice_error()). Polled by the watcher
  // every notice_poll. The store is not owned and must outlive the monitor;
  // both or neither (InvalidArgument).
  Store* notice_store = nullptr;
  std::string notice_key;
  absl::Duration notice_poll = absl::Milliseconds(100);
  // Deadline after a signal when none is given (Kubernetes'
  // terminationGracePeriodSeconds defaults to 30 s).
  absl::Duration grace = absl::Seconds(30);
  // Step and save costs are taken as mean + k·stddev.
  double k = 2.0;
  // Another step is started only when (step + save) · (1 + slack) fits
  // before the deadline, so that a step slower than any seen so far (a
  // machine that just became busy) does not turn the save into a miss. The
  // steps given up are redone after the resume; nothing is lost.
  double slack = 0.5;
};

// Reads OMNI_PREEMPT_GRACE_S (seconds, a non-negative number) from the
// environment into options.grace, if set and not empty; read at every call,
// never cached. InvalidArgument naming the variable when malformed.
OMNI_EXPORT absl::Status ApplyEnvironment(PreemptionOptions& options);

// A duration estimate; it counts as mean_s + k·stddev_s (negative → 0, not
// finite → longer than any deadline).
struct Cost {
  double mean_s = 0;
  double stddev_s = 0;
};

enum class BoundaryAction {
  kContinue,         // no preemption pending, or time for another step + save
  kSaveAndExit,      // save now, then exit with kExitPreempted
  kExitWithoutSave,  // a save cannot finish before the deadline: exit with kExitPreemptedNoSave
};

struct BoundaryDecision {
  BoundaryAction action = BoundaryAction::kContinue;
  std::string reason;       // for the log: what was requested, deadline, costs
  int64_t deadline_ns = 0;  // 0 when no preemption is pending
};

class OMNI_EXPORT PreemptionMonitor {
 public:
  // Installs the signal handlers (sigaction with SA_RESTART; the previous
  // handlers are restored on destruction) and starts the watcher thread
  // (joined on destruction, which takes at most about one wake-up, not a
  // notice_poll). Only one monitor may exist per process (FailedPrecondition
  // otherwise). InvalidArgument for a null clock, a non-positive notice_poll,
  // a negative grace, a negative or non-finite k, or a signal that cannot be
  // caught (naming it).
  static absl::StatusOr<std::unique_ptr<PreemptionMonitor>> Create(
      const PreemptionOptions& options, const Clock* clock = Clock::Real());
  virtual ~PreemptionMonitor() = default;

  // At a step boundary: continue if no preemption is pending, or if one more
  // step and then a save still fit before the deadline (and no escalation);
  // otherwise save now if the save fits; otherwise exit without saving.
  // The deadline is the earliest of the notices' deadlines and the first
  // signal's arrival + grace. Escalated (a second signal): save now if the
  // save fits, else exit without saving. With nothing pending it returns
  // kContinue with an empty reason and allocates nothing.
  virtual BoundaryDecision AtBoundary(const Cost& next_step, const Cost& save) = 0;

  // A scheduler's notice through the API (a store key watcher calls this):
  // leave by `deadline_ns` on the monitor's clock.
  virtual void Notice(int64_t deadline_ns) = 0;
  // True once a signal or a notice has arrived (stays true).
  virtual bool pending() const = 0;
  // Signals of options.signals received since Create.
  virtual int signals_received() const = 0;
  // The last notice problem (malformed JSON, missing field, unreadable file
  // or store), naming the file or store key; OK when there was none. The
  // notice was ignored.
  virtual absl::Status last_notice_error() const = 0;
};

// Agreement of the ranks of a job on the boundary at which they all stop.
//
// Data-parallel ranks run in lockstep (every step ends with a collective), so
// at any time they are at most one boundary apart, and a rank that has read
// "no stop" at boundary k may already be in step k+1. The first rank whose
// local decision is to stop therefore proposes "stop at the boundary after
// step k+1" through the store (compare-and-set: the first proposal wins, with
// its action, save or exit without saving); every rank reads the agreement at
// each boundary and stops exactly there. Because the agreed stop comes one
// boundary after the first local decision, ask the local monitor with one
// extra step of lookahead (next_step cost doubled) so the deadline still
// holds.
//
// Thread safety: one coordinator per rank, used by its training thread.
class OMNI_EXPORT StopCoordinator {
 public:
  // `store` (not owned, must outlive this) is shared by the ranks of one job
  // and membership generation — use a prefix view, e.g. "job/gen-3/".
  explicit StopCoordinator(Store& store) : store_(store) {}

  // At the boundary after step `step` completed, with this rank's own
  // decision: kContinue until the agreed stop boundary, then the agreed
  // action (with the proposer's reason). Internal naming both steps when this
  // rank is already past the agreed stop (the ranks were not in lockstep);
  // store errors are returned as they are.
  absl::StatusOr<BoundaryDecision> AtBoundary(int64_t step, const BoundaryDecision& local);

  // The agreed stop step, once there is one (-1 before).
  int64_t agreed_step() const { return agreed_step_; }

 private:
  Store& store_;
  int64_t agreed_step_ = -1;
  BoundaryDecision agreed_;
};

}  // namespace omni
