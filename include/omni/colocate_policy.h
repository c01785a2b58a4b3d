// Co-location policy: who may use which devices when, and how a job is told
// to give them back. One code path for the demo and the cluster simulator
// (benchmarks/cluster_sim.cc): every decision is a pure function of plain
// inputs and the policy's Clock, so a simulator drives it with a FakeClock set
// to simulated time and unit tests check every rule without sleeping.
//
// The rules:
//  1. Classes. A critical job's progress is protected: outside its forecast
//     idle windows its devices are reserved (only it runs); a regular job may
//     be slowed or preempted and resumes after yielding; a best-effort job is
//     reclaimable at any time.
//  2. Reserved windows from forecasts. An idle window of a critical job is
//     lent (a Lease) only when stated at min_confidence or more, and only for
//     the part that is idle whatever the actual start: before the window opens
//     [start_latest, start_earliest + guaranteed − guard); once a live notice
//     says it opened at t, [t, t + guaranteed − guard).
//  3. "Stand up before your station": a job that must leave before a
//     reservation begins is told early enough that one more step and its save
//     still finish before it: send at
//       deadline − (next_step + save)·(1 + slack),  deadline = start − guard,
//     from the same next-step and save bounds the preemption monitor uses.
//  4. Notice kinds. kByDeadline ("leave by T": the job uses the grace for
//     progress, then saves — the monitor's default behaviour for a SIGTERM
//     or {"yield_in_s": S}) when the devices are wanted later than the job
//     needs for a step and a save; kAsapWithSave ("save at your next step
//     boundary, then leave") when they are wanted now and the save fits in
//     max_save_wait; kNowWithoutSave ({"yield_in_s": 0}) when even a save
//     would keep the waiting job too long.
//  5. Anti-starvation and victim choice. A regular job runs at least min_run
//     continuously before it may be preempted (best-effort jobs at any time,
//     critical jobs never). Best-effort jobs are reclaimed before regular
//     ones; within a class, the victims are those that lose the least work:
//     device-time of work that would be
//     redone (nothing when the notice lets it finish its step and save, else
//     all the work since its last checkpoint); ties go to the job with less
//     work since its last checkpoint, then to the lower id. One job that
//     frees enough alone is taken instead of several when it is of no higher
//     class and loses less.
//
// Times are nanoseconds on the policy's clock (a monotonic time line; see
// omni/clock.h). Durations are upper bounds at the caller's confidence.
//
// Thread safety: a Policy is immutable after Create; its methods are const and
// may be called from any thread, as long as the Clock may.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/export.h"

namespace omni::colocate {

enum class JobClass : uint8_t { kCritical = 0, kRegular = 1, kBestEffort = 2 };

// "critical", "regular", "best_effort".
OMNI_EXPORT const char* JobClassName(JobClass c);

// One forecast idle window of a critical job, as the forecaster publishes it
// (an adapter copies the forecaster's window into this plain struct): the
// window opens at some time in [start_earliest_ns, start_latest_ns] and, with
// probability `confidence`, lasts at least guaranteed_ns (expected_ns on
// average).
struct IdleWindowForecast {
  int64_t start_earliest_ns = 0;
  int64_t start_latest_ns = 0;
  int64_t guaranteed_ns = 0;
  int64_t expected_ns = 0;
  double confidence = 0;
};

// Upper bounds (at the caller's confidence) of a yielding job's next step (or
// unit of work) and of a durable save, e.g. mean + k·stddev as the preemption
// monitor takes them.
struct YieldBounds {
  int64_t next_step_ns = 0;
  int64_t save_ns = 0;
};

// A lendable interval [open_ns, close_ns) of a critical job's devices.
struct Lease {
  int64_t open_ns = 0;
  int64_t close_ns = 0;
  int64_t duration_ns() const { return close_ns - open_ns; }
};

enum class NoticeKind : uint8_t {
  kByDeadline = 0,      // leave by deadline_ns, using the time for progress, with a save
  kAsapWithSave = 1,    // save at the next step boundary, then leave
  kNowWithoutSave = 2,  // leave now, without a save ({"yield_in_s": 0})
};

// "by_deadline", "asap_with_save", "now_without_save".
OMNI_EXPORT const char* NoticeKindName(NoticeKind k);

struct YieldNotice {
  NoticeKind kind = NoticeKind::kByDeadline;
  int64_t send_at_ns = 0;   // deliver the notice at (or before) this time
  int64_t deadline_ns = 0;  // the devices are free by then
  std::string reason;       // for the log
};

// What the policy needs to know of a running job to preempt it.
struct JobView {
  uint64_t id = 0;
  JobClass job_class = JobClass::kRegular;
  int devices = 1;
  int64_t running_since_ns = 0;    // start of the current continuous run
  int64_t last_checkpoint_ns = 0;  // end of its last durable save in this run (or its start)
  YieldBounds bounds;
};

struct Victims {
  std::vector<uint64_t> ids;         // in the order chosen
  int devices = 0;                   // devices they free
  int64_t lost_device_ns = 0;        // device-time of work to redo (see rule 5)
  std::vector<YieldNotice> notices;  // one per id, same order
};

struct PolicyOptions {
  // Rule 5: a regular job runs at least this long continuously before it may
  // be preempted.
  absl::Duration min_run = absl::Hours(2);
  // Rule 2: windows stated at a lower confidence are not lent.
  double min_confidence = 0.9;
  // Rules 2 and 3: margin between a guest's deadline and the reservation.
  absl::Duration guard = absl::Milliseconds(5);
  // Rule 3: as PreemptionOptions::slack.
  double slack = 0.5;
  // Rule 4: the longest a waiting critical job waits for a victim's save
  // (longer saves: kNowWithoutSave).
  absl::Duration max_save_wait = absl::Minutes(10);
};

class OMNI_EXPORT Policy {
 public:
  // InvalidArgument naming the field for a null clock, a negative min_run,
  // guard or max_save_wait, a min_confidence outside [0, 1], or a negative or
  // non-finite slack.
  static absl::StatusOr<std::unique_ptr<Policy>> Create(const PolicyOptions& options,
                                                        const Clock* clock = Clock::Real());

  const PolicyOptions& options() const { return options_; }

  // Rule 2. The part of `window` that may be lent to guests, or nullopt when
  // nothing may (confidence below min_confidence, nothing left after the
  // guard, or the window already over at `now`). `opened_at_ns` is the time a
  // live notice said the window opened (nullopt: not yet). The lease never
  // starts before now.
  std::optional<Lease> LeaseFor(const IdleWindowForecast& window,
                                std::optional<int64_t> opened_at_ns) const;

  // Rule 3. A job must be off the devices when a reservation begins at
  // `reservation_ns`; with `must_save` it leaves with a save (e.g. the host
  // announced a long busy period), else only its unit in flight finishes (a
  // best-effort guest gated per unit). kByDeadline; send_at is never before
  // now (when it would be, the reason says the notice is late).
  YieldNotice NoticeBeforeReservation(int64_t reservation_ns, const YieldBounds& bounds,
                                      bool must_save) const;

  // Rule 4. The notice for a job whose devices are wanted by `needed_by_ns`.
  YieldNotice NoticeForPreemption(const JobView& job, int64_t needed_by_ns) const;

  // Rule 5. May `job` be preempted now?
  bool Preemptible(const JobView& job) const;
  // The earliest time a job of `running` that is not preemptible now becomes
  // so (nullopt when none will: only critical jobs).
  std::optional<int64_t> NextPreemptible(const std::vector<JobView>& running) const;
  // The device-time of work `job` loses when preempted now for a need at
  // `needed_by_ns` (rule 5's measure).
  int64_t LostDeviceNs(const JobView& job, int64_t needed_by_ns) const;

  // Rule 5. Victims among `running` freeing at least `devices_needed` devices
  // for a job that needs them by `needed_by_ns`, with their notices.
  // ResourceExhausted saying how many devices are preemptible (and how many
  // wait for min_run) when not enough are; InvalidArgument for
  // devices_needed < 1.
  absl::StatusOr<Victims> ChooseVictims(const std::vector<JobView>& running, int devices_needed,
                                        int64_t needed_by_ns) const;

  Policy(const PolicyOptions& options, const Clock* clock);  // use Create

 private:
  // Rule 4's choice, without the reason; sets *step_and_save.
  NoticeKind KindFor(const JobView& job, int64_t needed_by_ns, int64_t* step_and_save) const;

  PolicyOptions options_;
  const Clock* clock_;
  int64_t min_run_ns_;
  int64_t guard_ns_;
  int64_t max_save_wait_ns_;
};

}  // namespace omni::colocate
