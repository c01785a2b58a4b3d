// The one door: a Runtime owns everything a trainer needs from Omni —
// telemetry, the preemption monitor, the checkpoint manager, the store, the
// elastic group, stop coordination and the data sampler — and makes one
// decision per step boundary.
//
//   omni::RuntimeOptions o = omni::RuntimeOptions::FromEnvironment().value();
//   o.ckpt_dir = "/ckpt/job-7";            // explicit options win: set them after
//   auto rt = omni::Runtime::Create(o).value();
//   rt->Register("model", &model_state);   // replicated state
//   rt->Register("rng", &rng_state, omni::StateScope::kPerReplica);
//   for (int64_t step = rt->Start().value(); step < total; step = rt->step()) {
//     rt->BeginStep();
//     ... forward, backward;  if (rt->AllReduce(grads...).ok()) optimizer.step();
//     omni::Decision d = rt->EndStep().value();
//     if (d.kind == omni::Decision::kSaveAndExit) return d.exit_code;
//   }
//   rt->Finish();
//
// Boundary (EndStep), in this order:
//   1. a collective of this step failed (AllReduce returned an error): agree
//      on the survivors, rebuild, re-synchronise the state, and answer
//      kRedoStep — nothing of the step is committed (step() is unchanged,
//      unless a survivor had committed it or the group catches up, below);
//   2. otherwise commit: the sampler's cursor and step() advance, and the
//      OnCommit callbacks run (in the order they were added);
//   3. periodic checkpoint (ckpt_every, or ckpt_every_time by wall time),
//      asynchronous with async_ckpt;
//   4. elastic: a new generation takes effect here (kReconfigured, with the
//      state already re-synchronised), or this replica's graceful leave did;
//      after any change of generation (here, in step 1 and at Start), when
//      the group's state is older than the newest job-level checkpoint (its
//      holders gone, none restarted), every member loads that checkpoint
//      (step() moves to it; a stop then waits for the next boundary);
//   5. preemption pending: another step and a save still fit before the
//      deadline (costs from the telemetry)? With a group the replicas agree on
//      one stop boundary (job-wide), or, with leave_on_preempt, the preempted
//      replica leaves alone (refused when the others would be too few: then
//      the job stops); at the stop the state is saved and the decision is
//      kSaveAndExit with kExitPreempted, or kExitPreemptedNoSave when no save
//      fits any more.
//
// Environment: read only by RuntimeOptions::FromEnvironment, at the call,
// never cached.
//
// Thread safety: one training thread calls everything; step(), rank() and
// size() may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/checkpoint.h"
#include "omni/clock.h"
#include "omni/comm.h"
#include "omni/elastic.h"
#include "omni/export.h"
#include "omni/job_checkpoint.h"
#include "omni/preemption.h"
#include "omni/sampler.h"
#include "omni/state.h"
#include "omni/store.h"
#include "omni/telemetry.h"

namespace omni {

// Looks up an environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
// The process environment (getenv at each call).
OMNI_EXPORT std::optional<std::string> ProcessEnvironment(const char* name);

struct OMNI_EXPORT RuntimeOptions {
  // ---- identity
  std::string source = "omni";  // telemetry source; prefix of log lines
  // Recorded in checkpoints and the elastic group; a restore or a join of
  // another job's state is refused.
  std::string job_id;
  // Steps of the whole job: no periodic checkpoint is taken at the end
  // (0 = unknown: periodic checkpoints whenever due).
  int64_t total_steps = 0;
  // ---- launcher (torchrun RANK / WORLD_SIZE / LOCAL_RANK, Slurm
  // SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID). Without a group: the rank
  // and size reported by Decision and rank()/size(); with one, the group's.
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // ---- telemetry (telemetry.source is set from `source` when empty or
  // "omni")
  TelemetryOptions telemetry;
  std::string forecast_path;  // a forecast file sink; empty = none
  // A store sink (MakeStoreSink, omni/sinks.h) under this prefix of the
  // job's store: forecasts, window notices and the outlook for guests on
  // other hosts (colocate::StoreWindowSource). Needs a store; empty = none.
  std::string publish_prefix;
  // ---- checkpoints (off when ckpt_dir is empty). In elastic mode every
  // replica gives the same ckpt_dir: job-level checkpoints
  // (omni/job_checkpoint.h): replicated state written once, spread over the
  // replicas; per-replica state per replica; restorable at any replica
  // count. Replicas given directories of their own each save alone there.
  std::string ckpt_dir;
  // Periodic checkpoint every N steps (inside step N·k − 1; declared to the
  // forecaster as telemetry.forecast.checkpoint unless one is set); 0 = only
  // on preemption.
  int64_t ckpt_every = 0;
  // Periodic checkpoint by wall time: at the first step boundary at which
  // this long has passed on `clock` since the boundary of the last one that
  // succeeded (since Start at first), as PyTorch Lightning's
  // train_time_interval (an abandoned save is proposed again at once); zero
  // = off. Not with ckpt_every (InvalidArgument: one period). In an elastic
  // group the replicas agree on one boundary through the store: the first
  // whose interval has passed proposes the boundary after the next step,
  // where all of them save (a store read per boundary). It is declared to
  // the forecaster as telemetry.forecast.checkpoint.every_ns (unless an
  // event is declared there), in a group with wall_lag_steps 1 (the agreed
  // boundary is one step after the first due replica's).
  absl::Duration ckpt_every_time = absl::ZeroDuration();
  int keep_last = 3;
  bool async_ckpt = false;  // periodic checkpoints in the background (not in elastic mode)
  // A ckpt_dir that holds checkpoints of which none is valid makes Start()
  // fail naming each (a job never silently starts over); true starts fresh.
  bool start_fresh = false;
  std::map<std::string, std::string> ckpt_metadata;
  // ---- preemption. handle_preemption = false: no monitor (signals keep
  // their default action); this replica still stops where the others agree.
  // Only one process-wide monitor may exist (see PreemptionMonitor).
  bool handle_preemption = true;
  PreemptionOptions preemption;  // notice_store is set by the Runtime
  std::string notice_key;        // a notice key in the store (needs one)
  // ---- elastic data parallelism: on when `store` or `store_uri` is set.
  // tcp:// needs omni::torch_ext::RegisterTcpStore() first.
  std::string store_uri;
  Store* store = nullptr;  // not owned; must outlive the Runtime; wins over store_uri
  // membership.job_id is taken from job_id (else `source`) when empty,
  // membership.self.host from the host name when empty. A GPU trainer sets
  // elastic.backend = "nccl" and elastic.device to its CUDA device (e.g.
  // local_rank): no Gloo needed; the store carries the membership.
  ElasticOptions elastic;
  // A preempted replica leaves the group alone at the next boundary but one
  // while the others go on (instead of a job-wide stop).
  bool leave_on_preempt = false;
  // ---- data (no sampler when sampler.dataset_size == 0). Registered as
  // replicated state "data"; its cursor advances at every commit.
  SamplerOptions sampler;
  // ---- plumbing
  // Times everything the Runtime owns: telemetry, preemption deadlines and
  // the elastic group (its heartbeats, timeouts and waits: the Runtime sets
  // elastic.membership.clock to it; InvalidArgument when that is set to
  // another clock). On a FakeClock the group waits until the clock is moved
  // (omni/clock.h).
  const Clock* clock = Clock::Real();
  // Receives one line per event (joined, changed, recovered, preempted,
  // saved...). Default (empty): "<source>: <line>" on stderr.
  std::function<void(const std::string&)> log;

  // Options from the environment: RANK / SLURM_PROCID → rank, WORLD_SIZE /
  // SLURM_NTASKS → world_size, LOCAL_RANK / SLURM_LOCALID → local_rank;
  // OMNI_STORE (else tcp://MASTER_ADDR:MASTER_PORT when both are set, for an
  // elastic job launched by torchrun) → store_uri; OMNI_REPLICA_ID (else
  // "rank-<rank>" when a store is set) → elastic.membership.self.id;
  // OMNI_MIN_REPLICAS / OMNI_MAX_REPLICAS (else WORLD_SIZE when a store is
  // set); OMNI_CKPT_DIR, OMNI_CKPT_EVERY, OMNI_CKPT_EVERY_S (seconds →
  // ckpt_every_time), OMNI_STEP_LOG, OMNI_TRACE, OMNI_NOTICE_FILE,
  // OMNI_NOTICE_KEY, OMNI_PUBLISH_PREFIX, OMNI_PREEMPT_GRACE_S, OMNI_RACK,
  // OMNI_SWITCH, OMNI_JOB_ID, OMNI_TOTAL_STEPS (→ total_steps, which a
  // trainer that loops over epochs reads as Runtime::done()). Unset
  // variables leave the defaults. Set
  // explicit options on the result: they win. InvalidArgument naming the
  // variable for a malformed number.
  static absl::StatusOr<RuntimeOptions> FromEnvironment(const EnvLookup& env = ProcessEnvironment);
};

// Where registered state lives: replicated state is identical on every
// replica (model, optimizer, LR schedule) and is what the elastic group
// synchronises; per-replica state (RNGs) is this replica's own. Checkpoints
// hold both.
enum class StateScope { kReplicated, kPerReplica };

// What the trainer does after a step boundary.
struct Decision {
  enum Kind {
    kContinue,      // run the next step
    kReconfigured,  // the group changed: new rank / size; the state is re-synced
    kRedoStep,      // a collective failed: redo step() (the state is re-synced)
    kSaveAndExit,   // preempted: the save (if it fit) is done; exit with exit_code
  };
  Kind kind = kContinue;
  int rank = 0;
  int size = 1;
  int exit_code = 0;        // kSaveAndExit: kExitPreempted or kExitPreemptedNoSave
  int64_t saved_step = -1;  // kSaveAndExit: the step saved, -1 when none
  std::string reason;       // for the log
};

class OMNI_EXPORT Runtime {
 public:
  // Opens the store (when elastic), installs the preemption monitor (so a
  // signal during start-up is acted upon at the first boundary), creates the
  // telemetry, opens the checkpoint directory, creates the sampler. Errors
  // of those (InvalidArgument naming the option, FailedPrecondition for a
  // checkpoint directory in use, the store's errors).
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(RuntimeOptions options);
  virtual ~Runtime() = default;

  // Registers training state under `name` (see StateRegistry::Register;
  // "runtime" and, with a sampler, "data" are taken). Before Start() only
  // (FailedPrecondition afterwards).
  virtual absl::Status Register(std::string name, Stateful* object,
                                StateScope scope = StateScope::kReplicated) = 0;
  // Calls `fn` at every commit (an EndStep that does not answer kRedoStep),
  // before the periodic checkpoint, so that what it advances is in that
  // checkpoint: e.g. a torch::data loader position counting the batch the
  // step consumed (omni::torch_ext::TrainState::AddLoader). Before Start()
  // only (FailedPrecondition afterwards).
  virtual absl::Status OnCommit(std::function<void()> fn) = 0;
  // Restores the newest valid checkpoint (skipped ones are logged), joins the
  // elastic group (a replica behind the others receives their state) and
  // returns step(): the first step to run. Elastic: the replicated state
  // is restored before the join, the per-replica state after it (from the
  // part of the replica with this id, else of this rank when its writer is
  // not a member; none: the initial state stays, logged). Restore and join errors as
  // CheckpointManager::Restore and ElasticGroup::Start.
  virtual absl::StatusOr<int64_t> Start() = 0;

  // Opens step step() in the telemetry. FailedPrecondition before Start or
  // while a step is open.
  virtual absl::Status BeginStep() = 0;
  // A collective of the current generation (sum of gradients). `data` is
  // host memory, or CUDA memory of elastic.device with the nccl backend
  // (host memory is staged there; every replica passes the same kind, see
  // comm.h). Without a group: OK, the data untouched. An error latches:
  // EndStep answers kRedoStep; do not commit anything of the step (skip the
  // optimizer).
  virtual absl::Status AllReduce(void* data, size_t count, DType type, ReduceOp op) = 0;
  // The boundary (see the file comment). Errors: a failed save, a failed
  // rebuild (fewer than min_replicas for join_timeout), store errors.
  // FailedPrecondition when no step is open.
  virtual absl::StatusOr<Decision> EndStep() = 0;
  // The indices of this replica's share of the next global batch (the
  // sampler's committed cursor). FailedPrecondition without a sampler.
  virtual absl::StatusOr<std::vector<int64_t>> LocalBatch() const = 0;
  // Between steps, when this job will start no further step now (a guest
  // whose host has no idle window for it, or whose host has finished; see
  // docs/colocation.md), it gives its devices back at once. With a
  // preemption pending: the decision EndStep takes when the next step no
  // longer fits: save and kSaveAndExit with kExitPreempted when the save fits
  // before the deadline, else kSaveAndExit with kExitPreemptedNoSave (a
  // {"yield_in_s": 0} notice). With nothing pending: save and kSaveAndExit
  // with kExitPreempted, `reason` in the log and the Decision: the job leaves
  // resumable by its own decision. Without a ckpt_dir nothing is saved
  // (kExitPreemptedNoSave). FailedPrecondition before Start, while a step is
  // open, after a kSaveAndExit, or in elastic mode (the replicas of a group
  // stop together at an EndStep); the save's errors.
  virtual absl::StatusOr<Decision> Yield(std::string reason) = 0;
  // After the last step (or a kSaveAndExit): waits for a pending
  // checkpoint, tells replicas waiting to join that the job is over (not
  // after a kSaveAndExit: the job is only stopped), closes the telemetry
  // (returns its first export error). Idempotent.
  virtual absl::Status Finish() = 0;

  // Steps committed (the next step to run).
  virtual int64_t step() const = 0;
  // True when RuntimeOptions::total_steps is set and step() has reached it:
  // a trainer that loops over epochs of a data loader stops there.
  virtual bool done() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Wall time of the last synchronous save in seconds (0 before one).
  virtual double last_save_s() const = 0;

  // The owned parts, for what the Runtime does not wrap (phases, sinks,
  // tools). Null when not configured.
  virtual Telemetry& telemetry() = 0;
  virtual DistributedSampler* sampler() = 0;
  // Without a group (null in elastic mode).
  virtual CheckpointManager* checkpoints() = 0;
  // Elastic mode with a ckpt_dir: the job-level checkpoints (null otherwise).
  virtual JobCheckpointManager* job_checkpoints() = 0;
  virtual ElasticGroup* group() = 0;
  virtual PreemptionMonitor* preemption() = 0;
  virtual Store* store() = 0;
};

}  // namespace omni
