// The cluster simulator behind bench_cluster_sim (benchmarks/cluster_sim.cc):
// an event-driven model of a device pool running a trace of jobs under three
// policies, with the co-location policy and the guest gate of omni::colocate
// making the decisions of the third. docs/colocation.md describes the model,
// the generator and its sources, and the figures measured.
//
// Thread safety: functions only; no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/colocate_policy.h"

namespace omni::clustersim {

// ------------------------------------------------------------ step behaviour

// What a gated guest makes of one job's idle windows, from a step log in the
// runtime's own format (omni.steplog v1): the claims the runtime's live
// window notices made in each window (omni::Evaluate replays them, learned
// online from the windows before and matched to the forecast's windows, as
// omni eval scores them), with the forecasts' windows' own claims
// (ReplayOptions::use_forecasts), replayed through Policy::LeaseFor and
// GuestGate.
struct StepProfile {
  std::string name;             // the log's file name
  double idle_fraction = 0;     // idle-phase time (innermost-phase rule) / step time
  double harvest_fraction = 0;  // guest unit time inside the windows / idle time
  double host_slowdown = 0;     // guest overrun past a window's close / step time
  int64_t windows = 0;          // idle windows in the log
  int64_t guest_units = 0;
  int64_t deadline_misses = 0;
  double yield_p99_ms = 0;  // cooperative yields (unit end − early close)
};

struct ReplayOptions {
  // The confidence of the notices' claims (TelemetryOptions::
  // window_confidence) and the least the policy and the gate accept.
  double confidence = 0.95;
  int64_t guest_unit_ns = 5'000'000;  // the guest's unit of work
  int64_t guard_ns = 1'000'000;       // GateOptions::guard
  int64_t notice_latency_ns = 0;      // window open → the guest learns of it
  // The guest acts on the forecasts' windows as well as the notices (the
  // union omni eval scores as "a guest acting on both"); false: the
  // notices' claims only.
  bool use_forecasts = true;
};

// Reads one step log (omni::ReadStepLog) and replays it. The reader's
// errors (InvalidArgument naming the file and line for a malformed line, the
// errno status naming the file when it cannot be read); InvalidArgument for
// a log of fewer than two steps; Evaluate's errors naming the file.
absl::StatusOr<StepProfile> ReplayStepLog(const std::string& path, const ReplayOptions& options);

// Every *.jsonl directly in `dir`, in name order. NotFound when none.
absl::StatusOr<std::vector<StepProfile>> LoadProfiles(const std::string& dir,
                                                      const ReplayOptions& options);

// ------------------------------------------------------------------ workload

// The job generator (see docs/colocation.md for the sources of the numbers).
struct WorkloadOptions {
  int devices = 10'000;
  double warmup_days = 7;  // arrivals before the measured window (≥ the longest run time, 6.9 d)
  double days = 7;         // the measured window
  uint64_t seed = 1;
  // Arrivals: Microsoft Philly (Jeon et al., USENIX ATC 2019; msr-fiddle/
  // philly-traces): 117,325 jobs submitted over 137 days (2017-08-07 to
  // 2017-12-22) on 2,490 GPUs (321 2-GPU + 231 8-GPU machines) = 0.344 jobs
  // per GPU per day, times load_factor: the released trace is a subset, and
  // with the sizes and run times below its rate offers 0.46 of the pool; 2.4
  // offers 1.10 (OfferedLoad), a saturated cluster with a queue, where the
  // policies differ (below 1.0 a 10,000-device pool never queues).
  double jobs_per_device_day = 117325.0 / 137.0 / 2490.0;
  double load_factor = 2.4;
  // Job classes (no public trace labels them; assumed).
  double critical_share = 0.10;
  double best_effort_share = 0.30;
};

struct JobSpec {
  uint64_t id = 0;
  double arrival_s = 0;
  int devices = 1;
  double work_s = 0;  // run time alone on its devices
  colocate::JobClass job_class = colocate::JobClass::kRegular;
  int profile = 0;  // index into the step profiles
};

// Sizes and durations: Gavel's (Narayanan et al., OSDI 2020) sampler of the
// Philly distribution: 1 device with probability 0.70, 2: 0.10, 4: 0.15,
// 8: 0.05; run time 60·10^U(1.5, 3) s with probability 0.8, else
// 60·10^U(3, 4) s. Arrivals Poisson. Deterministic for a seed.
std::vector<JobSpec> GenerateJobs(const WorkloadOptions& options, int num_profiles);

// Device-time offered per device-time of the pool by the generator's mean job
// (E[devices] = 1.9, E[run time] = 16.8 h).
double OfferedLoad(const WorkloadOptions& options);

// ---------------------------------------------------------------- simulation

enum class SimPolicy { kStatic, kKillRequeue, kColocate };
const char* SimPolicyName(SimPolicy p);

struct SimOptions {
  int devices = 10'000;
  double warmup_s = 7 * 86400.0;
  double window_s = 7 * 86400.0;
  // After the window, no arrivals are measured; the simulation runs on (at
  // most this long) so the jobs that arrived in the window complete.
  double drain_s = 10 * 86400.0;
  double checkpoint_period_s = 1800;  // periodic saves of regular/best-effort jobs
  double save_s = 60;                 // a save's duration (and its bound)
  double step_s = 1;                  // a step's duration (and its bound)
  int starve_preemptions = 3;         // a regular job preempted this often is starved
  colocate::PolicyOptions policy;     // kColocate's rules
};

struct SimResult {
  // The JSON figures.
  double utilization = 0;  // useful device-time (net of work redone) / capacity, in the window
  double critical_slowdown_pct = 0;  // mean (JCT − run time) / run time of critical jobs
  double regular_jct_h = 0;          // mean completion time of regular jobs
  double lost_work_h = 0;            // device-hours of work redone after preemptions
  int starved = 0;                   // regular jobs preempted starve_preemptions times or more
  // Accounting, over the window.
  double capacity_device_s = 0;      // devices × window
  double held_device_s = 0;          // ∫ devices held by owners dt
  double held_by_jobs_device_s = 0;  // Σ over jobs of devices × holding time (must equal held)
  double free_device_s = 0;          // ∫ free devices dt
  double useful_device_s = 0;
  double harvested_device_s = 0;         // guests' useful device-time in hosts' idle windows
  int64_t jobs_measured[3] = {0, 0, 0};  // arrived in the window, by class
  int64_t jobs_completed[3] = {0, 0, 0};
  int64_t preemptions = 0;
  int64_t guest_attaches = 0;
  int64_t events = 0;
};

// InvalidArgument for a job larger than the pool, a profile index out of
// range, or non-positive devices / window.
absl::StatusOr<SimResult> Simulate(const std::vector<JobSpec>& jobs,
                                   const std::vector<StepProfile>& profiles, SimPolicy policy,
                                   const SimOptions& options);

}  // namespace omni::clustersim
