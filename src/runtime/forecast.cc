// The forecaster's learning side: options, Observe (claims scored, regime
// checked, rhythm relearned) and the public facade. Publishing is in
// forecast_windows.cc; the model is described in omni/forecast.h.
#include "omni/forecast.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "forecast_impl.h"

namespace omni {

double PipelineBubbleFraction(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1) return 0;
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

namespace {

absl::Status CheckEvent(const PeriodicEvent& e, const char* name) {
  if (e.every_steps < 0 || e.offset < 0 || e.expected_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": every_steps, offset and expected_ns must not be negative"));
  }
  if (e.every_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": every_ns must not be negative, got ", e.every_ns));
  }
  if (e.every_ns > 0 && e.every_steps > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": every_steps ", e.every_steps, " and every_ns ", e.every_ns,
                     " both declared; an event comes by steps or by wall time, not both"));
  }
  if (e.every_steps > 0 && e.offset >= e.every_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": offset ", e.offset, " must be below every_steps ", e.every_steps));
  }
  if (e.wall_lag_steps < 0 || e.wall_lag_steps > PeriodicEvent::kMaxWallLagSteps) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": wall_lag_steps must be in [0, ",
                                                   PeriodicEvent::kMaxWallLagSteps, "], got ",
                                                   e.wall_lag_steps));
  }
  if (e.wall_lag_steps > 0 && e.every_ns == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": wall_lag_steps ", e.wall_lag_steps,
                     " without every_ns; a lag applies to an event by wall time"));
  }
  return absl::OkStatus();
}

constexpr size_t kMaxOccurrences = 8;
constexpr size_t kMaxLengths = 32;
// The longest rhythm of an event's lengths over its occurrences
// (LearnLengthRhythm) and its penalty: three times ChoosePeriod's default.
constexpr int kMaxOccurrencePeriod = 4;
constexpr double kOccurrencePenalty = 6.0;
// The normal quantile of a length rhythm's out-of-sample check
// (ClassesHoldOutOfSample).
constexpr double kRhythmCheckZ = 3.0;

}  // namespace

absl::Status ValidateForecastOptions(const ForecastOptions& o) {
  if (o.horizon_ns <= 0 || o.horizon_ns > kMaxForecastHorizonNs) {
    return absl::InvalidArgumentError(absl::StrCat("forecast horizon must be in (0, 2^61] ns (",
                                                   kMaxForecastHorizonNs, "), got ", o.horizon_ns,
                                                   " ns"));
  }
  if (!std::isfinite(o.k) || o.k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast k must be finite and >= 0, got ", o.k));
  }
  if (!std::isfinite(o.confidence) || o.confidence < 0 || o.confidence >= 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast confidence must be in [0, 1), got ", o.confidence));
  }
  // A k that states a confidence of 1 (erf(k/√2) rounds to 1 from k ≈ 8.375)
  // or of 0 (k = 0) leaves no quantile to claim at.
  if (o.confidence == 0 && (o.k == 0 || o.StatedConfidence() >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast k must state a confidence erf(k/sqrt(2)) in (0, 1), as k in (0, "
                     "8.3] does; got k = ",
                     o.k, ", a confidence of ", o.StatedConfidence()));
  }
  if (o.min_window_ns < 0) {
    return absl::InvalidArgumentError("forecast min_window must not be negative");
  }
  if (o.level_window <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast level_window must be positive, got ", o.level_window));
  }
  if (o.max_windows <= 0) {
    return absl::InvalidArgumentError("forecast max_windows must be positive");
  }
  if (o.history_steps < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast history_steps must be at least 8, got ", o.history_steps));
  }
  if (o.min_steps < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast min_steps must be at least 2, got ", o.min_steps));
  }
  if (o.max_period < 1 || o.max_period > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast max_period must be in [1, 256], got ", o.max_period));
  }
  if (auto st = CheckEvent(o.checkpoint, "checkpoint event"); !st.ok()) return st;
  if (auto st = CheckEvent(o.eval, "eval event"); !st.ok()) return st;
  const PipelineSchedule& p = o.pipeline;
  if (p.stages < 1 || p.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline stages (", p.stages,
                                                   ") and micro_batches (", p.micro_batches,
                                                   ") must be at least 1"));
  }
  if (p.stage < 0 || p.stage >= p.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", p.stage, " is outside [0, ", p.stages, ")"));
  }
  if (!std::isfinite(p.backward_over_forward) || p.backward_over_forward < 0) {
    return absl::InvalidArgumentError("pipeline backward_over_forward must be finite and >= 0");
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------------ Impl

namespace {

// burst_cal_'s gain: a miss after a miss widens the next such bound by half
// the last miss's excess, and 21 covered steps after a miss undo that.
// 1.0 widened more after chance misses where misses do not cluster (the
// median bound after a miss up to 1.27 times the others', against 1.18;
// Forecaster.AStepAfterAMissIsBoundedAsAnyOtherWhereMissesDoNotCluster).
constexpr double kBurstGain = 0.5;
// The share of α the step bounds aim to miss at (a margin of safety: the
// realised rate at least the stated one, not just about it).
constexpr double kBoundTargetShare = 0.6;

}  // namespace

Forecaster::Impl::Impl(const ForecastOptions& o)
    : opt_(o),
      conf_(o.StatedConfidence()),
      alpha_(1 - conf_),
      z_(TwoSidedZ(conf_)),
      z1_(TwoSidedZ(2 * conf_ - 1)) {
  // Claims aim above the stated confidence, so that the realised rate is at
  // least what is stated, not just about it (bounds more so: a missed step
  // bound is a missed deadline).
  window_cal_.fill(MarginCalibrator(0.75 * alpha_, 0.2));
  // A step bound's family gives up that margin of safety only as far as
  // misses no margin would catch take its place (MarginCalibrator's far
  // misses).
  bound_cal_.fill(MarginCalibrator(kBoundTargetShare * alpha_, 0.2, alpha_));
  local_cal_.fill(MarginCalibrator(kBoundTargetShare * alpha_, 0.2, alpha_));
  // The steps after a miss aim at the stated rate itself: where misses do
  // not cluster they miss as rarely as the others (at 0.6α, or up to 0.9α
  // where far misses relax the others' target), so the margin stays at or
  // below 0 (no widening) but for the covered steps it takes to undo a
  // chance miss after a miss.
  burst_cal_.fill(MarginCalibrator(alpha_, kBurstGain));
  for (auto& p : slot_period_) p.fill(1);
  dur_period_.fill(1);
}

void Forecaster::Impl::TrackDeclared(IdleKind kind, const StepRecord& rec, bool slot_present) {
  const PeriodicEvent& declared = kind == IdleKind::kCheckpoint ? opt_.checkpoint : opt_.eval;
  if (declared.every_steps <= 0 || !declared.OccursAt(rec.step)) return;
  // The event's phase, even without idle time of its own (busy work nested
  // over all of it), is the event.
  bool present = slot_present;
  for (int i = 0; !present && i < static_cast<int>(rec.num_spans); ++i) {
    present = catalog_.idle_kind(rec.spans[static_cast<size_t>(i)].phase) == kind;
  }
  int& misses = declared_misses_[kind == IdleKind::kCheckpoint ? 0 : 1];
  misses = present ? 0 : std::min(misses + 1, kDeclaredMissesToVoid);
}

bool Forecaster::Impl::EventAt(IdleKind kind, int64_t step) const {
  if (DeclaredEvent(kind).OccursAt(step)) return true;
  const Occurrences& o = occ_[SlotKey(kind, 0)];
  return (o.rule_valid && o.rule.OccursAt(step)) || (o.wall_step >= 0 && o.wall_step == step) ||
         o.InRun(step, last_step_);
}

void Forecaster::Impl::Occurrences::TrackRun(int64_t step, bool present, int64_t logged_before) {
  const auto close = [&](bool end_seen) {
    run_open = false;
    // A run cut by steps not logged may have gone on: its length is not
    // known, and pieces of it are no sample of the runs' length.
    if (!end_seen) return;
    run_lengths.push_back(run_last - run_start + 1);
    if (run_lengths.size() > kMaxRuns) run_lengths.pop_front();
    std::vector<int64_t> v(run_lengths.begin(), run_lengths.end());
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    run_length = v[v.size() / 2];
  };
  if (!present) {
    if (run_open) close(/*end_seen=*/logged_before == run_last);
    // A step the rule starts a run at that has none ends the rule.
    if (run_rule_valid && InRun(step, -1)) run_rule_valid = false;
    return;
  }
  // The steps since the last one logged were not logged: an eval loop
  // does not pause for a step or two (the run goes on across them) but
  // may have ended and started again in a longer gap.
  if (run_open &&
      (run_last == step - 1 || ((run_last > run_start || run_length >= 2) &&
                                run_last == logged_before && step - run_last - 1 <= kMaxRunGap))) {
    run_last = step;
    return;
  }
  if (run_open) close(/*end_seen=*/false);  // a gap in a sampled log
  run_open = true;
  run_start = run_last = step;
  run_start_lo = logged_before >= 0 ? logged_before + 1 : step;
  // The rule is learned from the starts the log shows (the step before
  // was logged without the event), across runs whose start it does not
  // show; where the rule starts a logged run with none, the rule ends
  // (above).
  if (run_start_lo != step) return;
  run_starts.push_back(step);
  if (run_starts.size() > kMaxRuns) run_starts.erase(run_starts.begin());
  run_rule = LearnSpacing(run_starts);
  if (run_rule.every == 0) run_rule = SpacingAcrossGaps(run_starts);
  run_rule_valid = run_rule.every > 0 && run_length >= 2;
}

bool Forecaster::Impl::Occurrences::InRun(int64_t step, int64_t last_step) const {
  const int64_t len = run_length;
  const bool open = run_open && run_last == last_step && step > run_last;
  // The first run, two steps long so far: it goes on one more step.
  if (len == 0 && open) return run_last > run_start && step == run_last + 1;
  if (len < 2) return false;
  if (open) return step < run_start_lo + len;
  if (!run_rule_valid) return false;
  const int64_t into =
      ((step - run_rule.offset) % run_rule.every + run_rule.every) % run_rule.every;
  return into < len && step - into > run_last;
}

StepKind Forecaster::Impl::KindAt(int64_t step) const {
  if (EventAt(IdleKind::kCheckpoint, step)) return StepKind::kCheckpoint;
  if (EventAt(IdleKind::kEval, step)) return StepKind::kEval;
  return StepKind::kNormal;
}

SlotMask Forecaster::Impl::RuleBits(int64_t step) const {
  SlotMask bits;
  for (const int key : rule_keys_) {
    if (occ_[key].rule.OccursAt(step)) bits.set(key);
  }
  return bits;
}

double Forecaster::Impl::NormalLevel() const {
  std::vector<double> v;
  for (const StepObs& o : hist_) {
    if (o.kind == StepKind::kNormal) v.push_back(static_cast<double>(o.duration()));
  }
  return v.empty() ? std::nan("") : QuantileInPlace(v, 0.5);
}

double Forecaster::Impl::ModelNormalLevel() const {
  if (!model_level_valid_) {
    model_level_ = NormalLevel();
    model_level_valid_ = true;
  }
  return model_level_;
}

double Forecaster::Impl::GapMean() const {
  if (gaps_.empty()) return 0;
  return std::accumulate(gaps_.begin(), gaps_.end(), 0.0) / static_cast<double>(gaps_.size());
}

absl::Status Forecaster::Impl::Observe(const StepRecord& rec, const PhaseCatalog& catalog) {
  if (auto st = ValidateStepRecord(rec, catalog); !st.ok()) return st;
  if (rec.step <= last_step_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "forecaster: step ", rec.step, " is not after the last one (", last_step_, ")"));
  }
  if (catalog.size() != catalog_.size()) catalog_ = catalog;
  if (first_step_ < 0) {
    first_step_ = rec.step;
    first_duration_ns_ = rec.duration_ns();
  }
  const bool consecutive = last_step_ >= 0 && rec.step == last_step_ + 1;
  StepObs obs =
      ReduceStep(rec, catalog_, opt_.pipeline, opt_.min_window_ns, consecutive ? last_end_ns_ : -1);
  obs.spikes = SpikesOf(obs);
  if (Ready()) {
    ScoreClaims(rec, obs, catalog_);
    TrackBurst(obs);
    CheckRegime(obs);
  }
  if (consecutive) {
    gaps_.push_back(static_cast<double>(obs.gap_ns));
    if (gaps_.size() > kRecentGaps) gaps_.pop_front();
  }
  hist_.push_back(obs);
  if (static_cast<int>(hist_.size()) > opt_.history_steps) EvictOldest();
  log_stride_ = -1;  // LogStride() of the history with this step
  LearnSpikes(obs);
  ++regime_steps_;
  Transient(obs);
  // Occurrences and learned events, per slot; the normal steps' level with
  // this step, for every event slot it has (computed once).
  double level = std::nan("");
  bool level_known = false;
  const auto level_now = [&] {
    if (!level_known) level = NormalLevel();
    level_known = true;
    return level;
  };
  for (int key = 0; key < kNumSlots; ++key) {
    Occurrences& o = occ_[key];
    const SlotObs* s = obs.Find(key);
    const bool event_slot =
        key == SlotKey(IdleKind::kEval, 0) || key == SlotKey(IdleKind::kCheckpoint, 0);
    if (event_slot) {
      o.TrackRun(rec.step, s != nullptr, last_step_);
      TrackDeclared(SlotKind(key), rec, s != nullptr);
    }
    if (s == nullptr) {
      if (o.rule_valid && o.rule.OccursAt(rec.step)) {
        o.rule_valid = false;
        o.failures = std::min(o.failures + 1, kMaxRuleFailures);
        o.confirmed_in_a_row = 0;
      }
      if (event_slot) TrackWallClock(SlotKind(key), rec, obs, nullptr, o);
      continue;
    }
    if (s->has_phase) slot_phase_[key] = catalog_.name(s->phase);
    o.steps.push_back(rec.step);
    if (o.total++ == 0) o.first = rec.step;
    if (o.steps.size() > kMaxOccurrences) o.steps.erase(o.steps.begin());
    const bool event = SlotKind(key) == IdleKind::kEval || SlotKind(key) == IdleKind::kCheckpoint;
    o.measured.push_back({static_cast<double>(s->b - s->a), event ? level_now() : std::nan(""),
                          static_cast<double>(s->a), rec.step});
    if (o.measured.size() > kMaxLengths) o.measured.pop_front();
    // A rule whose occurrence came where it said stays: every logged step
    // since it was learned has been checked against it (above). Learned
    // again, the last three occurrences would have to show it afresh, and
    // across an unlogged occurrence (a telemetry ring that dropped steps)
    // they span more than the history can vouch for when the spacing is
    // long (an eval every 200 steps: 999, 1199, then 1599 with 1399 not
    // logged, the history back to ~1030).
    const bool confirmed = o.rule_valid && o.rule.OccursAt(rec.step);
    if (confirmed && ++o.confirmed_in_a_row >= kConfirmedToForgive) {
      o.failures = std::max(o.failures - 1, 0);
      o.confirmed_in_a_row = 0;
    }
    if (!confirmed) {
      if (o.rule_valid) {  // it came where the rule did not say
        o.failures = std::min(o.failures + 1, kMaxRuleFailures);
        o.confirmed_in_a_row = 0;
      }
      o.rule = LearnSpacing(o.steps);
      // Two occurrences make a period only of an eval or a checkpoint, which
      // come on one far more often than not. A host-side pause or a stall
      // twice at random does not (a generated job's random host pauses at
      // steps 18 and 85 were claimed at 152, all 24 ms false).
      if (o.rule.every == 0 && o.total == 2 && event) {
        o.rule = SpacingFromTwo(o.steps, first_step_);
      }
      if (o.rule.every == 0) o.rule = SkippingOnlyUnloggedSteps(key, SpacingAcrossGaps(o.steps));
      if (o.rule.every == 0) o.rule = FractionalSpacing(o.steps);
    }
    const size_t n = o.steps.size();
    // After failures, a new rule must explain more of the last occurrences
    // than it was learned from: three, and one more per failure.
    if (!confirmed && o.rule.every > 0 && o.failures > 0) {
      const size_t m = 3 + static_cast<size_t>(o.failures);
      bool explained = n >= m;
      for (size_t i = n - std::min(n, m); explained && i < n; ++i) {
        explained = o.rule.OccursAt(o.steps[i]);
      }
      if (!explained) o.rule = {};
    }
    // Short spacings need a fourth occurrence: three equal gaps.
    if (o.rule.every > 0 && o.rule.every < 8 &&
        (n < 4 || o.steps[n - 3] - o.steps[n - 4] != o.rule.every)) {
      o.rule = {};
    }
    // Only rare slots are events (a slot in every logged step of a sampled
    // log is equally spaced too, but it is no event). In a log of every
    // k-th step, a rule at least 2k apart that names exactly the logged
    // steps with the slot is rare among the steps themselves: a checkpoint
    // every 20 steps is in every other step of a log of every 10th (its
    // 13 checkpoint steps were bounded as normal ones, 0 of 13 covered).
    if (o.rule.every > 0) {
      int present = 0;
      bool exact = true;
      for (const StepObs& h : hist_) {
        const bool here = h.Find(key) != nullptr;
        present += here ? 1 : 0;
        exact = exact && here == o.rule.OccursAt(h.step);
      }
      const int64_t k = LogStride();
      const bool rare_in_steps = exact && k > 1 && o.rule.every >= 2 * k;
      if (2 * present >= static_cast<int>(hist_.size()) && !rare_in_steps) o.rule = {};
    }
    // An event declared by wall time follows no step rule: its spacing in
    // steps wanders with the steps' lengths (69, 69, then 68 steps).
    if (event_slot && DeclaredEvent(SlotKind(key)).every_ns > 0) o.rule = {};
    o.rule_valid = o.rule.every > 0;
    if (event_slot) TrackWallClock(SlotKind(key), rec, obs, s, o);
    if (event) LearnLengthRhythm(key, o);
  }
  rule_keys_.clear();
  for (int key = 0; key < kNumSlots; ++key) {
    if (occ_[key].rule_valid) rule_keys_.push_back(key);
  }
  TrimWarmup();
  if (last_step_ >= 0) stride_ = rec.step - last_step_;
  last_step_ = rec.step;
  last_end_ns_ = rec.end_ns;
  UpdateWallSteps();
  ForgetModels();
  const int every = hist_.size() < 64 ? 4 : 16;
  if (++since_learn_ >= every) Relearn();
  return absl::OkStatus();
}

Forecaster::Impl::WallClockScale Forecaster::Impl::WallClockScaleNow() const {
  WallClockScale w;
  std::vector<double> normal;
  for (const StepObs& h : hist_) {
    const auto d = static_cast<double>(h.duration());
    w.d_max = std::max(w.d_max, d);
    if (h.kind == StepKind::kNormal) normal.push_back(d);
  }
  if (normal.empty()) return w;
  w.d_min = *std::min_element(normal.begin(), normal.end());
  for (const double g : gaps_) w.g_max = std::max(w.g_max, g);
  w.tol = std::max({1e6, 0.02 * QuantileInPlace(normal, 0.5), w.g_max});
  w.ok = true;
  return w;
}

void Forecaster::Impl::TrackWallClock(IdleKind kind, const StepRecord& rec, const StepObs& obs,
                                      const SlotObs* s, Occurrences& o) const {
  const bool after_last = obs.step == last_step_ + 1;
  const PeriodicEvent& declared = DeclaredEvent(kind);
  if (declared.every_steps > 0) return;  // declared: its steps are known
  if (s == nullptr) {
    if (!o.timed.empty()) {
      o.quiet_recent.push_back({obs.step, obs.start_ns, obs.end_ns});
      if (o.quiet_recent.size() > static_cast<size_t>(PeriodicEvent::kMaxWallLagSteps) + 1) {
        o.quiet_recent.pop_front();
      }
    }
    o.all_logged_since = o.all_logged_since && after_last;
    return;
  }
  TimedOccurrence t;
  t.step = obs.step;
  t.start_ns = obs.start_ns;
  // The event's phase, not its idle time: busy work nested first (an
  // eval's forward pass) is part of the event, after the step's training
  // work.
  t.event_a_ns = obs.start_ns + s->a;
  t.event_b_ns = obs.start_ns + s->b;
  bool found = false;
  for (int i = 0; i < static_cast<int>(rec.num_spans); ++i) {
    const PhaseSpan& p = rec.spans[static_cast<size_t>(i)];
    if (p.depth != 0 || catalog_.idle_kind(p.phase) != kind) continue;
    if (!found) t.event_a_ns = p.start_ns;
    t.event_b_ns = p.end_ns;
    found = true;
  }
  if (!o.quiet_recent.empty()) {
    t.quiet_step = o.quiet_recent.back().step;
    t.quiet_start_ns = o.quiet_recent.back().start_ns;
    t.quiet_end_ns = o.quiet_recent.back().end_ns;
  }
  t.all_logged = o.all_logged_since && after_last;
  o.timed.push_back(t);
  if (o.timed.size() > static_cast<size_t>(kMaxWallClockPairs) + 1) o.timed.pop_front();
  o.quiet_recent.clear();
  o.all_logged_since = true;
  o.wall_in_use = false;
  if (declared.every_ns > 0) {
    // Declared by wall time: its rule is known from the first occurrence
    // (the timer checked where a step's work ends and restarted as the event
    // began); a logged step that contradicts it drops it until the next.
    o.wall = {};
    WallClockRule& r = o.wall[static_cast<size_t>(WallClockCheck::kWorkEnd)];
    r.check = WallClockCheck::kWorkEnd;
    r.t_lo = declared.every_ns - 1;
    r.t_hi = declared.every_ns;
    r.pairs = kMinWallClockPairs;
    r.lag = declared.wall_lag_steps;
    o.wall_in_use = true;
    o.rule_valid = false;
    return;
  }
  const WallClockScale w = WallClockScaleNow();
  // Every check over the whole window; where none fits (a period that
  // changed breaks them all, a check the job does not use only itself),
  // over the latest run that fits.
  int pairs = 0;
  for (const bool latest_run : {false, true}) {
    for (int c = 0; c < kNumWallClockChecks && w.ok; ++c) {
      WallClockRule& r = o.wall[static_cast<size_t>(c)];
      r = LearnWallClock(o.timed, static_cast<WallClockCheck>(c), static_cast<int64_t>(w.tol),
                         latest_run);
      pairs = std::max(pairs, r.pairs);
    }
    if (pairs > 0 || !w.ok) break;
  }
  if (pairs == 0) return;
  // A step rule stays where it puts the event at every occurrence the
  // wall-clock rules were learned from (a checkpoint every 100 steps of
  // steady length fits both; the step rule sees further ahead), or where
  // their bounds agree only within the tolerance (steps of one length
  // make the spacings in steps and in time one: 20, 20, 21, 20 steps fit a
  // period of exactly 20 steps' time).
  bool explained = o.rule_valid;
  for (size_t i = o.timed.size() - static_cast<size_t>(pairs) - 1; explained && i < o.timed.size();
       ++i) {
    explained = o.rule.OccursAt(o.timed[i].step);
  }
  bool strict = false;
  for (const WallClockRule& r : o.wall) strict = strict || (r.valid() && r.t_lo < r.t_hi);
  // Nor does a step rule give way where every wall-clock rule needs
  // occurrences the log does not show: an eval every 50 steps, then every
  // 30, logged every 5th step, fits "every 6 s" if an unlogged eval came
  // between each two of the old ones, and the step rule every 30 needs none
  // (the wall-clock rule named no step: 5 evals after the change bounded as
  // normal steps, next-step coverage 0.947-0.954 over 4 seeds).
  bool unseen = true;
  for (const WallClockRule& r : o.wall) unseen = unseen && (!r.valid() || r.skips > 0);
  if (explained || (o.rule_valid && (!strict || unseen))) return;
  o.wall_in_use = true;
  o.rule_valid = false;
}

void Forecaster::Impl::UpdateWallSteps() {
  Occurrences& eval = occ_[SlotKey(IdleKind::kEval, 0)];
  Occurrences& ckpt = occ_[SlotKey(IdleKind::kCheckpoint, 0)];
  eval.wall_step = ckpt.wall_step = -1;
  if (!eval.wall_in_use && !ckpt.wall_in_use) return;
  const WallClockScale w = WallClockScaleNow();
  if (!w.ok) return;
  UpdateWallStep(eval, w);
  UpdateWallStep(ckpt, w);
}

void Forecaster::Impl::UpdateWallStep(Occurrences& o, const WallClockScale& w) const {
  if (!o.wall_in_use || o.timed.empty()) return;
  int64_t agreed = -1;
  bool any = false, sure = true;
  for (WallClockRule& r : o.wall) {
    if (!r.valid()) continue;
    const int64_t k = WallStep(o, r, w);
    if (!r.valid()) continue;  // WallStep found it wrong
    if (k < 0 || (any && k != agreed)) sure = false;
    agreed = k;
    any = true;
  }
  if (!any) o.wall_in_use = false;
  if (any && sure) o.wall_step = agreed;
}

int64_t Forecaster::Impl::WallStep(const Occurrences& o, WallClockRule& r,
                                   const WallClockScale& w) const {
  const auto anchor = static_cast<double>(r.Anchor(o.timed.back()));
  const double fires = anchor + static_cast<double>(r.t_hi) + w.tol;  // surely from here
  const double quiet = anchor + static_cast<double>(r.t_lo) - w.tol;  // surely before this
  // Logged step `step` without the event (nullptr: not logged, or the last
  // occurrence's or before).
  const auto quiet_at = [&](int64_t step) -> const Occurrences::Quiet* {
    for (const Occurrences::Quiet& q : o.quiet_recent) {
      if (q.step == step) return &q;
    }
    return nullptr;
  };
  const auto check_of = [&](const Occurrences::Quiet& q) {
    return static_cast<double>(r.QuietCheck(q.start_ns, q.end_ns));
  };
  if (!o.quiet_recent.empty()) {
    const Occurrences::Quiet& newest = o.quiet_recent.back();
    const double check = check_of(newest);
    // The step whose check put the event at the newest logged step without it.
    const Occurrences::Quiet* trigger = quiet_at(newest.step - r.lag);
    if (trigger != nullptr && check_of(*trigger) >= fires && o.all_logged_since) {
      // A logged step without the event where the rule put it: the rule
      // is wrong (the next occurrence learns again).
      r = {};
      return -1;
    }
    // Steps not logged since the last occurrence may have had it (the
    // timer restarted where the log does not show): none is sure until the
    // next logged one.
    if (check >= quiet && !o.all_logged_since) return -1;
  }
  // The next steps' check times, from the last logged end: each step at
  // least the shortest normal step, at most the longest step and gap of
  // the history.
  const double work_lo = r.check == WallClockCheck::kStepStart ? 0 : w.d_min;
  const double work_hi = r.check == WallClockCheck::kStepStart ? 0 : w.d_max;
  // A lagged rule: the steps already logged whose event is still to come
  // (the last `lag` ones since the occurrence), in order; the first whose
  // check surely fires puts it `lag` steps on.
  for (int64_t k = std::max(last_step_ - r.lag + 1, o.timed.back().step + 1); k <= last_step_;
       ++k) {
    const Occurrences::Quiet* q = quiet_at(k);
    if (q == nullptr) return -1;  // not logged: its check is unknown
    const double check = check_of(*q);
    if (check >= fires) return k + r.lag;
    if (check >= quiet) return -1;
  }
  const auto last_end = static_cast<double>(last_end_ns_);
  for (int64_t k = last_step_ + 1; k <= last_step_ + std::max<int64_t>(stride_, 1); ++k) {
    const auto before = static_cast<double>(k - last_step_ - 1);
    if (k > last_step_ + 1) {
      // Step k − 1 is not logged: its check must come before the event can.
      const double prev_hi = last_end + w.g_max + (before - 1) * (w.d_max + w.g_max) + work_hi;
      if (prev_hi >= quiet) return -1;
    }
    if (last_end + before * w.d_min + work_lo >= fires) return k + r.lag;
  }
  return -1;
}

void Forecaster::Impl::LearnLengthRhythm(int key, Occurrences& o) const {
  o.length_period = 1;
  SpacingRule spacing = o.rule_valid ? o.rule : SpacingRule{};
  if (spacing.every == 0) {
    const PeriodicEvent& declared = DeclaredEvent(SlotKind(key));
    spacing = {declared.every_steps, declared.offset};
  }
  o.length_spacing = spacing;
  if (spacing.every <= 0 || o.measured.size() < 2 * kMinOccurrencesPerClass) return;
  std::vector<int64_t> index;
  std::vector<double> lengths;
  for (const Occurrences::Measured& m : o.measured) {
    index.push_back(spacing.Index(m.step));
    lengths.push_back(m.length);
  }
  o.length_period = ChoosePeriod(index, lengths, kMaxOccurrencePeriod, kOccurrencePenalty,
                                 static_cast<int>(kMinOccurrencesPerClass));
  // A rhythm claims each class's lengths for its next occurrence: it must
  // hold each class's measured ones from the others of their class, or
  // noise bought it (lengths of one distribution that happened to split).
  if (o.length_period > 1 &&
      !ClassesHoldOutOfSample(index, lengths, o.length_period, kRhythmCheckZ, kLengthPriorCv)) {
    o.length_period = 1;
  }
}

SlotMask Forecaster::Impl::SpikesOf(const StepObs& obs) const {
  SlotMask bits;
  for (int i = 0; i < obs.num_slots; ++i) {
    const SlotObs& s = obs.slots[static_cast<size_t>(i)];
    const double reference = spikes_[static_cast<size_t>(s.key)].reference;
    const auto length = static_cast<double>(s.b - s.a);
    if (reference > 0 && length >= kSpikeFactor * reference &&
        length - reference >= static_cast<double>(opt_.min_window_ns)) {
      bits.set(s.key);
    }
  }
  return bits;
}

int64_t Forecaster::Impl::SlotLength(const StepObs& o, int key) {
  const SlotObs* s = o.Find(key);
  return s != nullptr ? s->b - s->a : 0;
}

void Forecaster::Impl::LearnSpikes(const StepObs& obs) {
  spike_mask_ = SlotMask();
  // The first step of the current regime (earlier when the history is
  // full): regime_steps_ does not count `obs` yet.
  const auto h = static_cast<int64_t>(hist_.size());
  const int64_t in_regime = regime_steps_ + 1;
  const int64_t since = in_regime >= h ? std::numeric_limits<int64_t>::min()
                                       : hist_[static_cast<size_t>(h - in_regime)].step;
  for (int key = 0; key < kNumSlots; ++key) {
    Spikes& sp = spikes_[static_cast<size_t>(key)];
    while (!sp.kept.empty() && sp.kept.front().step < since) sp.kept.pop_front();
    if (sp.kept.empty()) sp.restarts = false;  // a new regime: learned again
    const bool spiked = obs.spikes.test(key);
    sp.event_since_spike = !spiked && (sp.event_since_spike || obs.kind != StepKind::kNormal);
    if (spiked) {
      sp.kept.push_back(obs);
      // The rule is the major spikes': a loader's 300 ms stall every 150
      // steps among waits of 9-12 ms that pass the spike test now and then
      // (4x a 2 ms median) had no rule while a minor spike was kept. The
      // oldest minor spike leaves first.
      int64_t longest = 0;
      for (const StepObs& o : sp.kept) longest = std::max(longest, SlotLength(o, key));
      const auto is_major = [&](const StepObs& o) {
        return SlotLength(o, key) * kMajorSpikeShare >= longest;
      };
      if (sp.kept.size() > kKeptSpikes) {
        const auto minor = std::find_if_not(sp.kept.begin(), sp.kept.end(), is_major);
        sp.kept.erase(minor != sp.kept.end() ? minor : sp.kept.begin());
      }
      std::vector<int64_t> major;
      for (const StepObs& o : sp.kept) {
        if (is_major(o)) major.push_back(o.step);
      }
      const size_t n = major.size();
      std::vector<int64_t> last(major.end() - static_cast<std::ptrdiff_t>(std::min<size_t>(n, 3)),
                                major.end());
      SpacingRule rule = LearnSpacing(last);
      if (rule.every > 0 && rule.every < kMinSpacingFromTwo &&
          (n < 4 || major[n - 3] - major[n - 4] != rule.every)) {
        rule = {};
      }
      // A loader refilled at each epoch of 62.5 steps stalls 62 and 63
      // steps apart in turn (a recorded PyTorch LM trainer).
      if (rule.every == 0) rule = FractionalSpacing(major);
      // Every major spike is on the rule; or, where the rhythm restarted at
      // an eval or checkpoint (a loader made again after each eval), the
      // last four or more are, with such a step between the last one off it
      // and the first one on it.
      size_t from = 0;
      for (size_t i = n; i-- > 0;) {
        if (!rule.OccursAt(major[i])) {
          from = i + 1;
          break;
        }
      }
      if (rule.every > 0 && from > 0) {
        if (n - from >= 4 && EventStepIn(major[from - 1], major[from])) {
          sp.restarts = true;
        } else {
          rule = {};
        }
      }
      // And the steps it names spiked: of those in the history since the
      // first kept major spike, at least 1 − α/2. Spikes at random, 3% of
      // the steps, leave 8 majors on one spacing now and then (all on odd
      // steps: a rule of every other step, of whose steps 5% had spiked;
      // the next one was claimed for 27 ms and ran 4).
      if (rule.every > 0 && !major.empty()) {
        int named = 0, spiked_named = 0;
        for (const StepObs& past : hist_) {
          if (past.step < major[from] || !rule.OccursAt(past.step)) continue;
          ++named;
          spiked_named += past.spikes.test(key) ? 1 : 0;
        }
        if (static_cast<double>(spiked_named) < (1 - alpha_ / 2) * named) rule = {};
      }
      sp.rule = rule;
      sp.rule_valid = rule.every > 0;
    } else if (sp.rule_valid && sp.rule.OccursAt(obs.step)) {
      sp.rule_valid = false;  // a step it names did not spike
    }
    // A spacing within max_period is the residue classes' to learn (from
    // hundreds of steps, not kKeptSpikes); until they have a period, the
    // rule's (a stall every 60 steps: forecast from its third on, not from
    // when 180 steps had been relearned).
    const bool residues_learned = slot_period_[static_cast<int>(StepKind::kNormal)][key] > 1;
    // (The residue classes of a rhythm that restarts at each event mix its
    // phases: the rule's then.)
    if (sp.rule_valid && (sp.rule.every > opt_.max_period || !residues_learned || sp.restarts) &&
        !ResiduesSeparateSpikes(key)) {
      spike_mask_.set(key);
    }
  }
}

bool Forecaster::Impl::ResiduesSeparateSpikes(int key) const {
  const int period = slot_period_[static_cast<int>(StepKind::kNormal)][key];
  if (period <= 1) return false;
  const std::deque<StepObs>& kept = spikes_[static_cast<size_t>(key)].kept;
  const SpacingRule& rule = spikes_[static_cast<size_t>(key)].rule;
  const auto spiking_class = [&](int64_t step) {
    for (const StepObs& o : kept) {
      if (rule.OccursAt(o.step) && o.step % period == step % period) return true;
    }
    return false;
  };
  for (const StepObs& o : hist_) {
    if (o.kind == StepKind::kNormal && !o.spikes.test(key) && spiking_class(o.step)) {
      return false;
    }
  }
  return true;
}

SlotMask Forecaster::Impl::SpikeBits(int64_t step) const {
  SlotMask bits;
  spike_mask_.ForEach([&](int key) {
    const Spikes& sp = spikes_[static_cast<size_t>(key)];
    if (!sp.rule.OccursAt(step)) return;
    // A rhythm that restarts at each eval or checkpoint is not claimed past
    // the next one (its phase there is unknown), nor after the last one
    // until it has spiked since (logged every 5th step, a stall every 4th
    // counted from each eval was claimed on its old phase after every
    // eval: 20 of 20 claims there false, precision 0.79).
    if (sp.restarts && step > last_step_ &&
        (sp.event_since_spike || step > NextEvalOrCheckpoint(last_step_ + 1))) {
      return;
    }
    bits.set(key);
  });
  return bits;
}

bool Forecaster::Impl::EventStepIn(int64_t a, int64_t b) const {
  return std::any_of(hist_.begin(), hist_.end(), [&](const StepObs& h) {
    return h.step >= a && h.step < b && h.kind != StepKind::kNormal;
  });
}

SpacingRule Forecaster::Impl::SkippingOnlyUnloggedSteps(int key, SpacingRule rule) const {
  const std::vector<int64_t>& occ = occ_[key].steps;
  if (rule.every == 0 || occ.size() < 3 || hist_.empty()) return {};
  const int64_t from = occ[occ.size() - 3], to = occ.back();
  if (from < hist_.front().step) return {};  // steps older than the history: unknown
  for (const StepObs& h : hist_) {
    if (h.step > from && h.step < to && rule.OccursAt(h.step) && h.Knows(key) &&
        h.Find(key) == nullptr) {
      return {};
    }
  }
  return rule;
}

void Forecaster::Impl::ScoreClaims(const StepRecord& rec, const StepObs& obs,
                                   const PhaseCatalog& catalog) {
  std::array<IdleInterval, 2 * kMaxSpansPerStep + 3> idle{};
  int n = 0;
  if (rec.step == last_step_ + 1 && rec.start_ns > last_end_ns_) {  // the gap before it
    idle[n++] = {last_end_ns_, rec.start_ns, IdleKind::kHostSide};
  }
  ForEachIdleInterval(rec, catalog, [&](const IdleInterval& iv) {
    if (n > 0 && idle[n - 1].end_ns == iv.start_ns) {
      idle[n - 1].end_ns = iv.end_ns;  // adjacent idle of another kind: one idle stretch
    } else if (n < static_cast<int>(idle.size())) {
      idle[n++] = iv;
    }
  });
  // A window's loss is the fraction of its claimed time (the sure part and
  // the guaranteed length from its actual open, RealiseClaim) that was not
  // idle: the calibrated quantity is then the one replay measures
  // (time-weighted precision), not the all-or-nothing cover of each window.
  std::array<ClaimInterval, 2> parts{};
  for (const WindowClaim& c : claims_) {
    if (c.step != rec.step) continue;
    const int np = RealiseClaim(c, obs, parts);
    int64_t claimed = 0, idle_ns = 0;
    for (int p = 0; p < np; ++p) {
      claimed += parts[p].b - parts[p].a;
      for (int i = 0; i < n; ++i) {
        idle_ns += std::max<int64_t>(
            std::min(idle[i].end_ns, parts[p].b) - std::max(idle[i].start_ns, parts[p].a), 0);
      }
    }
    if (claimed <= 0) continue;
    window_cal_[static_cast<int>(SlotKind(c.key))].UpdateLoss(
        1.0 - static_cast<double>(idle_ns) / static_cast<double>(claimed),
        static_cast<double>(claimed));
  }
  claims_.erase(std::remove_if(claims_.begin(), claims_.end(),
                               [&](const WindowClaim& c) { return c.step <= rec.step; }),
                claims_.end());
}

namespace {

// How far beyond its marginal bound, in widths of the bound, a step must be
// to count towards a regime change (CheckRegime).
constexpr double kRegimeMissMargin = 0.25;
// A new regime when this many of the last kScatterSteps steps missed their
// bound clearly, on either side (ScatteredMisses).
constexpr int kScatterSteps = 20;
constexpr int kScatterMisses = 5;
// A normal step this many times its bound's upper end begins a new regime
// at once (CheckRegime: a restart).
constexpr double kRestartFactor = 20;
// How many steps after a run's first one keep the bound they had before it
// (CheckRegime's run reference).
constexpr int kRunRefSteps = 6;
// A step this many spreads (q90 − q10 of its bound's sample) beyond its
// bound is a far miss (FarMiss): GC pauses of 100-300 ms on steps of
// 150 ± 5 ms are 10-30 spreads beyond; a lognormal wait of σ 1 passes its
// 0.97 quantile by 3 spreads 0.3 % of the time.
constexpr double kFarSpreads = 3;

}  // namespace

void Forecaster::Impl::CheckRegime(const StepObs& obs) {
  // An event step of a kind this regime has not measured has no bound of its
  // own (the normal steps' stands in for it): its length is news, not a miss.
  // Counted, an undeclared checkpoint followed by two slow steps (the write
  // contending with training) made a "change" whose steps the transient
  // rule then dropped, the checkpoint with them: it was never learned.
  const auto of_kind = [&](const StepObs& o) { return o.kind == obs.kind; };
  if (obs.kind != StepKind::kNormal && std::none_of(hist_.begin(), hist_.end(), of_kind) &&
      std::none_of(kept_events_.begin(), kept_events_.end(), of_kind)) {
    return;
  }
  const auto d = static_cast<double>(obs.duration());
  // The published bound (local-level where it applied) is scored by its own
  // calibrator; the regime is judged against the marginal bound, which a
  // drifting level does not leave.
  double lo = 0, hi = 0;
  bool local = false;
  if (UnwidenedBound(obs.step, lo, hi, &local, nullptr) && local) {
    local_cal_[static_cast<int>(obs.kind)].Update(d > hi || d < lo,
                                                  FarMiss(obs.step, d, lo, hi, true));
  }
  if (LevelShift(obs)) return;
  // The calibrator scores the published upper end; the regime is judged
  // against type 7's (`fit`), which a few steps of a new level do not move.
  double fit = 0;
  if (!MarginalBound(obs.step, lo, hi, fit)) return;
  // A step of another kind than the one predicted for it (its bound was
  // that kind's) is a miss of the bound, but no sign of a new regime: an
  // eval loop logged as 30 eval steps every 500 made a "change" of its
  // first three steps, and the regime started again at every loop.
  MarginCalibrator& cal = bound_cal_[static_cast<int>(obs.kind)];
  const bool far = FarMiss(obs.step, d, lo, hi, false);
  if (obs.kind != KindAt(obs.step)) {
    cal.Update(d > hi || d < lo, far);
    return;
  }
  if (obs.kind == StepKind::kNormal && d > kRestartFactor * fit) {
    // A step far beyond any the regime makes: the job restarted (its
    // kernels compiled again, on a device that may be slower or faster),
    // or a stall as long. A new regime begins with it, as a new process's
    // forecaster would, and nothing is published from the old one until
    // the new one has min_steps steps; the old one comes back if the steps
    // after fit it (Transient: a stall). Three misses, the two after the
    // restart counted, were needed before (the restart trace's next-step
    // coverage below the claim on 2 of 8 fresh draws).
    cal.Update(d > hi, far);
    KeepPriorRegime(obs.step, {obs.step});
    hist_.clear();
    BeginRegime();
    return;
  }
  cal.Update(d > hi || d < lo, far);
  // A run's later steps are judged against the bound their steps had
  // before it began (KeepRunReference): the run's own steps, in the sample,
  // pull the quantile towards them (30 steady steps, then steps twice as
  // long: with two of them among 32, type 7's quantile at 0.964 lay 0.88 of
  // the way into them, the third was no clear miss, and no change came).
  const int64_t stride = std::max<int64_t>(stride_, 1);
  const int64_t ahead = (obs.step - run_ref_from_) / stride;
  if (run_len_ > 0 && ahead >= 0 && ahead < static_cast<int64_t>(run_ref_.size()) &&
      (obs.step - run_ref_from_) % stride == 0) {
    const auto& [ref_lo, ref_fit] = run_ref_[static_cast<size_t>(ahead)];
    if (!std::isnan(ref_fit)) {
      lo = ref_lo;
      fit = ref_fit;
    }
  }
  const int miss = d > fit ? 1 : (d < lo ? -1 : 0);
  const double margin = kRegimeMissMargin * (fit - lo);
  const bool clear = d > fit + margin || d < lo - margin;
  recent_.emplace_back(obs.step, clear);
  if (static_cast<int>(recent_.size()) > kScatterSteps) recent_.pop_front();
  if (clear && ScatteredMisses()) return;
  if (miss == 0) {
    run_len_ = 0;
    run_side_ = 0;
    suspect_ = outlier_ = false;
    return;
  }
  // Evidence of a new regime is a clear miss: beyond the bound by a part of
  // its width. A bound drawn from a few steps of a residue class (a rhythm
  // the log only seemed to have) is missed by a hair when the rhythm does
  // not hold; three such misses would forget all that was learned, the
  // events' lengths with it (seen: three false changes in the demo's 1,000
  // steps, each leaving its next eval unclaimed). A slight miss is counted by
  // the calibrator and is evidence of neither regime.
  const int side = d > fit + margin ? 1 : (d < lo - margin ? -1 : 0);
  if (side == 0) {
    outlier_ = false;
    return;
  }
  if (side == run_side_) {
    ++run_len_;
  } else {
    run_side_ = side;
    run_len_ = 1;
    KeepRunReference(obs);
  }
  const bool wide = d > 1.5 * fit || d < lo / 1.5;
  suspect_ = run_len_ >= 2;
  outlier_ = wide && !suspect_;
  if (run_len_ < 3) return;
  // Three misses on one side: a new regime begins with the missed steps.
  BeginRegimeWithRun(obs, run_len_);
}

bool Forecaster::Impl::FarMiss(int64_t step, double d, double lo, double hi, bool local) const {
  const StepModel& m = ModelFor(step, ModelParts::kDuration);
  const double spread = local ? m.dur_local.spread : m.dur.spread;
  return d > hi + kFarSpreads * spread || d < lo - kFarSpreads * spread;
}

void Forecaster::Impl::KeepRunReference(const StepObs& obs) {
  // The history does not hold `obs` yet: these are the bounds of the steps
  // after it from the steps before the run.
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const int64_t stride = std::max<int64_t>(stride_, 1);
  run_ref_.assign(kRunRefSteps, {kNaN, kNaN});
  run_ref_from_ = -1;
  // Step numbers so near the int64 limit that the steps after do not fit.
  if (stride > (std::numeric_limits<int64_t>::max() - obs.step) / kRunRefSteps) return;
  run_ref_from_ = obs.step + stride;
  // Steps back at the regime before the last change (a slow spell's end):
  // Transient takes that change back; a reference here would make the
  // return a change of its own first, and forget the spell's steps.
  if (prior_.has_value() && obs.kind == StepKind::kNormal) {
    const auto& [lo, hi] =
        prior_->bound[static_cast<size_t>(obs.step % static_cast<int64_t>(prior_->bound.size()))];
    const auto d = static_cast<double>(obs.duration());
    if (!std::isnan(lo) && d >= lo && d <= hi) return;
  }
  // Only for a step bounded from fewer than kPredictiveBelow/α steps: from
  // more, a run's few steps hardly move the quantile, and the reference
  // would only keep the calibrator from widening the bound at each miss,
  // which a slow spell of contention needs (the level rises and falls
  // back: a change there forgets the steps it will fall back to).
  for (int j = 0; j < kRunRefSteps; ++j) {
    const int64_t s = run_ref_from_ + j * stride;
    double lo = 0, hi = 0, fit = 0;
    if (MarginalBound(s, lo, hi, fit) &&
        ModelFor(s, ModelParts::kDuration).dur.n < kPredictiveBelow / alpha_) {
      run_ref_[static_cast<size_t>(j)] = {lo, fit};
    }
  }
}

void Forecaster::Impl::BeginRegimeWithRun(const StepObs& obs, int run) {
  std::vector<int64_t> missed{obs.step};
  const auto before = static_cast<size_t>(run - 1);
  for (size_t i = hist_.size() - std::min(hist_.size(), before); i < hist_.size(); ++i) {
    missed.push_back(hist_[i].step);
  }
  KeepPriorRegime(obs.step, missed);
  while (hist_.size() > before) hist_.pop_front();
  BeginRegime();
}

bool Forecaster::Impl::LevelShift(const StepObs& obs) {
  // A level the steps left at once (a job moved to faster devices, a loader
  // fixed): the marginal bound of a drifting series spans the drift, and
  // the calibrator widens it at each miss, so that a step 0.6 times as long
  // as the ones before missed it by less than its margin and the next ones
  // not at all (a log of a growing curriculum running 0.6 times as long
  // from its middle: no change in 400 steps, and its next eval claimed at
  // the old length). Judged against the local-level bound of the run's
  // first step (of the last normal step before it where it has none: the
  // step after an event): beyond it by its width, kShiftSteps normal steps
  // in a row on one side. Slow drift moves the level with the steps and
  // never does; an event step between them neither breaks nor extends the
  // run.
  if (obs.kind != StepKind::kNormal || KindAt(obs.step) != StepKind::kNormal) return false;
  const StepModel& m = ModelFor(obs.step, ModelParts::kDuration);
  if (shift_run_ == 0 && m.ok && obs.step <= m.local_until && m.dur_local.n > 0) {
    shift_lo_ = m.dur_local.lo;
    shift_hi_ = m.dur_local.hi_fit;
    shift_ref_step_ = obs.step;
  }
  // A reference older than two runs' length (events, or steps without a
  // local bound, between) says nothing of where the level is now.
  if (shift_ref_step_ < 0 || obs.step - shift_ref_step_ > int64_t{2} * kShiftSteps) {
    shift_run_ = 0;
    return false;
  }
  const double width = shift_hi_ - shift_lo_;
  const auto d = static_cast<double>(obs.duration());
  const int side = d > shift_hi_ + width ? 1 : (d < shift_lo_ - width ? -1 : 0);
  double lo = 0, hi = 0, fit = 0;
  const bool marginal = side != 0 && MarginalBound(obs.step, lo, hi, fit);
  const bool missed = marginal && (d > fit || d < lo);
  // A run begins only with a step the marginal bound missed as well: most
  // of a rhythm's own long steps (a save's write slowing the 5 steps after
  // it) leave the local level but not the bound of their class.
  const bool begins = missed && (side > 0) == (d > fit);
  if (side == 0 || (shift_run_ > 0 ? side != shift_side_ : !begins)) {
    shift_run_ = 0;
    return false;
  }
  shift_side_ = side;
  if (++shift_run_ < kShiftSteps) return false;
  if (marginal) {
    bound_cal_[static_cast<int>(obs.kind)].Update(d > hi || d < lo,
                                                  FarMiss(obs.step, d, lo, hi, false));
  }
  BeginRegimeWithRun(obs, kShiftSteps);
  return true;
}

void Forecaster::Impl::TrackBurst(const StepObs& obs) {
  const bool after_miss = AfterHighMiss();
  high_miss_step_ = -1;
  double lo = 0, hi = 0, widen = 0;
  if (!UnwidenedBound(obs.step, lo, hi, nullptr, &widen)) return;
  const auto d = static_cast<double>(obs.duration());
  if (after_miss) burst_cal_[static_cast<int>(KindAt(obs.step))].Update(d > hi + widen || d < lo);
  if (d > hi) {
    high_miss_step_ = obs.step;
    high_miss_excess_ = d - hi;
  }
}

bool Forecaster::Impl::ScatteredMisses() {
  // Clear misses on both sides, between steps that fit: the rhythm itself
  // changed (a stall that came every 3rd step now comes every 5th: the old
  // class's steps are too short, the new stall's steps too long, and a run
  // of misses on one side never forms). At the calibrated rate the marginal
  // bound is missed clearly by about 1 step in 100; kScatterMisses of the
  // last kScatterSteps is not chance (binomial tail below 1e-3 even at 3 %).
  int clear = 0;
  for (const auto& [step, c] : recent_) clear += c ? 1 : 0;
  if (clear < kScatterMisses) return false;
  // The new regime begins with the first of those misses.
  int64_t first = recent_.back().first;
  for (const auto& [step, c] : recent_) {
    if (c) {
      first = step;
      break;
    }
  }
  prior_.reset();  // a changed rhythm is no slow spell
  while (!hist_.empty() && hist_.front().step < first) hist_.pop_front();
  BeginRegime();
  return true;
}

namespace {

// A level change (a run of misses on one side) is taken back when this many
// normal steps in a row fit the old regime's bounds within kTransientSteps
// steps of the log of it. A changed rhythm (ScatteredMisses) is not: its
// steps fit the old bounds in long stretches between the misses.
constexpr int kTransientFits = 8;
constexpr int64_t kTransientSteps = 64;

// `steps` steps of a log of every `stride`-th, in step numbers; at most the
// int64 limit (a log whose steps are numbers far apart).
int64_t StepsOfLog(int64_t steps, int64_t stride) {
  int64_t span = 0;
  return __builtin_mul_overflow(steps, stride, &span) ? std::numeric_limits<int64_t>::max() : span;
}

}  // namespace

void Forecaster::Impl::KeepPriorRegime(int64_t at, std::vector<int64_t> missed) {
  // A second change while the first may still be taken back keeps the first
  // one's regime (the slow spell was learned, and its end is the change);
  // Transient judges the steps against that regime's bounds.
  if (prior_.has_value()) {
    ++prior_->changes;
    return;
  }
  int64_t cycle = CycleLength();
  if (cycle == 0) cycle = std::max(dur_period_[static_cast<int>(StepKind::kNormal)], 1);
  PriorRegime p;
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  p.bound.assign(static_cast<size_t>(cycle), {kNaN, kNaN});
  p.caps.assign(static_cast<size_t>(cycle), {});
  // The next `cycle` logged steps (in a log of every 10th, the steps
  // between are bounded from all the steps, and no logged step is one).
  const int64_t stride = std::max<int64_t>(stride_, 1);
  // (Not past the int64 limit, for a log whose step numbers come near it.)
  const int64_t ahead =
      std::min(cycle, (std::numeric_limits<int64_t>::max() - last_step_) / stride);
  for (int64_t j = 1; j <= ahead; ++j) {
    const int64_t s = last_step_ + j * stride;
    double lo = 0, hi = 0, fit = 0;
    if (KindAt(s) == StepKind::kNormal && MarginalBound(s, lo, hi, fit)) {
      p.bound[static_cast<size_t>(s % cycle)] = {lo, fit};
    }
    const StepModel& m = ModelFor(s, ModelParts::kAll);
    if (!m.ok) continue;
    for (const StepModel::Slot& sl : m.slots) {
      if (!Recurring(sl.key)) continue;
      p.caps[static_cast<size_t>(s % cycle)].push_back(
          {sl.key, std::max(sl.d.low_tail, 0.0), std::max(sl.b.lo, 0.0)});
    }
  }
  const int64_t first_missed = *std::min_element(missed.begin(), missed.end());
  for (const StepObs& o : hist_) {
    if (o.step < first_missed) p.hist.push_back(o);
  }
  p.kept_events = kept_events_;
  p.regime_steps = regime_steps_;
  p.since = at;
  p.missed = std::move(missed);
  prior_ = std::move(p);
}

void Forecaster::Impl::CapByPriorRegime(int64_t step, int key, int64_t& guaranteed_ns,
                                        double& end_lo) const {
  if (!prior_.has_value() || prior_->caps.empty() || !Recurring(key)) return;
  const auto& caps =
      prior_->caps[static_cast<size_t>(step % static_cast<int64_t>(prior_->caps.size()))];
  double guaranteed = 0, end = 0;  // not claimed by the old regime
  for (const PriorRegime::Cap& c : caps) {
    if (c.key == key) {
      guaranteed = c.guaranteed;
      end = c.end_lo;
    }
  }
  guaranteed_ns = std::min(guaranteed_ns, static_cast<int64_t>(guaranteed));
  end_lo = std::min(end_lo, end);
}

bool Forecaster::Impl::Transient(const StepObs& obs) {
  if (!prior_.has_value()) return false;
  PriorRegime& p = *prior_;
  // Counted in steps of the log (a log of every 10th step: 64 of them).
  const int64_t stride = std::max<int64_t>(stride_, 1);
  if (obs.step - p.since > StepsOfLog(kTransientSteps, stride)) {
    prior_.reset();
    return false;
  }
  if (obs.kind != StepKind::kNormal) return false;
  const auto& [lo, hi] =
      p.bound[static_cast<size_t>(obs.step % static_cast<int64_t>(p.bound.size()))];
  if (std::isnan(lo)) return false;
  const auto d = static_cast<double>(obs.duration());
  if (d < lo || d > hi) {
    p.fits = 0;
    p.missed.push_back(obs.step);
    return false;
  }
  if (++p.fits < kTransientFits) return false;
  // The old regime again: its history, then the steps since that did not
  // miss its bounds. Unless this is a second spell (or later) within a
  // history window, and the spells' steps are more than α/2 of the
  // history's: then they are part of the job's behaviour (a loader that
  // falls behind for a few steps every few dozen), and a history without
  // them bounds the next spell's steps as if none came (fresh draws of
  // bursty_stalls: next-step coverage as low as 0.921).
  while (!spell_steps_.empty() &&
         spell_steps_.front() < obs.step - StepsOfLog(opt_.history_steps, stride)) {
    spell_steps_.pop_front();
  }
  const int64_t steps = p.regime_steps + (obs.step - p.since) / stride;
  const int changes = p.changes;
  const auto spell = static_cast<double>(spell_steps_.size() + p.missed.size());
  const bool recurring_spells =
      !spell_steps_.empty() &&
      spell > alpha_ / 2 * static_cast<double>(std::min<int64_t>(opt_.history_steps, steps));
  std::deque<StepObs> merged = std::move(p.hist);
  const auto keep = [&](const StepObs& o) {
    if ((merged.empty() || o.step > merged.back().step) &&
        (recurring_spells ||
         std::find(p.missed.begin(), p.missed.end(), o.step) == p.missed.end())) {
      merged.push_back(o);
    }
  };
  // The steps since the change, first those TrimWarmup dropped from the
  // front of the history as a warm-up: a spell of steps over 3 times the
  // usual ones was dropped so, and recurring spells were never kept (3
  // steps at 5 times the work every 33 after 100 steady ones: every spell a
  // change, recall 0.684).
  for (const StepObs& o : p.trimmed) keep(o);
  for (const StepObs& o : hist_) keep(o);
  spell_steps_.insert(spell_steps_.end(), p.missed.begin(), p.missed.end());
  hist_ = std::move(merged);
  kept_events_ = std::move(p.kept_events);
  while (static_cast<int>(hist_.size()) > opt_.history_steps) EvictOldest();
  prior_.reset();
  regimes_ -= changes;
  ++transients_;
  ResetRegimeState();
  regime_steps_ = steps;
  return true;
}

void Forecaster::Impl::BeginRegime() {
  ++regimes_;
  kept_events_.clear();  // their lengths carry over (Occurrences::measured)
  ResetRegimeState();
}

void Forecaster::Impl::EvictOldest() {
  if (hist_.front().kind != StepKind::kNormal) {
    kept_events_.push_back(hist_.front());
    if (kept_events_.size() > kKeptEvents) kept_events_.pop_front();
  }
  hist_.pop_front();
}

void Forecaster::Impl::ResetRegimeState() {
  regime_steps_ = static_cast<int64_t>(hist_.size());
  run_len_ = 0;
  run_side_ = 0;
  shift_run_ = 0;
  shift_ref_step_ = -1;
  suspect_ = outlier_ = false;
  recent_.clear();
  claims_.clear();
  since_learn_ = std::numeric_limits<int>::max() / 2;  // relearn now
}

void Forecaster::Impl::TrimWarmup() {
  if (regime_steps_ > 4 * static_cast<int64_t>(opt_.min_steps)) return;
  while (static_cast<int>(hist_.size()) >= opt_.min_steps &&
         hist_.front().kind == StepKind::kNormal) {
    std::vector<double> d;
    for (const StepObs& o : hist_) {
      if (o.kind == StepKind::kNormal) d.push_back(static_cast<double>(o.duration()));
    }
    if (static_cast<double>(hist_.front().duration()) <= 3 * QuantileInPlace(d, 0.5)) break;
    // While the change may be taken back, these may be a spell's steps
    // (3 steps at 5 times the work, then the usual ones: 3 times their
    // median), which Transient needs if the spells recur.
    if (prior_.has_value()) prior_->trimmed.push_back(hist_.front());
    hist_.pop_front();
    since_learn_ = std::numeric_limits<int>::max() / 2;
  }
}

void Forecaster::Impl::Relearn() {
  since_learn_ = 0;
  periods_.clear();
  const auto fold = [&](int p) {
    if (p > 1 && std::find(periods_.begin(), periods_.end(), p) == periods_.end()) {
      periods_.push_back(p);
    }
  };
  std::vector<int64_t> steps;
  std::vector<double> values;
  for (int k = 0; k < kNumStepKinds; ++k) {
    steps.clear();
    values.clear();
    std::array<bool, kNumSlots> seen{};
    for (const StepObs& o : hist_) {
      if (static_cast<int>(o.kind) != k) continue;
      steps.push_back(o.step);
      values.push_back(static_cast<double>(o.duration()));
      for (int i = 0; i < o.num_slots; ++i) seen[o.slots[i].key] = true;
    }
    dur_period_[k] = ChoosePeriod(steps, values, opt_.max_period, 2.0, 3, kPeriodSearchPenalty);
    fold(dur_period_[k]);
    {
      std::vector<std::vector<double>> classes(static_cast<size_t>(dur_period_[k]));
      for (size_t i = 0; i < steps.size(); ++i) {
        classes[static_cast<size_t>(steps[i] % dur_period_[k])].push_back(values[i]);
      }
      local_window_[k] =
          ChooseLevelWindow(classes, alpha_ * kDurationLoShare, 1 - alpha_ * (1 - kDurationLoShare),
                            static_cast<size_t>(std::ceil(2 / alpha_)));
    }
    for (int key = 0; key < kNumSlots; ++key) {
      slot_period_[k][key] = 1;
      if (!seen[key]) continue;
      values.clear();
      for (const StepObs& o : hist_) {
        if (static_cast<int>(o.kind) != k) continue;
        const SlotObs* s = o.Find(key);
        values.push_back(s != nullptr ? static_cast<double>(s->b - s->a) : 0.0);
      }
      slot_period_[k][key] =
          ChoosePeriod(steps, values, opt_.max_period, 2.0, 4, kPeriodSearchPenalty);
      fold(slot_period_[k][key]);
    }
  }
  // The spike test's reference: each slot's median length in the steps of
  // the first kind (normal, then checkpoint, then eval) in which it occurs
  // in at least half of 8 or more (an eval's in the eval steps: a full eval
  // every 500 steps among short ones every 50).
  std::array<std::array<std::vector<double>, kNumSlots>, kNumStepKinds> lengths;
  std::array<int, kNumStepKinds> of_kind{};
  for (const StepObs& o : hist_) {
    const auto k = static_cast<size_t>(o.kind);
    ++of_kind[k];
    for (int i = 0; i < o.num_slots; ++i) {
      const SlotObs& s = o.slots[static_cast<size_t>(i)];
      lengths[k][static_cast<size_t>(s.key)].push_back(static_cast<double>(s.b - s.a));
    }
  }
  // Fewer than 8 steps of any kind (a history just cut back by a regime
  // change or a transient) tell nothing of a slot's usual length: the
  // reference from before stays. Set to 0, it made the next step a spike
  // rule named look like one that did not spike, and ended the rule (a
  // loader's 234 ms stall every 125 steps, 8 steps after a transient).
  const bool too_few = std::all_of(of_kind.begin(), of_kind.end(), [](int n) { return n < 8; });
  for (int key = 0; key < kNumSlots && !too_few; ++key) {
    double& reference = spikes_[static_cast<size_t>(key)].reference;
    reference = 0;
    for (size_t k = 0; k < lengths.size() && reference == 0; ++k) {
      std::vector<double>& v = lengths[k][static_cast<size_t>(key)];
      if (of_kind[k] >= 8 && 2 * v.size() >= static_cast<size_t>(of_kind[k])) {
        reference = QuantileInPlace(v, 0.5);
      }
    }
  }
  ForgetModels();
  normal_slots_.clear();
}

// ------------------------------------------------------------------ facade

absl::StatusOr<Forecaster> Forecaster::Create(const ForecastOptions& options) {
  if (auto st = ValidateForecastOptions(options); !st.ok()) return st;
  return Forecaster(std::make_unique<Impl>(options));
}

Forecaster::Forecaster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Forecaster::Forecaster(Forecaster&&) noexcept = default;
Forecaster& Forecaster::operator=(Forecaster&&) noexcept = default;
Forecaster::~Forecaster() = default;

absl::Status Forecaster::Observe(const StepRecord& rec, const PhaseCatalog& catalog) {
  return impl_->Observe(rec, catalog);
}
absl::StatusOr<Forecast> Forecaster::Predict(int64_t now_ns) { return impl_->Predict(now_ns); }
absl::StatusOr<std::vector<StepBound>> Forecaster::NextStepBounds(int n) const {
  return impl_->NextStepBounds(n);
}
absl::StatusOr<StepBound> Forecaster::SaveBound() const { return impl_->SaveBound(); }
const ForecastOptions& Forecaster::options() const { return impl_->options(); }
int64_t Forecaster::last_step() const { return impl_->last_step(); }
int64_t Forecaster::regime_changes() const { return impl_->regime_changes(); }
int64_t Forecaster::transients() const { return impl_->transients(); }

absl::StatusOr<FitCheck> Forecaster::FitsBefore(const GuestCost& g, int64_t now_ns,
                                                int64_t deadline_ns) const {
  for (const double v : {g.step_mean_ns, g.step_stddev_ns, g.save_mean_ns, g.save_stddev_ns}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("guest cost must be finite and >= 0, got ", v));
    }
  }
  FitCheck c;
  const double need = g.step_mean_ns + g.save_mean_ns +
                      options().k * std::sqrt(g.step_stddev_ns * g.step_stddev_ns +
                                              g.save_stddev_ns * g.save_stddev_ns);
  c.needed_ns = static_cast<int64_t>(std::ceil(need));
  c.available_ns = deadline_ns - now_ns;
  c.fits = c.needed_ns <= c.available_ns;
  return c;
}

int64_t Forecast::total_idle_ns() const {
  int64_t sum = 0;
  for (const IdleWindow& w : windows) sum += w.duration_ns;
  return sum;
}

const IdleWindow* Forecast::WindowAt(int64_t t_ns) const {
  auto it = std::upper_bound(windows.begin(), windows.end(), t_ns,
                             [](int64_t t, const IdleWindow& w) { return t < w.start_ns; });
  while (it != windows.begin()) {
    --it;
    if (t_ns < it->start_ns + it->duration_ns) return &*it;
    if (it->duration_ns > 0) return nullptr;  // zero-length windows share start times
  }
  return nullptr;
}

}  // namespace omni
