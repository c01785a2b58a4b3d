// Runtime: the owned parts and the step-boundary state machine (see
// include/omni/runtime.h for the order of the boundary's questions).
#include "omni/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "facade/job_saves.h"
#include "facade/timed_saves.h"
#include "omni/phase.h"
#include "omni/sinks.h"

namespace omni {
namespace {

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

// Counts the bytes a state would occupy in a checkpoint, copying nothing.
class CountingWriter final : public StateWriter {
 public:
  absl::Status PutTensor(std::string_view /*key*/, DType /*dtype*/, std::vector<int64_t> /*shape*/,
                         const void* /*data*/, size_t nbytes) override {
    bytes_ += nbytes;
    return absl::OkStatus();
  }
  absl::Status PutBytes(std::string_view /*key*/, std::string_view bytes) override {
    bytes_ += bytes.size();
    return absl::OkStatus();
  }
  size_t bytes() const { return bytes_; }

 private:
  size_t bytes_ = 0;
};

class RuntimeImpl final : public Runtime {
 public:
  explicit RuntimeImpl(RuntimeOptions options)
      : o_(std::move(options)), step_state_("step", &step_, sizeof(step_)) {}

  absl::Status Init();

  absl::Status Register(std::string name, Stateful* object, StateScope scope) override {
    if (started_) {
      return absl::FailedPreconditionError(
          absl::StrCat("Runtime::Register(\"", name, "\"): state must be registered before Start"));
    }
    if (scope == StateScope::kReplicated) {
      if (auto st = replicated_.Register(name, object); !st.ok()) return st;
    } else {
      if (auto st = per_replica_.Register(name, object); !st.ok()) return st;
    }
    return all_.Register(std::move(name), object);
  }

  absl::Status OnCommit(std::function<void()> fn) override {
    if (started_) {
      return absl::FailedPreconditionError(
          "Runtime::OnCommit: callbacks must be added before Start");
    }
    on_commit_.push_back(std::move(fn));
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Start() override;
  absl::Status BeginStep() override;
  absl::Status AllReduce(void* data, size_t count, DType type, ReduceOp op) override;
  absl::StatusOr<Decision> EndStep() override;
  absl::StatusOr<Decision> Yield(std::string reason) override;
  absl::StatusOr<std::vector<int64_t>> LocalBatch() const override {
    if (!sampler_.has_value()) {
      return absl::FailedPreconditionError(
          "Runtime::LocalBatch: no sampler (RuntimeOptions.sampler.dataset_size is 0)");
    }
    return sampler_->BatchAt(sampler_->cursor(), rank_, size_);
  }
  absl::Status Finish() override;

  int64_t step() const override { return step_; }
  bool done() const override { return o_.total_steps > 0 && step_ >= o_.total_steps; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  double last_save_s() const override { return last_save_s_; }
  Telemetry& telemetry() override { return *tel_; }
  DistributedSampler* sampler() override { return sampler_.has_value() ? &*sampler_ : nullptr; }
  CheckpointManager* checkpoints() override { return ckpt_.get(); }
  JobCheckpointManager* job_checkpoints() override { return job_ ? &job_->manager() : nullptr; }
  ElasticGroup* group() override { return group_.get(); }
  PreemptionMonitor* preemption() override { return monitor_.get(); }
  Store* store() override { return store_; }

 private:
  void Log(const std::string& line) const {
    if (o_.log) {
      o_.log(line);
    } else {
      std::fprintf(stderr, "%s: %s\n", o_.source.c_str(), line.c_str());
    }
  }
  void LogChange(const GroupChange& c, const char* why) const;
  int64_t NowNs() const { return o_.clock->NowNanos(); }
  bool IsEvalStep(int64_t step) const { return o_.telemetry.forecast.eval.OccursAt(step); }
  // `alone`: a job-level save of this replica only (it cannot save with the
  // others: it leaves, or the store failed).
  absl::Status Save(bool background, bool alone = false);
  bool HasCheckpoints() const { return ckpt_ != nullptr || job_ != nullptr; }
  std::string JobId() const { return o_.job_id.empty() ? o_.source : o_.job_id; }
  // After a change of generation (JobSaves::CatchUp): the group's state
  // may be older than the newest job-level checkpoint; then every member
  // loads it. A comparison that failed (a peer lost again) is left to the
  // group's next collective, as an abandoned save is. True when it loaded.
  absl::StatusOr<bool> CatchUpWithCheckpoints();
  void AdoptGeneration() {
    const Generation gen = group_->generation();
    if (gen.rank >= 0) {
      rank_ = gen.rank;
      size_ = gen.size();
    }
  }
  // The costs the preemption decision weighs: the next step and a save.
  std::pair<Cost, Cost> PreemptionCosts(int64_t next_step);
  // Job-wide stop: one agreed boundary for the replicas of a generation.
  absl::StatusOr<BoundaryDecision> AgreeOnStop(int64_t step, const BoundaryDecision& local);
  // Whether a checkpoint by wall time is due at the boundary after `step`
  // (in a group: agreed, SaveAgreement).
  absl::StatusOr<bool> TimedSaveHere(int64_t step);
  // `read()` (an agreement read from the store, idempotent: a StatusOr)
  // retried on a transient error for store_retry; a store that stays
  // unreachable is a store failure (`what` of `generation` names the
  // agreement).
  template <typename Read>
  auto RetryStoreRead(const char* what, int64_t generation, const Read& read) -> decltype(read());
  // `in_step`: the telemetry's step is still open (EndStep), so the save is
  // its checkpoint phase.
  absl::StatusOr<Decision> Stop(int64_t step, const BoundaryDecision& d, bool saved_here,
                                bool alone = false, bool in_step = true);
  // An error of the elastic group at a boundary. When the store failed (lost
  // its state, holds a malformed record, unreachable: IsStoreFailure) nothing
  // committed may be lost: the completed steps are saved (with a ckpt_dir)
  // and the job stops, resumable once it has a store again. Any other error
  // is returned as it is.
  absl::StatusOr<Decision> OnGroupError(int64_t step, const absl::Status& st);

  RuntimeOptions o_;
  // Declaration order is destruction order reversed: the group and the
  // monitor (which read the store) go before the store they use.
  std::unique_ptr<Store> owned_store_;
  Store* store_ = nullptr;
  std::unique_ptr<PreemptionMonitor> monitor_;
  std::unique_ptr<Telemetry> tel_;
  // A save abandoned because another replica failed: host-side time in the
  // telemetry, not a checkpoint phase (the save bound learns from saves).
  // Registered at the first one, so that a job without one logs no phase
  // for it.
  std::optional<PhaseId> save_abandoned_;
  PhaseId SaveAbandonedPhase();
  std::unique_ptr<CheckpointManager> ckpt_;
  // Elastic mode: job-level checkpoints in a directory the replicas share
  // (instead of ckpt_).
  std::unique_ptr<internal::JobSaves> job_;
  StateRegistry per_replica_;
  bool told_async_ = false;
  std::optional<DistributedSampler> sampler_;
  int64_t step_ = 0;  // committed steps (replicated state "runtime/step")
  BytesState step_state_;
  std::vector<std::function<void()>> on_commit_;
  StateRegistry all_;         // what a checkpoint holds
  StateRegistry replicated_;  // what the group synchronises
  std::unique_ptr<ElasticGroup> group_;
  std::unique_ptr<Store> stop_store_;
  std::unique_ptr<StopCoordinator> stop_;
  int64_t stop_generation_ = -1;
  // Checkpoints by wall time (ckpt_every_time; null: off), and in a group
  // the agreement on their boundaries in the current generation.
  std::optional<internal::SaveTimer> save_timer_;
  std::unique_ptr<Store> save_store_;
  std::unique_ptr<internal::SaveAgreement> save_agreement_;
  int64_t save_generation_ = -1;

  bool started_ = false;
  bool stopped_ = false;  // a kSaveAndExit was answered
  bool finished_ = false;
  bool step_open_ = false;
  int64_t current_ = 0;         // the step being run
  int64_t last_tel_step_ = -1;  // the telemetry's number of the last step
  // A failed attempt's telemetry step is left open for the redo (EndStep).
  bool tel_step_open_ = false;
  int64_t step_start_ns_ = 0;  // its start
  int64_t ended_ns_ = 0;       // when the last EndStep returned (0: none yet)
  int64_t gap_before_ns_ = 0;  // from then to the open step's start (host work between steps)
  absl::Status failure_;       // the first failed collective of the step
  bool recovered_ = false;     // the next commit is the first after a recovery
  int rank_ = 0;
  int size_ = 1;
  bool leaving_ = false;        // leave_on_preempt: a leave is requested
  bool left_group_ = false;     // ... and has taken effect
  bool leave_refused_ = false;  // ... and was refused (min_replicas): the job stops
  double worst_step_s_ = 0, worst_eval_step_s_ = 0;
  std::optional<size_t> state_bytes_;  // counted once, for an unmeasured save
  double last_save_s_ = 0;
};

absl::Status RuntimeImpl::Init() {
  if (o_.clock == nullptr) return absl::InvalidArgumentError("RuntimeOptions.clock is null");
  if (o_.elastic.membership.clock != Clock::Real() && o_.elastic.membership.clock != o_.clock) {
    return absl::InvalidArgumentError(
        "RuntimeOptions.elastic.membership.clock is another clock than RuntimeOptions.clock: one "
        "clock times the whole Runtime, its elastic group included (set RuntimeOptions.clock)");
  }
  if (o_.ckpt_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RuntimeOptions.ckpt_every must be >= 0, got ", o_.ckpt_every));
  }
  if (o_.ckpt_every_time < absl::ZeroDuration() || o_.ckpt_every_time == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RuntimeOptions.ckpt_every_time must be a finite duration >= 0, got ",
                     absl::FormatDuration(o_.ckpt_every_time)));
  }
  if (o_.ckpt_every > 0 && o_.ckpt_every_time > absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RuntimeOptions: ckpt_every (", o_.ckpt_every, " steps) and ckpt_every_time (",
        absl::FormatDuration(o_.ckpt_every_time), ") are both set: choose one period"));
  }
  if (o_.world_size < 1 || o_.rank < 0 || o_.rank >= o_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("RuntimeOptions: rank ", o_.rank, " of world_size ", o_.world_size));
  }
  rank_ = o_.rank;
  size_ = o_.world_size;
  // A store that the preemption monitor polls is opened before it.
  store_ = o_.store;
  if (store_ == nullptr && !o_.store_uri.empty()) {
    absl::StatusOr<std::unique_ptr<Store>> opened = OpenStore(o_.store_uri);
    if (!opened.ok()) return opened.status();
    owned_store_ = *std::move(opened);
    store_ = owned_store_.get();
  }
  if (!o_.notice_key.empty() && store_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("RuntimeOptions.notice_key \"", o_.notice_key,
                                                   "\" needs a store (store or store_uri)"));
  }
  if (o_.handle_preemption) {
    PreemptionOptions po = o_.preemption;
    if (!o_.notice_key.empty()) {
      po.notice_store = store_;
      po.notice_key = o_.notice_key;
    }
    absl::StatusOr<std::unique_ptr<PreemptionMonitor>> m = PreemptionMonitor::Create(po, o_.clock);
    if (!m.ok()) return m.status();
    monitor_ = *std::move(m);
  }
  TelemetryOptions to = o_.telemetry;
  // A job with checkpoints may be a resumed one: its earlier runs' step log
  // and trace are kept (moved aside), not truncated.
  if (!o_.ckpt_dir.empty()) to.keep_previous_outputs = true;
  if (to.source.empty() || to.source == "omni") to.source = o_.source;
  // The periodic checkpoint is a declared event for the forecaster (and in
  // the step log's header), unless the caller declared one: its save runs
  // inside step N·ckpt_every − 1 (EndStep), its length is learned.
  PeriodicEvent& declared = to.forecast.checkpoint;
  const bool undeclared = declared.every_steps == 0 && declared.every_ns == 0;
  if (!o_.ckpt_dir.empty() && o_.ckpt_every > 0 && undeclared) {
    declared.every_steps = o_.ckpt_every;
    declared.offset = o_.ckpt_every - 1;
  }
  // By wall time: alone, the save comes in the first step whose boundary
  // is ckpt_every_time after the last save began (the timer restarts at the
  // boundary, just before it); in a group, one step later (the replicas
  // agree on the boundary after the next step from the first due one's,
  // and each restarts its timer at that boundary: timed_saves.h).
  if (!o_.ckpt_dir.empty() && o_.ckpt_every_time > absl::ZeroDuration() && undeclared) {
    declared.every_ns = absl::ToInt64Nanoseconds(o_.ckpt_every_time);
    declared.wall_lag_steps = store_ == nullptr ? 0 : 1;
  }
  absl::StatusOr<std::unique_ptr<Telemetry>> tel = Telemetry::Create(to, o_.clock);
  if (!tel.ok()) return tel.status();
  tel_ = *std::move(tel);
  if (!o_.forecast_path.empty()) {
    absl::StatusOr<std::unique_ptr<ForecastSink>> sink = MakeFileSink(o_.forecast_path);
    if (!sink.ok()) return sink.status();
    tel_->AddSink(*std::move(sink));
  }
  if (!o_.publish_prefix.empty()) {
    if (store_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("RuntimeOptions.publish_prefix \"",
                                                     o_.publish_prefix,
                                                     "\" needs a store (store or store_uri)"));
    }
    absl::StatusOr<std::unique_ptr<ForecastSink>> sink = MakeStoreSink(*store_, o_.publish_prefix);
    if (!sink.ok()) return sink.status();
    tel_->AddSink(*std::move(sink));
  }
  if (!o_.ckpt_dir.empty() && store_ != nullptr) {
    JobCheckpointOptions jo;
    jo.dir = o_.ckpt_dir;
    jo.job_id = JobId();
    jo.replica_id = o_.elastic.membership.self.id;
    jo.keep_last = o_.keep_last;
    jo.start_fresh = o_.start_fresh;
    absl::StatusOr<std::unique_ptr<internal::JobSaves>> j =
        internal::JobSaves::Open(jo, [this](const std::string& line) { Log(line); });
    if (!j.ok()) return j.status();
    job_ = *std::move(j);
  } else if (!o_.ckpt_dir.empty()) {
    CheckpointOptions co;
    co.dir = o_.ckpt_dir;
    co.keep_last = o_.keep_last;
    co.start_fresh = o_.start_fresh;
    co.job_id = o_.job_id;
    co.rank = o_.rank;  // ranks of a static job share the directory
    co.world_size = o_.world_size;
    absl::StatusOr<std::unique_ptr<CheckpointManager>> c = CheckpointManager::Open(co);
    if (!c.ok()) return c.status();
    ckpt_ = *std::move(c);
  }
  if (auto st = Register("runtime", &step_state_, StateScope::kReplicated); !st.ok()) return st;
  if (o_.sampler.dataset_size > 0) {
    absl::StatusOr<DistributedSampler> s = DistributedSampler::Create(o_.sampler);
    if (!s.ok()) return s.status();
    sampler_.emplace(*std::move(s));
    if (auto st = Register("data", &*sampler_, StateScope::kReplicated); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void RuntimeImpl::LogChange(const GroupChange& c, const char* why) const {
  Log(absl::StrFormat("elastic: %s: %s; agree %.1f ms, build %.1f ms, sync %.1f ms%s t_mono_ns=%d",
                      why, c.generation.ToString(), c.agree_ms, c.build_ms, c.sync_ms,
                      c.state_received ? absl::StrCat(", state (", c.state_bytes, " bytes, step ",
                                                      c.completed, ") from rank ", c.source_rank)
                                       : "",
                      Clock::Real()->NowNanos()));
}

absl::StatusOr<int64_t> RuntimeImpl::Start() {
  if (started_) return absl::FailedPreconditionError("Runtime::Start called twice");
  started_ = true;
  if (ckpt_) {
    absl::StatusOr<CheckpointManager::RestoreResult> restored = ckpt_->Restore(all_);
    if (restored.ok()) {
      for (const std::string& why : restored->skipped) Log("skipped checkpoint: " + why);
      Log(absl::StrCat("resumed from ", restored->info.path, " (step ", step_, ")"));
    } else if (!absl::IsNotFound(restored.status())) {
      return restored.status();
    }
  }
  if (job_) {
    // The replicated state now (any replica count wrote it); the
    // per-replica state once the group has given this replica its rank.
    absl::StatusOr<std::optional<int64_t>> restored = job_->RestoreReplicated(replicated_);
    if (!restored.ok()) return restored.status();
    if (restored->has_value()) {
      Log(absl::StrCat("resumed from ", o_.ckpt_dir, " (step ", step_, ")"));
    }
  }
  if (store_ != nullptr) {
    ElasticOptions eo = o_.elastic;
    eo.membership.clock = o_.clock;
    if (eo.membership.job_id.empty()) eo.membership.job_id = JobId();
    if (eo.membership.self.host.empty()) eo.membership.self.host = Hostname();
    absl::StatusOr<std::unique_ptr<ElasticGroup>> g =
        ElasticGroup::Create(*store_, eo, replicated_);
    if (!g.ok()) return g.status();
    group_ = *std::move(g);
    absl::StatusOr<GroupChange> started = group_->Start(step_);
    if (!started.ok()) return started.status();
    LogChange(*started, "joined");
    AdoptGeneration();
    if (job_) {
      const Generation gen = group_->generation();
      const std::string self = gen.rank >= 0 && gen.rank < gen.size()
                                   ? gen.members[gen.rank].id
                                   : o_.elastic.membership.self.id;
      if (auto st = job_->RestorePerReplica(per_replica_, step_, gen, self); !st.ok()) {
        return st;
      }
    }
    // Every member of a new generation compares its state with the
    // checkpoints right after the change, whichever way it came to it.
    if (absl::StatusOr<bool> caught = CatchUpWithCheckpoints(); !caught.ok()) {
      return caught.status();
    }
  }
  if (HasCheckpoints() && o_.ckpt_every_time > absl::ZeroDuration()) {
    save_timer_.emplace(o_.ckpt_every_time, o_.clock);
  }
  return step_;
}

absl::Status RuntimeImpl::BeginStep() {
  if (!started_) return absl::FailedPreconditionError("Runtime::BeginStep before Start");
  if (step_open_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Runtime::BeginStep: step ", current_, " is still open (call EndStep)"));
  }
  step_open_ = true;
  current_ = step_;
  step_start_ns_ = NowNs();
  gap_before_ns_ = ended_ns_ > 0 ? step_start_ns_ - ended_ns_ : 0;
  failure_ = absl::OkStatus();
  if (tel_step_open_) {
    // A redo goes on in the failed attempt's telemetry step (EndStep).
    tel_step_open_ = false;
    return absl::OkStatus();
  }
  // The telemetry numbers steps strictly increasing: a step that starts
  // again below the last one (state restored from an older checkpoint) is
  // numbered after it.
  const int64_t tel_step = std::max(current_, last_tel_step_ + 1);
  last_tel_step_ = tel_step;
  // A telemetry misuse is counted there and never stops training.
  tel_->BeginStep(tel_step).IgnoreError();
  return absl::OkStatus();
}

absl::Status RuntimeImpl::AllReduce(void* data, size_t count, DType type, ReduceOp op) {
  if (!group_) return absl::OkStatus();
  if (!failure_.ok()) return failure_;  // the step is lost already
  absl::Status st = group_->AllReduce(data, count, type, op);
  if (!st.ok()) failure_ = st;
  return st;
}

absl::Status RuntimeImpl::Save(bool background, bool alone) {
  std::map<std::string, std::string> meta = o_.ckpt_metadata;
  meta.emplace("source", o_.source);
  if (o_.total_steps > 0) meta.emplace("steps_total", std::to_string(o_.total_steps));
  if (job_) {
    if (background && !told_async_) {
      Log("job-level checkpoints are written synchronously (async_ckpt applies without a group)");
      told_async_ = true;
    }
    absl::StatusOr<JobSaveStats> stats =
        alone || !group_ ? job_->SaveAlone(step_, replicated_, per_replica_, meta)
                         : job_->SaveTogether(step_, *group_, replicated_, per_replica_, meta);
    if (!stats.ok()) return stats.status();
    last_save_s_ = stats->write_s + stats->commit_s;
    return absl::OkStatus();
  }
  if (background) return ckpt_->SaveAsync(step_, all_, meta).status();
  if (auto st = ckpt_->WaitForPending(); !st.ok()) return st;
  absl::StatusOr<SaveStats> stats = ckpt_->Save(step_, all_, meta);
  if (!stats.ok()) return stats.status();
  last_save_s_ = stats->write_s + stats->snapshot_s;
  return absl::OkStatus();
}

// The next step is costed at the upper end of the forecaster's bound for it
// (calibrated online: the stated confidence is what replay measures), with
// the host-side time before it (StepBound::gap_hi_ns: a batch fetched or a
// flush done between EndStep and BeginStep); while the model has no bound
// (warm-up, a new regime, a step not yet forecast), at the worst this
// process has seen for its kind from one boundary to the next. An eval step
// not seen yet costs more than any deadline: its length is unknown. In a
// group the agreed stop comes one boundary after the first local decision,
// so two steps are looked ahead. The save is the forecaster's save bound;
// before one, the telemetry's checkpoint phase (mean, stddev;
// PreemptionMonitor adds k·σ); until a save was measured, 50 ms for the
// fsyncs and renames plus the state at a conservative 100 MB/s, with a 50%
// standard deviation.
std::pair<Cost, Cost> RuntimeImpl::PreemptionCosts(int64_t next_step) {
  constexpr int kLookAhead = 8;  // the worker may be a few steps behind
  const absl::StatusOr<std::vector<StepBound>> bounds = tel_->NextStepBounds(kLookAhead);
  const auto step_cost = [&](int64_t s) {
    if (IsEvalStep(s) && worst_eval_step_s_ == 0) return std::numeric_limits<double>::infinity();
    if (bounds.ok()) {
      for (const StepBound& b : *bounds) {
        if (b.step == s) return static_cast<double>(b.hi_ns + b.gap_hi_ns) / 1e9;
      }
    }
    return IsEvalStep(s) ? worst_eval_step_s_ : worst_step_s_;
  };
  Cost step{step_cost(next_step), 0};
  if (group_) step.mean_s += step_cost(next_step + 1);
  Cost save;
  if (absl::StatusOr<StepBound> sb = tel_->SaveBound(); sb.ok() && sb->hi_ns > 0) {
    save = {static_cast<double>(sb->hi_ns) / 1e9, 0};
  } else {
    for (const auto& row : tel_->Snapshot().rows) {
      if (row.name == "checkpoint") save = {row.summary.mean / 1e9, row.summary.stddev / 1e9};
    }
  }
  if (save.mean_s == 0) {
    if (!state_bytes_.has_value()) {
      CountingWriter counter;
      state_bytes_ = all_.SaveAll(counter).ok() ? counter.bytes() : size_t{0};
    }
    const double s = 0.05 + static_cast<double>(*state_bytes_) / 100e6;
    save = {s, 0.5 * s};
  }
  return {step, save};
}

absl::StatusOr<BoundaryDecision> RuntimeImpl::AgreeOnStop(int64_t step,
                                                          const BoundaryDecision& local) {
  const Generation gen = group_->generation();
  if (!stop_ || stop_generation_ != gen.number) {
    stop_store_ = MakePrefixStore(*store_, gen.prefix() + "/stop/");
    stop_ = std::make_unique<StopCoordinator>(*stop_store_);
    stop_generation_ = gen.number;
  }
  return RetryStoreRead("the stop agreement", gen.number,
                        [&] { return stop_->AtBoundary(step, local); });
}

// The agreements are read from the store like the membership is: a
// transient error is retried for store_retry (an answer is idempotent: each
// key is created once), and a store that stays unreachable is a store
// failure, so that this replica saves alone (OnGroupError) instead of
// failing: the store's server may have died with its replica, and this read
// can come before the membership's heartbeat notices.
template <typename Read>
auto RuntimeImpl::RetryStoreRead(const char* what, int64_t generation, const Read& read)
    -> decltype(read()) {
  const absl::Duration retry = o_.elastic.membership.store_retry;
  const int64_t until = NowNs() + absl::ToInt64Nanoseconds(retry);
  absl::Duration backoff = absl::Milliseconds(10);
  for (;;) {
    auto d = read();
    const absl::Status& st = d.status();
    if (st.ok() || !(absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st) ||
                     absl::IsAborted(st) || absl::IsNotFound(st))) {
      return d;
    }
    if (absl::Status latched = group_->membership().StoreFailure(); !latched.ok()) return latched;
    if (NowNs() >= until) {
      return MarkStoreFailure(absl::UnavailableError(
          absl::StrCat("store unreachable for ", absl::FormatDuration(retry), " (", what,
                       " of generation ", generation, "): ", st.message())));
    }
    o_.clock->SleepUntil(NowNs() + absl::ToInt64Nanoseconds(backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

absl::StatusOr<bool> RuntimeImpl::TimedSaveHere(int64_t step) {
  const bool due = save_timer_->Due();
  if (!group_) return due;
  const Generation gen = group_->generation();
  if (!save_agreement_ || save_generation_ != gen.number) {
    save_store_ = MakePrefixStore(*store_, gen.prefix() + "/save/");
    save_agreement_ = std::make_unique<internal::SaveAgreement>(*save_store_);
    save_generation_ = gen.number;
  }
  return RetryStoreRead("the timed checkpoint agreement", gen.number,
                        [&] { return save_agreement_->AtBoundary(step, due); });
}

absl::StatusOr<Decision> RuntimeImpl::EndStep() {
  if (!step_open_) return absl::FailedPreconditionError("Runtime::EndStep: no step is open");
  step_open_ = false;
  // The boundary (checkpoint included) belongs to the step in the telemetry.
  absl::Cleanup end_step = [this] {
    tel_->EndStep().IgnoreError();
    ended_ns_ = NowNs();
  };
  const int64_t step = current_;
  Decision out;

  if (!failure_.ok()) {
    // Nothing of this step is committed: agree on the survivors, rebuild,
    // re-synchronise, and redo the step.
    Log(absl::StrFormat("elastic: step %d failed: %s t_mono_ns=%d", step, failure_.ToString(),
                        Clock::Real()->NowNanos()));
    absl::StatusOr<GroupChange> change = group_->Recover(failure_, step_);
    if (!change.ok()) return OnGroupError(step, change.status());
    LogChange(*change, "recovered");
    recovered_ = true;
    AdoptGeneration();
    if (absl::StatusOr<bool> caught = CatchUpWithCheckpoints(); !caught.ok()) {
      return OnGroupError(step, caught.status());
    }
    out.kind = Decision::kRedoStep;
    out.rank = rank_;
    out.size = size_;
    out.reason = failure_.ToString();
    failure_ = absl::OkStatus();
    // The failed attempt and its redo are one step in the telemetry: its
    // steps stay the training steps, whose numbers the declared events, the
    // data's rhythm and PreemptionCosts' bounds go by. (Numbered after the
    // failed attempt, the redo and every step after it were one ahead: the
    // forecaster put each eval every 25 steps in the step before it, for
    // the rest of a recorded elastic run.)
    std::move(end_step).Cancel();
    ended_ns_ = NowNs();
    tel_step_open_ = true;
    return out;
  }

  // ---- commit
  // A step costs its time from the last boundary: the host work before it too.
  const double step_s = static_cast<double>(NowNs() - step_start_ns_ + gap_before_ns_) / 1e9;
  double& worst = IsEvalStep(step) ? worst_eval_step_s_ : worst_step_s_;
  worst = std::max(worst, step_s);
  if (sampler_.has_value()) sampler_->Commit();
  step_ = step + 1;
  for (const std::function<void()>& fn : on_commit_) fn();
  if (recovered_) {
    Log(absl::StrFormat("elastic: committed step %d after recovery t_mono_ns=%d", step,
                        Clock::Real()->NowNanos()));
    recovered_ = false;
  }

  // ---- periodic checkpoint (by steps, or by wall time)
  bool saved_here = false;
  const bool before_end = o_.total_steps == 0 || step_ < o_.total_steps;
  bool periodic = HasCheckpoints() && o_.ckpt_every > 0 && step_ % o_.ckpt_every == 0;
  bool timed = false;
  int64_t boundary_ns = 0;
  if (save_timer_.has_value() && before_end) {
    boundary_ns = NowNs();
    absl::StatusOr<bool> here = TimedSaveHere(step);
    if (!here.ok()) return OnGroupError(step, here.status());
    timed = periodic = *here;
  }
  if (periodic && before_end) {
    PhaseScope p(*tel_, phase::kCheckpoint);
    absl::Status st = Save(o_.async_ckpt);
    if (!st.ok() && job_ &&
        (absl::IsAborted(st) || absl::IsDeadlineExceeded(st) || absl::IsUnavailable(st) ||
         absl::IsCancelled(st))) {
      // Another replica failed (died, or could not write): this checkpoint
      // is abandoned, the previous one stays; the group recovers at the
      // next collective.
      p.EndAs(SaveAbandonedPhase());
      Log(absl::StrCat("checkpoint of step ", step_, " abandoned: ", st.message(),
                       "; the previous checkpoint stays"));
    } else if (!st.ok()) {
      return st;
    } else {
      saved_here = !o_.async_ckpt || job_ != nullptr;
      // The interval counts from this boundary; after an abandoned save
      // it is still past, and the next boundary proposes another.
      if (timed) save_timer_->RestartAt(boundary_ns);
    }
  }

  // ---- a new generation here?
  if (group_) {
    absl::StatusOr<std::optional<GroupChange>> change = group_->AtBoundary(step_);
    if (!change.ok()) return OnGroupError(step, change.status());
    if (change->has_value() && (*change)->generation.rank < 0 && leaving_) {
      left_group_ = true;  // the others go on in this generation, without us
      Log(absl::StrFormat("elastic: left the group: %s t_mono_ns=%d",
                          (*change)->generation.ToString(), Clock::Real()->NowNanos()));
    } else if (change->has_value()) {
      LogChange(**change, "changed");
      AdoptGeneration();
      out.kind = Decision::kReconfigured;
      absl::StatusOr<bool> caught = CatchUpWithCheckpoints();
      if (!caught.ok()) return OnGroupError(step, caught.status());
      if (*caught) {
        // The boundary's step is no longer this one: a stop is agreed at
        // the next boundary, of the step the checkpoint holds.
        out.rank = rank_;
        out.size = size_;
        return out;
      }
    }
  }
  out.rank = rank_;
  out.size = size_;

  // ---- preemption
  BoundaryDecision d;
  if (monitor_ && monitor_->pending()) {
    const auto [step_cost, save_cost] = PreemptionCosts(step + 1);
    d = monitor_->AtBoundary(step_cost, save_cost);
  }
  // leave_on_preempt: this replica leaves alone, after one more step, while
  // the others go on. When the others would be too few (min_replicas) the
  // whole job stops at one boundary instead; while another change is
  // pending, it asks again at the next boundary; when not even a save fits
  // any more, it exits alone (the others see a failure).
  if (group_ && o_.leave_on_preempt && !leaving_ && !leave_refused_ &&
      d.action == BoundaryAction::kSaveAndExit) {
    const absl::Status asked = group_->Leave(step_);
    if (asked.ok()) {
      leaving_ = true;
      Log(absl::StrFormat("elastic: leaving the group after step %d (%s)", step_, d.reason));
    } else {
      Log(absl::StrCat("elastic: ", asked.ToString()));
      leave_refused_ = !absl::IsUnavailable(asked);
    }
    if (!leave_refused_) d = BoundaryDecision{};
  }
  const bool exits_alone = o_.leave_on_preempt && !leave_refused_;
  if (left_group_) {
    d.action = BoundaryAction::kSaveAndExit;
    d.reason = "left the elastic group gracefully";
  } else if (leaving_) {
    // On the way out: only a save that would no longer fit stops us now.
    if (d.action != BoundaryAction::kExitWithoutSave) d = BoundaryDecision{};
  } else if (group_ && !(exits_alone && d.action == BoundaryAction::kExitWithoutSave)) {
    // Every replica stops at one boundary, whichever of them was told to
    // stop (a signal to one replica, a notice key that all of them read, or
    // a leave refused): each reads the agreement at every boundary.
    absl::StatusOr<BoundaryDecision> agreed = AgreeOnStop(step, d);
    if (!agreed.ok()) return OnGroupError(step, agreed.status());
    d = *std::move(agreed);
  }
  if (d.action == BoundaryAction::kContinue) return out;
  return Stop(step, d, saved_here);
}

absl::StatusOr<Decision> RuntimeImpl::Yield(std::string reason) {
  if (!started_) return absl::FailedPreconditionError("Runtime::Yield before Start");
  if (step_open_) {
    return absl::FailedPreconditionError(
        absl::StrCat("Runtime::Yield: step ", current_, " is still open (call EndStep)"));
  }
  if (stopped_) return absl::FailedPreconditionError("Runtime::Yield: the job has stopped already");
  if (group_) {
    return absl::FailedPreconditionError(
        "Runtime::Yield: the replicas of an elastic group stop together at an EndStep");
  }
  BoundaryDecision d;
  if (monitor_ && monitor_->pending()) {
    // No further step: only whether the save still fits is asked.
    const Cost never{std::numeric_limits<double>::infinity(), 0};
    d = monitor_->AtBoundary(never, PreemptionCosts(step_).second);
  } else {
    d.action = BoundaryAction::kSaveAndExit;
    d.reason = std::move(reason);
  }
  return Stop(step_ - 1, d, /*saved_here=*/false, /*alone=*/false, /*in_step=*/false);
}

absl::StatusOr<Decision> RuntimeImpl::Stop(int64_t step, const BoundaryDecision& d, bool saved_here,
                                           bool alone, bool in_step) {
  Log(step < 0 ? absl::StrCat("preempted before its first step: ", d.reason)
               : absl::StrFormat("preempted after step %d: %s", step, d.reason));
  stopped_ = true;
  Decision out;
  out.kind = Decision::kSaveAndExit;
  out.rank = rank_;
  out.size = size_;
  out.reason = d.reason;
  out.exit_code = kExitPreemptedNoSave;
  if (d.action == BoundaryAction::kSaveAndExit && HasCheckpoints()) {
    if (!saved_here) {
      std::optional<PhaseScope> p;
      if (in_step) p.emplace(*tel_, phase::kCheckpoint);
      absl::Status st = Save(/*background=*/false, alone || left_group_);
      if (!st.ok() && job_ && !alone && !left_group_) {
        // A replica died during the job-wide save: each survivor saves
        // alone (the replicated state is the same on all of them).
        Log(absl::StrCat("job-level save failed (", st.message(), "); saving this replica alone"));
        if (p.has_value()) {
          p->EndAs(SaveAbandonedPhase());
          p.emplace(*tel_, phase::kCheckpoint);
        }
        st = Save(/*background=*/false, /*alone=*/true);
      }
      if (!st.ok()) return st;
    }
    if (ckpt_) {
      if (auto st = ckpt_->WaitForPending(); !st.ok()) return st;
    }
    Log(absl::StrFormat("saved step %d to %s in %.1f ms; exiting %d (resumable)", step_,
                        o_.ckpt_dir, 1e3 * last_save_s_, kExitPreempted));
    out.exit_code = kExitPreempted;
    out.saved_step = step_;
  } else if (d.action == BoundaryAction::kSaveAndExit) {
    Log(absl::StrFormat("no checkpoint directory: exiting %d without a checkpoint", out.exit_code));
  } else {
    Log(absl::StrFormat(
        "a checkpoint cannot finish before the deadline; exiting %d without saving (the previous "
        "checkpoint stays valid)",
        out.exit_code));
  }
  return out;
}

PhaseId RuntimeImpl::SaveAbandonedPhase() {
  if (!save_abandoned_.has_value()) {
    absl::StatusOr<PhaseId> id = tel_->RegisterPhase("save_abandoned", IdleKind::kHostSide);
    if (!id.ok()) {
      // (The name taken with another idle kind, or the catalog full.)
      Log(absl::StrCat("telemetry: abandoned saves are recorded as host time: ",
                       id.status().ToString()));
    }
    save_abandoned_ = id.ok() ? *id : phase::kHost;
  }
  return *save_abandoned_;
}

absl::StatusOr<bool> RuntimeImpl::CatchUpWithCheckpoints() {
  if (!job_ || !group_) return false;
  const Generation gen = group_->generation();
  if (gen.rank < 0 || gen.rank >= gen.size()) return false;
  absl::StatusOr<std::optional<int64_t>> caught =
      job_->CatchUp(step_, *group_, replicated_, per_replica_, gen.members[gen.rank].id);
  if (absl::IsAborted(caught.status())) {
    Log(absl::StrCat("elastic: ", caught.status().message()));
    return false;
  }
  if (!caught.ok()) return caught.status();
  if (!caught->has_value()) return false;
  Log(absl::StrFormat("elastic: caught up with the checkpoint of step %d t_mono_ns=%d", **caught,
                      Clock::Real()->NowNanos()));
  return true;
}

absl::StatusOr<Decision> RuntimeImpl::OnGroupError(int64_t step, const absl::Status& st) {
  if (!IsStoreFailure(st) || !HasCheckpoints()) return st;
  Log(absl::StrCat("elastic: store failure: ", st.ToString()));
  BoundaryDecision d;
  d.action = BoundaryAction::kSaveAndExit;
  d.reason = absl::StrCat("the store failed: ", st.message());
  // The replicas see the failure at different boundaries: each saves alone.
  return Stop(step, d, /*saved_here=*/false, /*alone=*/true);
}

absl::Status RuntimeImpl::Finish() {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  absl::Status first;
  if (ckpt_) first.Update(ckpt_->WaitForPending());
  if (group_ && !stopped_) {
    // Replicas still waiting to be admitted learn that there is nothing left.
    first.Update(group_->membership().Finish());
  }
  if (tel_step_open_) {
    tel_->EndStep().IgnoreError();  // a failed attempt not redone
    tel_step_open_ = false;
  }
  first.Update(tel_->Close());
  return first;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(RuntimeOptions options) {
  auto rt = std::make_unique<RuntimeImpl>(std::move(options));
  if (auto st = rt->Init(); !st.ok()) return st;
  return rt;
}

}  // namespace omni
