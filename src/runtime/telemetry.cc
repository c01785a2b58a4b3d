#include "omni/telemetry.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_name.h"
#include "omni/step_log.h"
#include "omni/window_channel.h"
#include "runtime/quantile.h"
#include "runtime/trace_writer.h"
#include "runtime/worker_pacing.h"

namespace omni {
namespace {

constexpr uint16_t kNoSpan = 0xffff;
// How many records ahead BeginStep prefetches the ring (the header and the
// first two spans are in the record's first two cache lines).
constexpr uint64_t kPrefetchSteps = 4;
// What learning one step of the previous run costs the worker, about
// (bench_forecast_resume: 76 µs a step, 107 at most, on the corpus).
constexpr double kLearnStepCostNs = 100'000;

class TelemetryImpl final : public Telemetry {
 public:
  TelemetryImpl(const TelemetryOptions& options, const Clock* clock, StepStats stats,
                Forecaster forecaster)
      : options_(options),
        clock_(clock),
        ring_(static_cast<size_t>(options.ring_capacity)),
        mask_(static_cast<uint64_t>(options.ring_capacity) - 1),
        stats_(std::move(stats)),
        forecaster_(std::move(forecaster)),
        window_durations_(static_cast<size_t>(kNoticePhases) * kMaxWindowOrdinals,
                          RollingWindow(options.stats.window)),
        claim_scale_(options.stats.window, options.window_min_samples, options.window_confidence),
        claim_level_(options.window_confidence),
        long_gaps_(options.stats.window) {
    window_count_step_.fill(-1);
    last_seen_step_.fill(-1);
    const PhaseCatalog builtin;
    for (int p = 0; p < builtin.size(); ++p) {
      idle_kind_[p].store(builtin.idle_kind(static_cast<PhaseId>(p)), std::memory_order_relaxed);
    }
  }

  ~TelemetryImpl() override { Close().IgnoreError(); }

  absl::Status Start() {
    if (options_.window_channel_name.empty()) {
      window_ = WindowChannelWriter::CreateInProcess(options_.window_confidence);
    } else {
      auto w =
          WindowChannelWriter::Create(options_.window_channel_name, options_.window_confidence);
      if (!w.ok()) return w.status();
      window_ = *std::move(w);
    }
    PublishPhaseQuantiles();
    StepLogHeader header;
    header.source = options_.source;
    header.phases = catalog_;
    header.checkpoint = options_.forecast.checkpoint;
    header.eval = options_.forecast.eval;
    header.pipeline = options_.forecast.pipeline;
    if (!options_.step_log_path.empty()) {
      auto w = StepLogWriter::Open(options_.step_log_path, header, options_.keep_previous_outputs);
      if (!w.ok()) return w.status();
      log_ = *std::move(w);
      if (options_.forecast_enabled && options_.learn_previous_steps > 0) {
        previous_path_ = log_->previous_path();
      }
    }
    if (!options_.trace_path.empty()) {
      auto w = internal::TraceWriter::Open(options_.trace_path, options_.source,
                                           options_.keep_previous_outputs);
      if (!w.ok()) return w.status();
      trace_ = *std::move(w);
    }
    worker_ = std::thread([this] {
      internal::NameThisThread("omni-telemetry");
      ReadPrevious();
      WorkerLoop();
    });
    return absl::OkStatus();
  }

  // ------------------------------------------------------------ registration
  absl::StatusOr<PhaseId> RegisterPhase(std::string_view name, IdleKind idle) override {
    absl::MutexLock l(&mu_);
    auto id = catalog_.Register(name, idle);
    if (id.ok()) {
      idle_kind_[*id].store(idle, std::memory_order_relaxed);
      stats_.UpdateCatalog(catalog_);
      num_phases_.store(catalog_.size(), std::memory_order_release);
    }
    return id;
  }
  absl::StatusOr<PhaseId> FindPhase(std::string_view name) const override {
    absl::MutexLock l(&mu_);
    return catalog_.Find(name);
  }
  void AddSink(std::unique_ptr<ForecastSink> sink) override {
    absl::MutexLock l(&sinks_mu_);
    sinks_.push_back(std::move(sink));
    has_sinks_.store(true, std::memory_order_release);
  }

  // ------------------------------------------------------------ hooks
  absl::Status BeginStep() override { return BeginStep(last_step_ + 1); }

  // The hooks keep their error paths in separate cold functions, so the
  // common path is a few loads and stores with a small stack frame.
  absl::Status BeginStep(int64_t step) override {
    if (ABSL_PREDICT_FALSE(closed_.load(std::memory_order_relaxed) || step_open_ ||
                           step <= last_step_)) {
      return BeginStepError(step);
    }
    const uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - cached_tail_ >= ring_.size()) cached_tail_ = tail_.load(std::memory_order_acquire);
    if (h - cached_tail_ >= ring_.size()) {
      cur_ = &scratch_;  // the worker is behind: this step is measured but dropped
      cur_dropped_ = true;
    } else {
      cur_ = &ring_[h & mask_];
      cur_dropped_ = false;
    }
    // The records a few steps ahead were last read by the worker on another
    // core (or not touched for a whole lap of the ring): request them for
    // writing now, so that a later step's stores do not wait for them.
    const char* ahead = reinterpret_cast<const char*>(&ring_[(h + kPrefetchSteps) & mask_]);
    __builtin_prefetch(ahead, 1);
    __builtin_prefetch(ahead + 64, 1);
    cur_->step = step;
    cur_->num_spans = 0;
    cur_->spans_truncated = false;
    depth_ = 0;
    sibling_end_[0] = 0;
    step_open_ = true;
    cur_->start_ns = clock_->NowNanos();
    cur_->end_ns = cur_->start_ns;
    sibling_end_[0] = cur_->start_ns;
    if (gap_open_) {  // the gap between steps ends
      window_->CloseWindow(cur_->start_ns);
      gap_open_ = false;
    }
    return absl::OkStatus();
  }

  absl::Status EndStep() override {
    const int64_t now = clock_->NowNanos();
    if (ABSL_PREDICT_FALSE(!step_open_ || depth_ > 0)) return EndStepSlow(now);
    FinishStep(now);
    return absl::OkStatus();
  }

  // Hands the open step (no phase open) to the worker.
  void FinishStep(int64_t now) {
    cur_->end_ns = now;
    step_open_ = false;
    last_step_ = cur_->step;
    if (ABSL_PREDICT_FALSE(cur_->spans_truncated))
      truncated_.fetch_add(1, std::memory_order_relaxed);
    if (ABSL_PREDICT_FALSE(cur_dropped_)) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
    } else {
      head_.store(head_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    // The host's work until the next BeginStep is idle time for the devices:
    // announced while the worker finds gaps long enough to matter.
    if (gap_notices_.load(std::memory_order_relaxed)) {
      window_->OpenWindow(kBetweenStepsPhase, IdleKind::kHostSide, last_step_ + 1, 0, now);
      gap_open_ = true;
    }
  }

  // EndStep without an open step, or with phases still open.
  ABSL_ATTRIBUTE_NOINLINE ABSL_ATTRIBUTE_COLD absl::Status EndStepSlow(int64_t now) {
    if (!step_open_) {
      return Misuse(absl::FailedPreconditionError(
          absl::StrCat("EndStep() with no open step (last step ", last_step_, ")")));
    }
    absl::Status st = absl::FailedPreconditionError(
        absl::StrCat("EndStep() of step ", cur_->step, " with ", depth_,
                     " phase(s) still open; closed them at the step end"));
    while (depth_ > 0) CloseSpan(now);
    UpdateWindow(now);
    FinishStep(now);
    return Misuse(std::move(st));
  }

  absl::Status BeginPhase(PhaseId phase) override {
    if (ABSL_PREDICT_FALSE(!PhaseCallOk(phase) || depth_ >= kMaxPhaseDepth)) {
      return BeginPhaseError(phase);
    }
    const int64_t now = clock_->NowNanos();
    OpenSpan(phase, now);
    UpdateWindow(now);
    return absl::OkStatus();
  }

  absl::Status EndPhase(PhaseId phase) override {
    const int64_t now = clock_->NowNanos();
    if (ABSL_PREDICT_FALSE(!PhaseCallOk(phase) || depth_ == 0 ||
                           open_phase_[depth_ - 1] != phase)) {
      return EndPhaseError(phase);
    }
    CloseSpan(now);
    UpdateWindow(now);
    return absl::OkStatus();
  }

  absl::Status EndPhaseAs(PhaseId phase, PhaseId recorded_as) override {
    if (auto st = CheckPhaseCall("EndPhaseAs", recorded_as); !st.ok()) return st;
    const int64_t now = clock_->NowNanos();
    if (!PhaseCallOk(phase) || depth_ == 0 || open_phase_[depth_ - 1] != phase) {
      return EndPhaseError(phase);
    }
    if (const uint16_t idx = open_span_[depth_ - 1]; idx != kNoSpan) {
      cur_->spans[idx].phase = recorded_as;
    }
    CloseSpan(now);
    UpdateWindow(now);
    return absl::OkStatus();
  }

  ABSL_ATTRIBUTE_NOINLINE ABSL_ATTRIBUTE_COLD absl::Status BeginStepError(int64_t step) {
    if (closed_.load(std::memory_order_relaxed)) return Misuse(Closed("BeginStep"));
    if (step_open_) {
      return Misuse(absl::FailedPreconditionError(
          absl::StrCat("BeginStep(", step, ") while step ", cur_->step, " is still open")));
    }
    return Misuse(absl::InvalidArgumentError(
        absl::StrCat("BeginStep(", step, "): not after the last step ", last_step_)));
  }

  ABSL_ATTRIBUTE_NOINLINE ABSL_ATTRIBUTE_COLD absl::Status BeginPhaseError(PhaseId phase) {
    if (auto st = CheckPhaseCall("BeginPhase", phase); !st.ok()) return st;
    return Misuse(absl::InvalidArgumentError(absl::StrCat(
        "BeginPhase(", static_cast<int>(phase), "): nesting deeper than ", kMaxPhaseDepth)));
  }

  ABSL_ATTRIBUTE_NOINLINE ABSL_ATTRIBUTE_COLD absl::Status EndPhaseError(PhaseId phase) {
    if (auto st = CheckPhaseCall("EndPhase", phase); !st.ok()) return st;
    {
      return Misuse(absl::InvalidArgumentError(absl::StrCat(
          "EndPhase(", PhaseName(phase), ") in step ", cur_->step, ": ",
          depth_ == 0
              ? std::string("no phase is open")
              : absl::StrCat("the innermost open phase is ", PhaseName(open_phase_[depth_ - 1])),
          "; phases must nest")));
    }
  }

  absl::Status RecordPhase(PhaseId phase, double seconds) override {
    const int64_t now = clock_->NowNanos();
    if (auto st = CheckPhaseCall("RecordPhase", phase); !st.ok()) return st;
    if (!std::isfinite(seconds) || seconds < 0) {
      return Misuse(absl::InvalidArgumentError(absl::StrCat(
          "RecordPhase(", PhaseName(phase), "): duration must be finite and >= 0, got ", seconds)));
    }
    if (depth_ >= kMaxPhaseDepth) {
      return Misuse(absl::InvalidArgumentError(absl::StrCat(
          "RecordPhase(", PhaseName(phase), "): nesting deeper than ", kMaxPhaseDepth)));
    }
    const auto dur = static_cast<int64_t>(std::llround(seconds * 1e9));
    const int64_t start = now - dur;
    if (start < sibling_end_[depth_]) {
      return Misuse(absl::InvalidArgumentError(absl::StrCat(
          "RecordPhase(", PhaseName(phase), ", ", seconds,
          " s): longer than the time since the enclosing phase began or the previous phase "
          "ended (",
          static_cast<double>(now - sibling_end_[depth_]) / 1e9, " s)")));
    }
    OpenSpan(phase, start);
    CloseSpan(now);
    return absl::OkStatus();
  }

  // ------------------------------------------------------------ any thread
  absl::Status Flush(absl::Duration timeout) override {
    const uint64_t target = head_.load(std::memory_order_acquire);
    absl::MutexLock l(&wake_mu_);
    if (worker_done_) return absl::OkStatus();
    flush_requests_ += 1;
    const uint64_t want = flush_requests_;
    const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) {
      return worker_done_ || (processed_ >= target && flushes_served_ >= want);
    };
    if (!wake_mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "telemetry flush: worker did not catch up within ", absl::FormatDuration(timeout)));
    }
    return absl::OkStatus();
  }

  StatsSnapshot Snapshot() const override {
    absl::MutexLock l(&mu_);
    return SnapshotOf(stats_, options_.stats.window);
  }

  absl::StatusOr<Forecast> LatestForecast() const override {
    absl::MutexLock l(&mu_);
    if (!options_.forecast_enabled) return absl::FailedPreconditionError("forecasting is off");
    if (!latest_.has_value()) return latest_error_;
    return *latest_;
  }

  TelemetryCounters Counters() const override {
    TelemetryCounters c;
    c.steps_recorded = static_cast<int64_t>(head_.load(std::memory_order_acquire));
    c.steps_dropped = dropped_.load(std::memory_order_relaxed);
    c.misuse_errors = misuse_.load(std::memory_order_relaxed);
    c.spans_truncated = truncated_.load(std::memory_order_relaxed);
    c.worker_wakeups = wakeups_.load(std::memory_order_relaxed);
    absl::MutexLock l(&mu_);
    c.steps_rejected = rejected_;
    c.steps_not_forecast = not_forecast_;
    c.forecasts_published = published_;
    c.export_errors = export_errors_;
    c.previous_steps_learned = previous_learned_;
    c.previous_log_status = previous_status_;
    c.last_error = last_error_;
    return c;
  }

  WindowNotice LatestWindow() const override { return window_->Latest(clock_->NowNanos()); }

  WindowOutlook LatestOutlook() const override {
    absl::MutexLock l(&outlook_mu_);
    WindowOutlook o = outlook_;
    o.writer_closed = closed_.load(std::memory_order_acquire);
    return o;
  }

  absl::Status AnnounceBusy(int64_t until_ns) override {
    if (until_ns < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("AnnounceBusy: until_ns must not be negative, got ", until_ns));
    }
    absl::MutexLock l(&outlook_mu_);
    if (closed_.load(std::memory_order_acquire)) return Closed("AnnounceBusy");
    outlook_.busy_until_ns = until_ns;
    outlook_.busy_announced_ns = until_ns > 0 ? clock_->NowNanos() : 0;
    window_->PublishOutlook(outlook_);
    ++outlook_.sequence;
    return absl::OkStatus();
  }

  PhaseCatalog Phases() const override {
    absl::MutexLock l(&mu_);
    return catalog_;
  }

  // Only options() may be read through this reference off the worker (they
  // never change); the model itself is read under mu_ (NextStepBounds).
  const Forecaster& forecaster() const override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return forecaster_;
  }

  absl::StatusOr<std::vector<StepBound>> NextStepBounds(int n) const override {
    absl::MutexLock l(&mu_);
    if (!options_.forecast_enabled) return absl::FailedPreconditionError("forecasting is off");
    return forecaster_.NextStepBounds(n);
  }

  absl::StatusOr<StepBound> SaveBound() const override {
    absl::MutexLock l(&mu_);
    if (!options_.forecast_enabled) return absl::FailedPreconditionError("forecasting is off");
    return forecaster_.SaveBound();
  }

  absl::Status Close() override {
    if (closed_.exchange(true)) {
      absl::MutexLock l(&mu_);
      return first_export_error_;
    }
    {
      absl::MutexLock l(&wake_mu_);
      stop_ = true;
    }
    if (worker_.joinable()) worker_.join();
    if (window_) window_->MarkClosed();  // the hooks write no notice from now on
    absl::MutexLock l(&mu_);
    if (log_) RecordExportError(log_->Close());
    if (trace_) RecordExportError(trace_->Close());
    return first_export_error_;
  }

 private:
  static absl::Status Closed(const char* what) {
    return absl::FailedPreconditionError(absl::StrCat(what, "() after Close()"));
  }

  std::string PhaseName(PhaseId p) const {
    absl::MutexLock l(&mu_);  // error path only
    return catalog_.Contains(p) ? catalog_.name(p) : absl::StrCat("#", static_cast<int>(p));
  }

  bool PhaseCallOk(PhaseId phase) const {
    return !closed_.load(std::memory_order_relaxed) && step_open_ &&
           phase < num_phases_.load(std::memory_order_acquire);
  }

  absl::Status CheckPhaseCall(const char* what, PhaseId phase) {
    if (closed_.load(std::memory_order_relaxed)) return Misuse(Closed(what));
    if (!step_open_) {
      return Misuse(absl::FailedPreconditionError(
          absl::StrCat(what, "(", PhaseName(phase), ") outside a step")));
    }
    if (phase >= num_phases_.load(std::memory_order_acquire)) {
      return Misuse(absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown phase id ", static_cast<int>(phase))));
    }
    return absl::OkStatus();
  }

  void OpenSpan(PhaseId phase, int64_t start) {
    uint16_t idx = kNoSpan;
    if (cur_->num_spans < kMaxSpansPerStep) {
      idx = cur_->num_spans++;
      PhaseSpan& s = cur_->spans[idx];
      s.start_ns = start;
      s.end_ns = start;
      s.phase = phase;
      s.depth = static_cast<uint8_t>(depth_);
    } else {
      cur_->spans_truncated = true;
    }
    open_span_[depth_] = idx;
    open_phase_[depth_] = phase;
    ++depth_;
    sibling_end_[depth_] = start;
  }

  void CloseSpan(int64_t now) {
    --depth_;
    const uint16_t idx = open_span_[depth_];
    if (idx != kNoSpan) cur_->spans[idx].end_ns = now;
    sibling_end_[depth_] = now;
  }

  // Window notices: the window is open while the innermost open phase is an
  // idle one. Called after the open phases changed; writes a notice only on a
  // transition (a seqlock record: no allocation, lock or I/O).
  void UpdateWindow(int64_t now) {
    const PhaseId inner = depth_ > 0 ? open_phase_[depth_ - 1] : PhaseId{0};
    const IdleKind kind =
        depth_ > 0 ? idle_kind_[inner].load(std::memory_order_relaxed) : IdleKind::kNone;
    if (window_open_ && (kind == IdleKind::kNone || inner != window_phase_)) {
      window_->CloseWindow(now);
      window_open_ = false;
    }
    if (!window_open_ && kind != IdleKind::kNone) {
      // Which window of this phase in the step (as ForEachPhaseWindow counts
      // them on the worker): a per-phase counter stamped with its step.
      if (window_count_step_[inner] != cur_->step) {
        window_count_step_[inner] = cur_->step;
        window_count_[inner] = 0;
      }
      window_->OpenWindow(inner, kind, cur_->step, window_count_[inner]++, now);
      window_open_ = true;
      window_phase_ = inner;
    }
  }

  absl::Status Misuse(absl::Status st) {
    misuse_.fetch_add(1, std::memory_order_relaxed);
    absl::MutexLock l(&mu_);
    last_error_ = st;
    return st;
  }

  void RecordExportError(const absl::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (st.ok()) return;
    ++export_errors_;
    last_error_ = st;
    if (first_export_error_.ok()) first_export_error_ = st;
  }

  // ------------------------------------------------------------ worker
  void WorkerLoop() {
    while (true) {
      bool stop = false;
      bool flush_pending = false;
      uint64_t flushes = 0;
      const absl::Duration wait = pacing_.Next(clock_->NowNanos(), options_.worker_poll,
                                               has_sinks_.load(std::memory_order_acquire));
      {
        absl::MutexLock l(&wake_mu_);
        const auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(wake_mu_) {
          return stop_ || flush_requests_ > flushes_served_;
        };
        wake_mu_.AwaitWithTimeout(absl::Condition(&wake), wait);
        wakeups_.fetch_add(1, std::memory_order_relaxed);
        stop = stop_;
        flushes = flush_requests_;
        flush_pending = flush_requests_ > flushes_served_;
      }
      const uint64_t before = tail_.load(std::memory_order_relaxed);
      const uint64_t done = Drain();
      MaybePublish(/*force=*/stop || flush_pending);
      if (done != before) PublishPhaseQuantiles();
      PublishWindowToSinks();
      PublishOutlookToSinks(/*last=*/stop);
      absl::MutexLock l(&wake_mu_);
      processed_ = done;
      flushes_served_ = flushes;
      if (stop) {
        worker_done_ = true;
        return;
      }
    }
  }

  uint64_t Drain() {
    uint64_t t = tail_.load(std::memory_order_relaxed);
    const uint64_t h = head_.load(std::memory_order_acquire);
    if (t == h) return t;
    if (previous_.has_value()) LearnPrevious(ring_[t & mask_]);
    absl::MutexLock l(&mu_);
    for (; t < h; ++t) {
      const StepRecord& rec = ring_[t & mask_];
      pacing_.Note(rec.start_ns, rec.end_ns);
      const bool warmup = stats_.warming_up();
      const absl::Status st = stats_.Add(rec);
      if (!st.ok()) {
        ++rejected_;
        last_error_ = st;
      } else {
        NoteIdleKinds(rec);
        if (options_.forecast_enabled && h - t > (mask_ + 1) / 2) {
          // More than half the ring behind: the forecaster, the costly part
          // (a model of the step each time), skips the step, so that the
          // worker catches up before the ring fills and drops steps from the
          // statistics, step log and trace as well. It learns from the
          // steps it sees, as from a sampled log.
          ++not_forecast_;
        } else if (options_.forecast_enabled) {
          forecaster_.Observe(rec, catalog_).IgnoreError();  // same checks as stats_.Add
        }
        if (!warmup) LearnWindows(rec);
        prev_step_ = rec.step;
        prev_end_ns_ = rec.end_ns;
      }
      if (log_) RecordExportError(log_->Append(rec, catalog_, warmup));
      if (trace_) RecordExportError(trace_->Append(rec, catalog_, warmup));
      ++unpublished_steps_;
      tail_.store(t + 1, std::memory_order_release);
    }
    if (log_) RecordExportError(log_->Flush());
    if (options_.forecast_enabled) {
      const absl::StatusOr<std::vector<StepBound>> next = forecaster_.NextStepBounds(1);
      pacing_.ExpectNext(next.ok() && !next->empty() ? next->front().lo_ns : 0);
    }
    return t;
  }

  // The tail of the previous run's step log, read before the first step is
  // drained (the worker thread, before its loop).
  void ReadPrevious() {
    if (previous_path_.empty()) return;
    absl::StatusOr<StepLog> tail = ReadStepLogTail(previous_path_, options_.learn_previous_steps);
    if (!tail.ok()) {
      absl::MutexLock l(&mu_);
      previous_status_ = tail.status();
      return;
    }
    previous_ = *std::move(tail);
  }

  // The previous run's steps before `first` (this run's first, in the ring:
  // the drain has not taken it yet), learned as Drain learns a step, with
  // the catalog as it is now (the phases are registered before the first
  // step). In batches, so that mu_ (NextStepBounds, Counters, the hooks'
  // error path) is never held for long: learning 1,024 steps takes ~80 ms.
  void LearnPrevious(const StepRecord& first) ABSL_LOCKS_EXCLUDED(mu_) {
    const StepLog previous = *std::move(previous_);
    previous_.reset();
    PhaseCatalog catalog;
    {
      absl::MutexLock l(&mu_);
      catalog = catalog_;
    }
    // While it learns, the hooks fill the ring: no more steps than take a
    // quarter of the ring's steps (the latest ones), so that the drain after
    // it is not far behind and a job of very short steps drops none. A step
    // as long as this run's first, or the previous run's median where that
    // is shorter (a first step that compiled kernels again is not the
    // rhythm).
    std::vector<int64_t> lengths;
    lengths.reserve(previous.steps.size());
    for (const StepRecord& r : previous.steps) lengths.push_back(r.duration_ns());
    int64_t step_ns = std::max<int64_t>(first.duration_ns(), 0);
    if (!lengths.empty()) {
      std::nth_element(lengths.begin(), lengths.begin() + lengths.size() / 2, lengths.end());
      step_ns = std::min(step_ns, lengths[lengths.size() / 2]);
    }
    const double budget =
        static_cast<double>(ring_.size()) / 4 * static_cast<double>(step_ns) / kLearnStepCostNs;
    const int most = static_cast<int>(std::min<double>(options_.learn_previous_steps, budget));
    absl::StatusOr<std::vector<StepRecord>> steps =
        PreviousRunSteps(previous, first, catalog, most);
    if (!steps.ok()) {
      absl::MutexLock l(&mu_);
      previous_status_ = absl::Status(
          steps.status().code(),
          absl::StrCat("not learned from ", previous_path_, ": ", steps.status().message()));
      return;
    }
    constexpr size_t kBatch = 32;
    for (size_t i = 0; i < steps->size(); i += kBatch) {
      absl::MutexLock l(&mu_);
      for (size_t j = i; j < std::min(i + kBatch, steps->size()); ++j) {
        const StepRecord& rec = (*steps)[j];
        if (!forecaster_.Observe(rec, catalog_).ok()) continue;
        ++previous_learned_;
        NoteIdleKinds(rec);
        LearnWindows(rec);
        prev_step_ = rec.step;
        prev_end_ns_ = rec.end_ns;
      }
    }
  }

  void MaybePublish(bool force) {
    std::optional<Forecast> forecast;
    std::optional<WindowOutlook> outlook;
    {
      absl::MutexLock l(&mu_);
      if (!options_.forecast_enabled || unpublished_steps_ == 0) return;
      const int64_t now = clock_->NowNanos();
      if (!force && options_.publish_interval_ns > 0 && has_published_ &&
          now - last_publish_ns_ < options_.publish_interval_ns) {
        return;
      }
      auto f = forecaster_.Predict(now);
      if (!f.ok()) {
        latest_error_ = f.status();
        if (!latest_.has_value()) return;
        latest_.reset();  // e.g. a new regime: the old forecast is dead
        WindowOutlook withdrawn;
        withdrawn.state = OutlookState::kWithdrawn;
        withdrawn.made_at_ns = now;
        for (size_t k = 0; k < withdrawn.next.size(); ++k) {
          withdrawn.next[k].last_seen_step = last_seen_step_[k];
        }
        outlook = withdrawn;
        raw_claims_.clear();
        published_claims_.clear();
      } else {
        unpublished_steps_ = 0;
        has_published_ = true;
        last_publish_ns_ = now;
        latest_ = *std::move(f);
        ++published_;
        forecast = latest_;
        outlook = OutlookOf(*latest_, options_.forecast.max_windows, last_seen_step_, &catalog_);
        ScaleClaims(*outlook);
      }
    }
    // The channel's outlook first: a guest deciding whether to wait reads it.
    PublishOutlook(*outlook);
    if (!forecast.has_value()) return;
    // Sinks run outside mu_: a slow or re-entrant sink (e.g. a Python
    // callback) never blocks the hooks' error path, Snapshot or Counters.
    ToSinks("forecast", [&](ForecastSink& sink) { return sink.Publish(*forecast); });
  }

  // The last step with an idle interval of each kind, as the forecaster sees
  // the step (ForEachIdleInterval, and the gap before it): whether its model knows a kind
  // (OutlookOf).
  void NoteIdleKinds(const StepRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ForEachIdleInterval(rec, catalog_, [&](const IdleInterval& iv) {
      const auto k = static_cast<size_t>(iv.kind);
      if (k < last_seen_step_.size()) last_seen_step_[k] = rec.step;
    });
    // A gap before the step that the forecaster counts as a window.
    PhaseWindow gap;
    if (GapWindowBefore(prev_step_, prev_end_ns_, rec, &gap) &&
        gap.end_ns - gap.start_ns >= options_.forecast.min_window_ns) {
      last_seen_step_[static_cast<size_t>(IdleKind::kHostSide)] = rec.step;
    }
  }

  // The worker's outlook, with the busy period announced last.
  void PublishOutlook(WindowOutlook o) {
    absl::MutexLock l(&outlook_mu_);
    o.sequence = outlook_.sequence + 1;
    o.busy_until_ns = outlook_.busy_until_ns;
    o.busy_announced_ns = outlook_.busy_announced_ns;
    window_->PublishOutlook(o);
    outlook_ = o;
  }

  // The durations of the windows the hooks announce: one per contiguous
  // stretch in which an idle phase is innermost, keyed by (phase, ordinal in
  // the step), so the remainder of a window reopened after nested busy work
  // comes from windows like it, not from the whole phase; and the gap
  // before the step when the step before it was the last record. A record
  // whose spans were truncated is not learned from (its windows are not all
  // there), its gap is.
  // A window matched to one of the published forecast claims also records
  // how that claim and the table's fared (ForecastClaimScale).
  void LearnWindows(const StepRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PhaseWindow gap;
    if (GapWindowBefore(prev_step_, prev_end_ns_, rec, &gap)) {
      LearnWindow(rec.step, gap);
      long_gaps_.Add(gap.end_ns - gap.start_ns >= options_.forecast.min_window_ns ? 1.0 : 0.0);
    }
    if (rec.spans_truncated) return;
    ForEachPhaseWindow(rec, catalog_, [&](const PhaseWindow& w) { LearnWindow(rec.step, w); });
  }

  void LearnWindow(int64_t step, const PhaseWindow& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int64_t d = w.end_ns - w.start_ns;
    const IdleKind kind =
        w.phase == kBetweenStepsPhase ? IdleKind::kHostSide : catalog_.idle_kind(w.phase);
    const int64_t g = ClaimFor(raw_claims_.data(), raw_claims_.data() + raw_claims_.size(), step,
                               w.phase, kind, w.ordinal);
    const DurationQuantiles& claimed_from =
        quantiles_[w.phase][static_cast<size_t>(WindowTableOf(w.ordinal))];
    const int64_t table = RemainingGivenElapsed(claimed_from, 0, options_.window_confidence);
    // What a reader was told at the open: the longer of the table's claim
    // and the scaled forecast claim the outlook published.
    const int64_t claimed = WithForecastClaim(
        table,
        ClaimFor(published_claims_.data(), published_claims_.data() + published_claims_.size(),
                 step, w.phase, kind, w.ordinal),
        0);
    if (g > 0) claim_scale_.Record(w.phase, w.ordinal, d, table, g);
    if (claimed > 0) claim_level_.Record(w.phase, w.ordinal, d >= claimed);
    WindowDurations(w.phase, w.ordinal).Add(static_cast<double>(d));
  }

  // The outlook's claims as the forecast states them are kept (to score
  // them once their windows are measured); the channel gets them scaled,
  // those scaled to nothing left out.
  void ScaleClaims(WindowOutlook& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    raw_claims_.assign(o.claims.begin(), o.claims.begin() + o.num_claims);
    int n = 0;
    for (const ForecastClaim& c : raw_claims_) {
      ForecastClaim scaled = c;
      scaled.guaranteed_ns = claim_scale_.Scaled(c.phase, c.ordinal, c.guaranteed_ns,
                                                 claim_level_.Confidence(c.phase, c.ordinal));
      if (scaled.guaranteed_ns > 0) o.claims[static_cast<size_t>(n++)] = scaled;
    }
    o.num_claims = n;
    published_claims_.assign(o.claims.begin(), o.claims.begin() + n);
  }

  RollingWindow& WindowDurations(PhaseId phase, int ordinal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return window_durations_[NoticeTableIndex(phase, ordinal)];
  }

  // Window notices (worker side): each idle phase's window duration
  // quantiles (per ordinal; none below window_min_samples) into the channel's
  // phase table, and each new notice to the sinks.
  void PublishPhaseQuantiles() {
    absl::MutexLock l(&mu_);
    for (int p = 0; p < catalog_.size(); ++p) {
      const auto id = static_cast<PhaseId>(p);
      for (int k = 0; k < kMaxWindowOrdinals; ++k) {
        SetQuantiles(id, k, catalog_.idle_kind(id) != IdleKind::kNone);
      }
    }
    // The gaps between steps: announced while one of the last gaps lasted
    // at least the forecast's min_window (shorter ones are no window).
    gap_notices_.store(long_gaps_.mean() > 0, std::memory_order_relaxed);
    SetQuantiles(kBetweenStepsPhase, 0, true);
    window_->PublishWindowQuantiles(catalog_, quantiles_);
  }

  // (phase, ordinal)'s quantiles from its window durations: none for a busy
  // phase or below window_min_samples.
  void SetQuantiles(PhaseId phase, int ordinal, bool idle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const RollingWindow& d = WindowDurations(phase, ordinal);
    DurationQuantiles& q = quantiles_[phase][static_cast<size_t>(ordinal)];
    q = !idle || d.size() < options_.window_min_samples ? DurationQuantiles{}
                                                        : ClaimableQuantilesOf(d.Values());
    q.claim_confidence = claim_level_.Confidence(phase, ordinal);
  }

  void PublishWindowToSinks() {
    const WindowNotice n = window_->Latest(clock_->NowNanos());
    if (n.sequence == last_window_sequence_) return;
    last_window_sequence_ = n.sequence;
    ToSinks("window", [&](ForecastSink& sink) { return sink.PublishWindow(n); });
  }

  // Calls `publish` on each sink (outside mu_), counting and keeping its
  // errors as export errors of `what` ("forecast sink <name>: ...").
  template <typename F>
  void ToSinks(const char* what, const F& publish) {
    absl::MutexLock s(&sinks_mu_);
    for (const auto& sink : sinks_) {
      const absl::Status st = publish(*sink);
      if (!st.ok()) {
        absl::MutexLock l(&mu_);
        RecordExportError(absl::Status(
            st.code(), absl::StrCat(what, " sink ", sink->Describe(), ": ", st.message())));
      }
    }
  }

  // The outlook to the sinks (store keys for guests on other hosts) when it
  // changed since the last time, and a last copy marked writer_closed when
  // the worker stops.
  void PublishOutlookToSinks(bool last) {
    WindowOutlook o;
    {
      absl::MutexLock l(&outlook_mu_);
      // Every worker wake-up asks: copy only what changed.
      if (!last && (outlook_.sequence == 0 || outlook_.sequence == last_outlook_sequence_)) return;
      o = outlook_;
    }
    last_outlook_sequence_ = o.sequence;
    o.writer_closed = last;
    o.published_ns = clock_->NowNanos();
    ToSinks("outlook", [&](ForecastSink& sink) { return sink.PublishOutlook(o); });
  }

  // Immutable after construction.
  const TelemetryOptions options_;
  const Clock* const clock_;
  std::vector<StepRecord> ring_;
  const uint64_t mask_;

  // Producer (training thread) state.
  StepRecord scratch_;
  StepRecord* cur_ = nullptr;
  bool cur_dropped_ = false;
  bool step_open_ = false;
  int64_t last_step_ = -1;
  int depth_ = 0;
  std::array<uint16_t, kMaxPhaseDepth> open_span_{};
  std::array<PhaseId, kMaxPhaseDepth> open_phase_{};
  std::array<int64_t, kMaxPhaseDepth + 1> sibling_end_{};  // end of the last span per depth
  uint64_t cached_tail_ = 0;
  bool window_open_ = false;
  PhaseId window_phase_ = 0;
  std::array<int, kMaxPhases> window_count_{};           // windows of each phase in the step
  std::array<int64_t, kMaxPhases> window_count_step_{};  // the step window_count_ counts
  bool gap_open_ = false;  // EndStep announced the gap before the next step
  // Written by RegisterPhase before num_phases_ is released; read by the hooks.
  std::array<std::atomic<IdleKind>, kMaxPhases> idle_kind_{};
  // Created in Start(); the hooks write notices, the worker the phase table.
  std::unique_ptr<WindowChannelWriter> window_;
  WindowQuantileTable quantiles_ ABSL_GUARDED_BY(mu_);
  uint64_t last_window_sequence_ = 0;   // worker
  uint64_t last_outlook_sequence_ = 0;  // worker
  internal::WorkerPacing pacing_;       // worker: its wait between looks at the ring
  // The outlook in the channel (the worker's forecasts, AnnounceBusy's busy
  // period): its writer is called under outlook_mu_, never with mu_ held.
  mutable absl::Mutex outlook_mu_;
  WindowOutlook outlook_ ABSL_GUARDED_BY(outlook_mu_);

  // Shared, lock-free.
  std::atomic<uint64_t> head_{0};
  std::atomic<uint64_t> tail_{0};
  std::atomic<int> num_phases_{phase::kNumBuiltin};
  std::atomic<bool> closed_{false};
  std::atomic<bool> has_sinks_{false};  // AddSink was called: the worker polls
  // The worker finds gaps between steps long enough to announce (EndStep).
  std::atomic<bool> gap_notices_{false};
  std::atomic<int64_t> misuse_{0}, dropped_{0}, truncated_{0};
  std::atomic<int64_t> wakeups_{0};  // written by the worker only

  // Worker and readers.
  mutable absl::Mutex mu_;
  PhaseCatalog catalog_ ABSL_GUARDED_BY(mu_);
  StepStats stats_ ABSL_GUARDED_BY(mu_);
  Forecaster forecaster_ ABSL_GUARDED_BY(mu_);  // learns on the worker
  // Window durations per (phase, ordinal): WindowDurations.
  std::vector<RollingWindow> window_durations_ ABSL_GUARDED_BY(mu_);
  // The forecast claims of the last outlook, unscaled and as published
  // (scaled), and how such claims fared (LearnWindows, ScaleClaims).
  std::vector<ForecastClaim> raw_claims_ ABSL_GUARDED_BY(mu_);
  std::vector<ForecastClaim> published_claims_ ABSL_GUARDED_BY(mu_);  // scaled, as published
  ForecastClaimScale claim_scale_ ABSL_GUARDED_BY(mu_);
  // The confidence the tables' claims are computed at (LearnWindows,
  // PublishPhaseQuantiles).
  NoticeClaimLevel claim_level_ ABSL_GUARDED_BY(mu_);
  // Lock order: sinks_mu_ before mu_.
  absl::Mutex sinks_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<std::unique_ptr<ForecastSink>> sinks_ ABSL_GUARDED_BY(sinks_mu_);
  std::unique_ptr<StepLogWriter> log_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<internal::TraceWriter> trace_ ABSL_GUARDED_BY(mu_);
  std::optional<Forecast> latest_ ABSL_GUARDED_BY(mu_);
  std::array<int64_t, kNumIdleKinds> last_seen_step_ ABSL_GUARDED_BY(mu_);  // NoteIdleKinds
  // Of the last `window` gaps between steps, 1 for each that lasted
  // min_window (the gap notices are on while one did; notice_replay.cc
  // replays the same rule).
  RollingWindow long_gaps_ ABSL_GUARDED_BY(mu_);
  // The last record learned from (LearnWindows: the gap before the next).
  int64_t prev_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t prev_end_ns_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status latest_error_ ABSL_GUARDED_BY(mu_) =
      absl::FailedPreconditionError("no forecast yet: no step has been processed");
  int64_t unpublished_steps_ ABSL_GUARDED_BY(mu_) = 0;
  bool has_published_ ABSL_GUARDED_BY(mu_) = false;
  int64_t last_publish_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t published_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t export_errors_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rejected_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t not_forecast_ ABSL_GUARDED_BY(mu_) = 0;
  // The previous run's log (LearnPrevious): where it was moved, its tail
  // until the first step is drained, and what was learned of it.
  std::string previous_path_;
  std::optional<StepLog> previous_;  // the worker's only
  int64_t previous_learned_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status previous_status_ ABSL_GUARDED_BY(mu_);
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
  absl::Status first_export_error_ ABSL_GUARDED_BY(mu_);

  absl::Mutex wake_mu_;
  bool stop_ ABSL_GUARDED_BY(wake_mu_) = false;
  bool worker_done_ ABSL_GUARDED_BY(wake_mu_) = false;
  uint64_t flush_requests_ ABSL_GUARDED_BY(wake_mu_) = 0;
  uint64_t flushes_served_ ABSL_GUARDED_BY(wake_mu_) = 0;
  uint64_t processed_ ABSL_GUARDED_BY(wake_mu_) = 0;

  std::thread worker_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Telemetry>> Telemetry::Create(const TelemetryOptions& options,
                                                             const Clock* clock) {
  if (clock == nullptr) return absl::InvalidArgumentError("telemetry clock is null");
  const int cap = options.ring_capacity;
  if (cap < 2 || cap > (1 << 20) || (cap & (cap - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring_capacity must be a power of two in [2, 1048576], got ", cap));
  }
  if (options.publish_interval_ns < 0) {
    return absl::InvalidArgumentError("publish_interval must not be negative");
  }
  if (!(options.window_confidence > 0 && options.window_confidence < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("window_confidence must be in (0, 1), got ", options.window_confidence));
  }
  if (options.window_min_samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("window_min_samples must be at least 1, got ", options.window_min_samples));
  }
  if (options.learn_previous_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "learn_previous_steps must not be negative, got ", options.learn_previous_steps));
  }
  if (options.worker_poll <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("worker_poll must be positive");
  }
  auto stats = StepStats::Create(options.stats);
  if (!stats.ok()) return stats.status();
  auto forecaster = Forecaster::Create(options.forecast);
  if (!forecaster.ok()) return forecaster.status();
  auto impl =
      std::make_unique<TelemetryImpl>(options, clock, *std::move(stats), *std::move(forecaster));
  if (auto st = impl->Start(); !st.ok()) return st;
  return impl;
}

}  // namespace omni
