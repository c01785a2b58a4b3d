// The forecaster's state (see omni/forecast.h for the model). Private to
// omni_core: forecast.cc learns (Observe), forecast_windows.cc publishes
// (Predict, bounds).
//
// Thread safety: not thread-safe; one owner (the Telemetry worker, or a replay).
#pragma once

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "omni/forecast.h"
#include "quantile.h"
#include "rhythm.h"
#include "step_slots.h"
#include "wall_clock.h"

namespace omni {

// The durations' share of α below their interval: a step cannot be much
// shorter than its work, but a stall can make it much longer, so most of the
// miss budget goes to the upper end (a tighter upper bound at the same
// stated confidence: more steps fit before a deadline).
inline constexpr double kDurationLoShare = 0.2;
// Below kPredictiveBelow/α values a duration's upper end is the sample's
// predictive quantile (PredictiveQuantileSorted; Summarize).
inline constexpr double kPredictiveBelow = 4;
// The least spread (a share of the mean) a sample of fewer than 5 values is
// given (Summarize): a window's times and a duration's lower end, and a
// duration's upper end (a step's, a save's). An event's duration moves
// between occurrences far more than one or two of them show, mostly up:
// omni_train's evals, each the same work, took 230-470 ms on one machine
// (make demo), and 269 then 359 ms as decoding grew longer.
inline constexpr double kLengthPriorCv = 0.05;
inline constexpr double kDurationPriorCv = 0.2;
// The fewest occurrences of an event's class in a rhythm of its lengths
// (Occurrences::length_period) before the class is its sample, and the
// fewest per class on average the rhythm is learned from (a quick and a
// full eval alternating: from the fourth occurrence).
inline constexpr size_t kMinOccurrencesPerClass = 2;
// The latest gaps between steps the step starts are predicted from (pooled)
// and a gap slot is learned from (per class).
inline constexpr size_t kRecentGaps = 64;

// Summary of the matching past values of one quantity for one future step.
struct SampleSummary {
  int n = 0;              // matching past steps
  int present = 0;        // ... in which the slot occurred (= n for durations)
  double lo = 0, hi = 0;  // two-sided quantiles at the stated confidence
  // A duration's upper end as the regime detector judges a step (type 7's
  // quantile where `hi` is the predictive one: Summarize).
  double hi_fit = 0;
  double low_tail = 0;  // one-sided lower quantile (guaranteed length)
  double median = 0, mean = 0, var = 0;
  // The standard deviation the lower end of a small sample's interval
  // uses: the lower half's own (√2 × the root mean square below the median,
  // n − 1 degrees of freedom) where that is smaller than the whole sample's,
  // so that one long occurrence (an eval that ran late) does not shorten the
  // length guaranteed for the next one.
  double sd_lo = 0;
  double spread = 0;                    // q90 − q10 (at least 2% of the median)
  double spread_lo = 0, spread_hi = 0;  // 2·(median − q10), 2·(q90 − median)
};

// What one future step looks like (cached per rhythm class).
struct StepModel {
  bool ok = false;
  SampleSummary dur;
  // The local-level model of the duration (LocalLevel in
  // forecast_windows.cc): it applies to steps up to `local_until` (the next
  // step of this rhythm class); -1 when the marginal quantiles are tighter
  // or the class is too short to tell.
  SampleSummary dur_local;
  int64_t local_until = -1;
  struct Slot {
    int key = 0;
    std::string phase;
    SampleSummary a, b, d;  // start offset, end offset, length
    bool declared = false;  // from a declared event not measured yet
    // Only the guaranteed length is claimed (from the window-open notice
    // on), not a time by the clock: an event measured once (its start
    // offsets show no spread), or an event in a step whose events were never
    // seen together (their order and offsets are unknown).
    bool anchored_only = false;
  };
  std::vector<Slot> slots;
  // The gap before the step (kGapKey), or nullptr.
  const Slot* GapSlot() const {
    for (const Slot& sl : slots) {
      if (sl.key == kGapKey) return &sl;
    }
    return nullptr;
  }
  // A step of its kind is in the history, or its length was declared
  // (PeriodicEvent::expected_ns). Else the model is a normal step's (the
  // walk over later steps needs a length) and the step has no duration
  // bound: an event's length is unknown until one was measured.
  bool kind_known = false;
  // Whether every slot was built, or only what a duration bound needs
  // (ModelParts::kDuration: the gap slot, and an unmeasured event's).
  bool all_slots = false;
  SlotMask rule_bits;   // which learned events occur at the step (cache check)
  SlotMask spike_bits;  // which spike rules put a spike at the step (cache check)
};

class Forecaster::Impl {
 public:
  explicit Impl(const ForecastOptions& o);

  absl::Status Observe(const StepRecord& rec, const PhaseCatalog& catalog);
  absl::StatusOr<Forecast> Predict(int64_t now_ns);
  absl::StatusOr<std::vector<StepBound>> NextStepBounds(int n) const;
  // StepBound::gap_hi_ns of `step` (after the last observed one).
  double GapHi(int64_t step) const;
  absl::StatusOr<StepBound> SaveBound() const;

  const ForecastOptions& options() const { return opt_; }
  int64_t last_step() const { return last_step_; }
  int64_t regime_changes() const { return regimes_; }
  int64_t transients() const { return transients_; }

 private:
  struct Occurrences {
    std::vector<int64_t> steps;  // newest last, at most 8
    int64_t total = 0;           // occurrences since the first observed step
    int64_t first = -1;          // the step of the first of them
    // One measured occurrence: its length, the normal steps' median
    // duration in the history then (NormalLevel; NaN for a window of every
    // step, which is no event), and where in its step it started.
    struct Measured {
      double length = 0, level = 0, start = 0;
      int64_t step = 0;
      // Its length where the normal steps' level is `now_level`: scaled
      // down where they are faster now than when it was measured, never up
      // (a slower machine or loader does not shorten an eval).
      double LengthAt(double now_level) const { return length * std::min(1.0, now_level / level); }
    };
    std::deque<Measured> measured;  // newest last, at most 32 (across regimes)
    SpacingRule rule;
    bool rule_valid = false;
    // How often a rule of this slot failed (a step it named lacked the
    // slot, or the slot came at a step it did not name), less one per
    // kConfirmedToForgive occurrences confirmed in a row since: each
    // failure (up to kMaxRuleFailures) asks a new rule to explain one more
    // of the last occurrences (an event by wall time, whose spacing in steps
    // wanders, seldom shows one spacing for long).
    int failures = 0;
    int confirmed_in_a_row = 0;
    // An event's lengths may follow a rhythm of its occurrences (a quick
    // eval every 200 steps, a full one every 400): the occurrence at s has
    // the class length_spacing.Index(s) mod length_period
    // (LearnLengthRhythm; 1: none).
    SpacingRule length_spacing;
    int length_period = 1;
    bool HasLengthRhythm() const { return length_period > 1 && length_spacing.every > 0; }
    // REQUIRES: HasLengthRhythm().
    int64_t ClassOf(int64_t step) const { return length_spacing.Index(step) % length_period; }
    // An event logged as a run of consecutive steps (an eval loop whose
    // batches are steps of their own): the current or last run's first and
    // last step, the lengths of the last completed runs, the first steps of
    // the last runs and their rule (LearnSpacing).
    // Steps not logged (a sampled log, a ring that dropped steps) leave
    // a run's ends unknown: `run_start_lo` is the earliest step the open
    // run can have started at (the step after the last one logged before
    // it), and a run two logged steps long or more (any run, once runs
    // are known) goes on across up to kMaxRunGap steps not logged. A
    // length is recorded when a logged step without the event ends the
    // run: its logged extent, never longer than the run was. Only starts
    // the log shows make the starts' rule.
    // An eval or checkpoint by wall time (WallClockRule): its last
    // occurrences as the log shows them, the steps logged since the last
    // one, whether every step since is logged, and the rule of each
    // check that fits. Rules that explain occurrences the step rule does
    // not replace it (`wall_in_use`; rule_valid is then false);
    // `wall_step` is the step all of them surely put the event at, among
    // the next logged one and those before it (-1: none is sure), set at
    // each Observe (UpdateWallStep).
    std::deque<TimedOccurrence> timed;  // newest last, at most kMaxWallClockPairs + 1
    // The logged steps without the event since the last occurrence, newest
    // last, at most PeriodicEvent::kMaxWallLagSteps + 1 (the newest; and a
    // lagged rule's checks: WallStep).
    struct Quiet {
      int64_t step, start_ns, end_ns;
    };
    std::deque<Quiet> quiet_recent;
    int64_t wall_step = -1;
    std::array<WallClockRule, kNumWallClockChecks> wall{};
    bool all_logged_since = true;
    bool wall_in_use = false;
    bool run_open = false;
    int64_t run_start = -1, run_last = -1, run_start_lo = -1;
    std::deque<int64_t> run_lengths;  // newest last, at most kMaxRuns
    // Their median (0: none; 1: single steps, no runs).
    int64_t run_length = 0;
    std::vector<int64_t> run_starts;  // newest last, at most kMaxRuns
    SpacingRule run_rule;
    bool run_rule_valid = false;
    // Updates the runs with whether the slot occurs at `step`; the step
    // logged before it was `logged_before` (-1: none).
    void TrackRun(int64_t step, bool present, int64_t logged_before);
    // Whether `step` lies in a run: the open one, which was at `last_step`
    // and is shorter than run_length yet, or one the rule starts.
    bool InRun(int64_t step, int64_t last_step) const;
  };
  static constexpr size_t kMaxRuns = 8;
  static constexpr int64_t kMaxRunGap = 3;

  // A window of every step that runs far longer at equally spaced steps:
  // a loader refilling its shuffle buffer at each epoch's end, metrics
  // written every 100 steps. Periods of any length (the residue classes of
  // ChoosePeriod stop at max_period and need 3 values per class); or an
  // event's (a full eval every 500 steps among short ones every 50). A
  // spike is a length at least kSpikeFactor times the slot's median in the
  // steps of its kind (Relearn) and min_window longer; the rule is the last
  // three major spikes' spacing (four below kMinSpacingFromTwo; or a
  // fractional one, FractionalSpacing), valid while the major ones of the
  // last kKeptSpikes spikes of the regime are all on it (or, where the
  // rhythm restarted at an eval or checkpoint, the four or more since one:
  // Spikes::restarts) and every step it names that is logged spikes; used until
  // the slot's residue classes have a period (where the spacing is within
  // max_period) and not where they hold the spikes apart
  // (ResiduesSeparateSpikes: ChoosePeriod has the rhythm). While valid, a
  // step it names is predicted from the kept spike steps on it, and the
  // other steps from the history's steps that did not spike on a rule.
  struct Spikes {
    double reference = 0;  // the median length in its kind's steps (Relearn); 0: none
    // The last kKeptSpikes spike steps of the regime (the oldest minor one
    // leaves first), oldest first: the samples of a step the rule names (a
    // history of 512 steps holds two of a spike every 200).
    std::deque<StepObs> kept;
    SpacingRule rule;
    bool rule_valid = false;
    // The slot's rhythm restarted at an eval or checkpoint in this regime
    // (a loader made again after each eval: its stalls counted from there):
    // a rule's major spikes since one were on it, those before not. Its
    // steps are then claimed up to the next eval or checkpoint only
    // (SpikeBits), and the rule is used even where the residue classes have
    // a period (they mix its phases).
    bool restarts = false;
    // An eval or checkpoint step came after the last spike: where the
    // rhythm restarts there, its phase is unknown until it spikes again.
    bool event_since_spike = false;
  };
  static constexpr double kSpikeFactor = 4;
  static constexpr size_t kKeptSpikes = 8;
  static constexpr int kMaxRuleFailures = 4;
  static constexpr int kConfirmedToForgive = 8;
  // A kept spike at least 1/kMajorSpikeShare of the longest kept is a major
  // one: the rule is learned from, and checked on, the major spikes only.
  static constexpr int64_t kMajorSpikeShare = 4;
  // The length of slot `key` in `o` (0 when `o` has none).
  static int64_t SlotLength(const StepObs& o, int key);
  // Which slots of `obs` spike (StepObs::spikes).
  SlotMask SpikesOf(const StepObs& obs) const;
  // The spike rules after `obs` joined the history.
  void LearnSpikes(const StepObs& obs);
  // Which valid spike rules put a spike at `step`.
  SlotMask SpikeBits(int64_t step) const;
  // Whether the residue classes of slot `key`'s period (ChoosePeriod) hold
  // its spikes apart: every normal step of the history in a class of a kept
  // spike on the rule spiked (a stall every 3rd step, or every 4th in a log of every
  // 5th). Not when a divisor of the spikes' spacing was chosen (a stall
  // every 150 steps puts all three in one class of 50, with 7 steps that
  // did not stall): then the rule has the rhythm.
  bool ResiduesSeparateSpikes(int key) const;

  // A window of every step (a data stall, a bubble, host-side time), not an
  // event (eval, checkpoint, or a learned spacing rule).
  bool Recurring(int key) const {
    return !occ_[key].rule_valid && SlotKind(key) != IdleKind::kEval &&
           SlotKind(key) != IdleKind::kCheckpoint;
  }
  // The window of slot `key` at `step` claimed for at most what the kept
  // prior regime claimed (PriorRegime::caps); no change without one.
  void CapByPriorRegime(int64_t step, int key, int64_t& guaranteed_ns, double& end_lo) const;
  bool Ready() const { return static_cast<int>(hist_.size()) >= opt_.min_steps; }
  StepKind KindAt(int64_t step) const;
  // Whether a declared or learned checkpoint / eval event occurs at `step`.
  bool EventAt(IdleKind kind, int64_t step) const;
  SlotMask RuleBits(int64_t step) const;
  // Bound of step `step`'s duration from the current model: the local-level
  // bound when it applies to the step (`local` says so), else the marginal
  // one. False when there is no model.
  // After a step that ran past its bound's upper end, the upper end of the
  // steps until the next one is observed is widened by burst_cal_'s margin
  // (TrackBurst).
  bool DurationBound(int64_t step, double& lo, double& hi, bool* local = nullptr) const;
  // The same without that widening; `widen` is what it would add.
  bool UnwidenedBound(int64_t step, double& lo, double& hi, bool* local, double* widen) const;
  // Scores the bound of `obs` (called before the history takes it): updates
  // burst_cal_ when the step followed a miss, and notes whether it missed.
  void TrackBurst(const StepObs& obs);
  // The last observed step ran past its bound's upper end.
  bool AfterHighMiss() const { return high_miss_step_ >= 0 && high_miss_step_ == last_step_; }
  // The marginal bound only: `hi` the published upper end (bound_cal_
  // scores it), `fit` the regime detector's (SampleSummary::hi_fit).
  bool MarginalBound(int64_t step, double& lo, double& hi, double& fit) const;
  // Whether `d`, outside the bound [lo, hi] of `step` (its local-level one
  // when `local`, else its marginal one), lies beyond it by more than
  // kFarSpreads of the spread of the sample the bound was drawn from: a
  // miss the calibrator's margin would not have caught (MarginCalibrator's
  // far misses: a GC pause). False when inside it.
  bool FarMiss(int64_t step, double d, double lo, double hi, bool local) const;
  // The model of `step`, cached until the history changes. kDuration skips
  // the windows' slots but the gap's: the bounds (DurationBound, GapHi, the
  // regime detector) need the duration alone, and the telemetry worker asks
  // for one after every step (the windows' slots were most of a model's
  // cost: forecast_cost's worker_step_us). The duration is the same in both.
  enum class ModelParts { kDuration, kAll };
  const StepModel& ModelFor(int64_t step, ModelParts parts) const;
  // Whether the regime has fewer than ⌈1/α⌉ − 1 normal steps (in `pool`)
  // and slot `key`'s lengths in them vary by more than kFewCv of their mean,
  // and its lengths in the step's residue class (`cls`, summarised) by more
  // than a kFewCvCut-th of that: its few lengths show nothing of how often
  // it is missing or short.
  bool WidelyVaryingFew(const std::vector<const StepObs*>& pool, int key,
                        const SampleSummary& cls) const;
  // `combo`: a checkpoint and an eval are both predicted at `step`.
  // `next`: `step` is the next logged step (an event's start then follows
  // the normal steps' recent level where their durations have memory).
  // `between`: a step between the logged ones (BetweenLogged), predicted
  // from all the normal steps alike, whatever their residues and spikes.
  // `parts`: as ModelFor's.
  StepModel BuildModel(int64_t step, StepKind kind, bool combo, ModelParts parts, bool next = false,
                       bool between = false) const;
  // An event whose lengths follow a rhythm of its occurrences
  // (oc.length_period > 1): keeps, in the occurrences' parallel vectors,
  // those of `step`'s class (when it has 3). Unchanged otherwise.
  static void KeepOccurrenceClass(int64_t step, const Occurrences& oc, std::vector<double>& a,
                                  std::vector<double>& b, std::vector<double>& d,
                                  std::vector<double>& lead, std::vector<double>& lead_level,
                                  std::vector<int64_t>& d_step);
  // An event slot's length_spacing and length_period from its measured
  // occurrences (ChoosePeriod over the occurrence index, up to 4, with a
  // tripled penalty: noise buys no rhythm).
  void LearnLengthRhythm(int key, Occurrences& o) const;
  // What the wall-clock rule's checks are judged with, from the history:
  // the shortest normal step, the longest step, the longest gap between
  // steps, and how far a check may be off the logged times (the longest
  // gap, 2 % of the normal steps' median, 1 ms at least). `ok` false
  // without normal steps.
  struct WallClockScale {
    double d_min = 0, d_max = 0, g_max = 0, tol = 0;
    bool ok = false;
  };
  WallClockScale WallClockScaleNow() const;
  // The declared event of `kind` (checkpoint, else eval), none while the
  // log contradicts its declaration by steps (TrackDeclared).
  const PeriodicEvent& DeclaredEvent(IdleKind kind) const {
    const bool ckpt = kind == IdleKind::kCheckpoint;
    if (declared_misses_[ckpt ? 0 : 1] >= kDeclaredMissesToVoid) return no_event_;
    return ckpt ? opt_.checkpoint : opt_.eval;
  }
  // A declared event by steps whose kind is missing from this many logged
  // declared steps in a row is voided until a declared step has it again: a
  // declaration one step off (a loop that evaluates at step % N == 0 under
  // eval_every = N, which means step % N == N − 1) put an eval-sized bound
  // on every step before an eval, and a learned rule the eval itself.
  static constexpr int kDeclaredMissesToVoid = 2;
  // Counts a logged step `rec` at a step its kind's event is declared at.
  void TrackDeclared(IdleKind kind, const StepRecord& rec, bool slot_present);
  // The wall-clock occurrences and rules of the slot of `kind` (eval or
  // checkpoint, ordinal 0) in `o` after `obs` (`s`: its slot there, nullptr
  // when it has none); called before last_step_ moves on. Where the rules
  // explain occurrences the step rule does not, the step rule is dropped.
  void TrackWallClock(IdleKind kind, const StepRecord& rec, const StepObs& obs, const SlotObs* s,
                      Occurrences& o) const;
  // The step the wall-clock rules surely put each event at, among the steps
  // up to the next logged one (Occurrences::wall_step: where all rules
  // still valid agree); after last_step_ moved on. The history's scale is
  // taken once, and only while a rule is in use.
  void UpdateWallSteps();
  void UpdateWallStep(Occurrences& o, const WallClockScale& w) const;
  // The step rule `r` of `o` surely puts the event at (UpdateWallStep), -1
  // when none is sure; `r` is cleared when a logged step without the event
  // shows it wrong.
  int64_t WallStep(const Occurrences& o, WallClockRule& r, const WallClockScale& w) const;
  // A window of every step (Recurring) in an event step measured a few
  // times: what the normal steps of its rhythm class show of the same slot.
  // False when the slot is missing in more of them than the error budget
  // allows (its few occurrences in event steps do not show how often it is
  // too short to be logged); else its length bounds are lowered to the
  // normal steps' where those are lower (its few lengths do not show its
  // spread). No change while the normal steps are too few to tell.
  bool PoolWithNormalSteps(int64_t step, int key, double margin, StepModel::Slot& sl) const;
  // How a positive margin widens a summary: by the whole spread (q90 − q10)
  // on both sides, or each side by the spread of its own half; kPerSideLog
  // as kPerSide, but the lower end of a positive sample (a length that
  // recurs every step: a data stall, a bubble) shrinks by a factor, the
  // margin times its lower half's spread in log space, and a small sample's
  // lower bounds are also taken in log space. A heavy-tailed length's low
  // quantile is a small part of its lower half's spread, so a positive
  // margin in spreads wiped its claims out for good, and with them the
  // outcomes that would have narrowed the margin again (seen on lognormal
  // stalls of σ 1: one early miss, then no claim in the remaining 190
  // steps); a factor never reaches 0. About the same as kPerSide where the
  // spread is small.
  enum class Spread { kWhole, kPerSide, kPerSideLog };
  // `lo_share`: the part of α left below the lower quantile (0.5: a
  // symmetric interval).
  void Summarize(std::vector<double>& v, SampleSummary& s, double margin, Spread kind,
                 double scale = -1, double lo_share = 0.5) const;
  // The normal steps' cycle: the least common multiple of the periods in
  // use, 0 when above kMaxCycle.
  int64_t CycleLength() const;
  // k > 1 where every gap between the steps in the history is a multiple
  // of k and one is k (a log of every k-th step, a few perhaps left out);
  // 0 otherwise (every step logged, or steps missing at random). Kept until
  // the models are forgotten.
  int64_t LogStride() const;
  // A normal step between the logged ones of a log of every k-th step
  // (after the last observed): nothing is known of its place in any rhythm.
  bool BetweenLogged(int64_t step) const;
  // The first step in [from, limit) with a declared or learned event or a
  // spike rule's spike, or limit.
  int64_t NextEventStep(int64_t from, int64_t limit) const;
  // The first step ≥ from that an eval or checkpoint is forecast at
  // (declared, a learned rule, or a run's start); INT64_MAX for none.
  int64_t NextEvalOrCheckpoint(int64_t from) const;
  // Whether a step in [a, b) of the history is an eval or checkpoint step.
  bool EventStepIn(int64_t a, int64_t b) const;
  void Relearn();
  void CheckRegime(const StepObs& obs);
  // A new regime where kShiftSteps normal steps in a row lay beyond the
  // local-level bound in place before the first of them by its width, on
  // one side (true: it began).
  bool LevelShift(const StepObs& obs);
  // A new regime that begins with obs and the `run` − 1 steps before it
  // (they missed the old regime's bounds).
  void BeginRegimeWithRun(const StepObs& obs, int run);
  // Keeps the marginal bounds of the kRunRefSteps steps after `obs`, the
  // first of a run of clear misses, in run_ref_.
  void KeepRunReference(const StepObs& obs);
  // A new regime from scattered clear misses (true: it began); the state
  // reset of every new regime.
  bool ScatteredMisses();
  void BeginRegime();
  // What a new regime starts without: the detector's runs, the pending
  // claims; a relearn at the next step.
  void ResetRegimeState();
  // Before a regime change cuts the history: the old regime's steps and its
  // bound of every normal step of one cycle ahead, so that a slow spell that
  // passes (a noisy neighbour, a throttled core) is taken back (Transient).
  // `at`: the step that completed the evidence; `missed`: the steps that
  // missed the old bounds.
  void KeepPriorRegime(int64_t at, std::vector<int64_t> missed);
  // After a change: the steps since fit the old regime's bounds again, so
  // the change was a transient; the old history comes back without the
  // steps that missed (true: taken back).
  bool Transient(const StepObs& obs);
  void ScoreClaims(const StepRecord& rec, const StepObs& obs, const PhaseCatalog& catalog);
  void TrimWarmup();
  double GapMean() const;
  // The median duration of the normal steps in the history; NaN when none.
  double NormalLevel() const;
  // The same, as the models of this history see it: computed once, at the
  // first model built after the models were forgotten, and forgotten with
  // them (a forecast's models asked for it for each of their rare slots,
  // each time sorting the history's durations).
  double ModelNormalLevel() const;
  // `rule` when every step it puts slot `key` at, between the third-last
  // occurrence and the last, either is not in the log or has the slot (all
  // such steps must be within the regime's history); else no rule.
  SpacingRule SkippingOnlyUnloggedSteps(int key, SpacingRule rule) const;

  const ForecastOptions opt_;
  const double conf_;   // stated confidence
  const double alpha_;  // 1 − conf_
  const double z_;      // normal quantile of the two-sided confidence
  const double z1_;     // ... of the one-sided confidence
  PhaseCatalog catalog_;
  std::deque<StepObs> hist_;  // current regime, oldest first
  // The event steps (eval, checkpoint) of the current regime that left the
  // history by age, oldest first, at most kKeptEvents: an event rarer than
  // the history (a checkpoint every 1,000 steps, a history of 512) is
  // still predicted from its own steps. BuildModel reads them with hist_.
  std::deque<StepObs> kept_events_;
  static constexpr size_t kKeptEvents = 16;
  // Pops the oldest step of the history, keeping it if an event step.
  void EvictOldest();
  std::deque<double> gaps_;        // between consecutive steps
  int64_t first_step_ = -1;        // the first step ever observed
  int64_t first_duration_ns_ = 0;  // ... its duration (ColdStart)
  // The job started cold: its first step ran kColdStart times the normal
  // steps' median or longer (memory allocated, kernels compiled, caches
  // filled), so an event's first occurrence may have run cold as well.
  bool ColdStart(const SampleSummary& normal) const;
  int64_t last_step_ = -1, last_end_ns_ = 0;
  int64_t stride_ = 1;  // steps between the last two observed (10 in a log of every 10th)
  int64_t regimes_ = 0;
  int64_t regime_steps_ = 0;  // steps since the regime began
  int since_learn_ = 0;
  std::vector<int> periods_;  // the distinct periods > 1 in use (cache key)
  int run_side_ = 0, run_len_ = 0;
  // The marginal bounds (lower end, type-7 upper end) of the steps after
  // the run's first, from run_ref_from_ on (one per stride_), as they were
  // before the run began (KeepRunReference; NaN: no bound).
  int64_t run_ref_from_ = -1;
  std::vector<std::pair<double, double>> run_ref_;
  // LevelShift's run: its length and side, and its reference (the local
  // bound of `shift_ref_step_`).
  static constexpr int kShiftSteps = 3;
  int shift_run_ = 0, shift_side_ = 0;
  int64_t shift_ref_step_ = -1;
  double shift_lo_ = 0, shift_hi_ = 0;
  bool suspect_ = false;  // two misses on one side: a regime may be ending
  bool outlier_ = false;  // one step far outside its bound (a stall, a GC)
  // The regime before the last change, while it may still come back
  // (KeepPriorRegime): its steps, its normal steps' bounds by step modulo
  // prior_cycle_ (NaN: no bound), the first step after the change, how many
  // normal steps in a row have fitted those bounds since, and the steps
  // that missed them.
  struct PriorRegime {
    std::deque<StepObs> hist;
    std::deque<StepObs> kept_events;
    int64_t regime_steps = 0;
    std::vector<std::pair<double, double>> bound;
    // What the old regime claimed of each recurring window (Recurring) of
    // a step, by step modulo bound.size(): its guaranteed length and the
    // lower end of where it ends. While the old regime may come back, a
    // window is claimed for no more than both regimes claim (a burst of
    // stalls learned as a regime of its own ends as it began: the next step
    // stalls like the old regime's). A window the old regime did not claim
    // at the step is not claimed.
    struct Cap {
      int key = 0;
      double guaranteed = 0, end_lo = 0;
    };
    std::vector<std::vector<Cap>> caps;
    int64_t since = -1;
    int fits = 0;
    int changes = 1;              // regime changes since `since` (taking it back undoes all)
    std::deque<StepObs> trimmed;  // steps since, dropped by TrimWarmup
    std::vector<int64_t> missed;
  };
  std::optional<PriorRegime> prior_;
  int64_t transients_ = 0;
  // The steps of spells taken back (Transient) and left out of the history,
  // newest last, within the last history_steps steps.
  std::deque<int64_t> spell_steps_;
  // The last steps judged by CheckRegime: (step, missed its bound clearly).
  std::deque<std::pair<int64_t, bool>> recent_;
  std::array<std::array<int, kNumSlots>, kNumStepKinds> slot_period_{};
  std::array<int, kNumStepKinds> dur_period_{};
  // The recent-level window of each kind's durations (0: the marginal
  // quantiles; ChooseLevelWindow), chosen at each Relearn.
  std::array<int, kNumStepKinds> local_window_{};
  std::array<Occurrences, kNumSlots> occ_;
  std::array<int, 2> declared_misses_{};  // checkpoint, eval (TrackDeclared)
  PeriodicEvent no_event_;
  std::vector<int> rule_keys_;  // slots with a valid learned rule
  std::array<Spikes, kNumSlots> spikes_;
  SlotMask spike_mask_;  // slots with a valid spike rule
  std::array<std::string, kNumSlots> slot_phase_;
  std::array<MarginCalibrator, kNumIdleKinds> window_cal_;  // per window kind
  std::array<MarginCalibrator, kNumStepKinds> bound_cal_;   // per step kind (marginal)
  std::array<MarginCalibrator, kNumStepKinds> local_cal_;   // ... local-level bounds
  // The extra margin of a bound whose step follows a miss above the last
  // step's bound (per step kind; adaptive conformal calibration on that
  // condition alone: Mondrian). Misses cluster where the steps' length has
  // memory the bounds do not model (a loader behind for a few steps).
  std::array<MarginCalibrator, kNumStepKinds> burst_cal_;
  int64_t high_miss_step_ = -1;  // the last step longer than its bound (-1: none)
  double high_miss_excess_ = 0;  // by how much (ns): burst_cal_'s margin's unit
  std::vector<WindowClaim> claims_;
  // Models are built from the history as it stands after an Observe or a
  // Relearn (CheckRegime's, inside Observe, before the history changes):
  // both end by forgetting the models built before.
  mutable std::unordered_map<int64_t, StepModel> cache_;
  mutable double model_level_ = 0;  // ModelNormalLevel(), when model_level_valid_
  mutable bool model_level_valid_ = false;
  void ForgetModels() {
    cache_.clear();
    model_level_valid_ = false;
    log_stride_ = -1;
    basis_valid_ = false;
    class_gap_hi_.clear();
  }
  // GapHi of the steps without a gap slot, by residue (of the gap slot's
  // period); forgotten with the models.
  mutable std::map<int64_t, double> class_gap_hi_;
  mutable int64_t log_stride_ = -1;  // LogStride(), -1 until computed
  // What every model built from one history shares (BuildModel): the
  // normal steps' residue-class means and the quantiles of their residuals,
  // and (levels) the normal steps' durations by class and the residuals
  // about their recent level. Built at the first BuildModel after the
  // models were forgotten (50 models of one forecast sorted the
  // same 512 residuals 50 times); forgotten with the models.
  struct NormalBasis {
    int period = 1;
    std::vector<double> class_sum;
    std::vector<int> class_n;
    SampleSummary normal;  // n, mean, median, lo, hi
    bool levels = false;   // the level fields below are built
    std::vector<std::vector<int64_t>> level_steps;
    std::vector<std::vector<double>> level_durs;
    size_t level_res_n = 0;
    double level_res_lo = 0, level_res_hi = 0;
    double ClassMean(int64_t step) const {
      const auto r = static_cast<size_t>(step % period);
      return class_n[r] >= 3 ? class_sum[r] / class_n[r] : normal.mean;
    }
  };
  const NormalBasis& Basis(bool levels) const;
  mutable NormalBasis basis_;
  mutable bool basis_valid_ = false;
  // PoolWithNormalSteps's view of a slot in the normal steps of a residue
  // class, by (slot key, residue); cleared by Relearn (every 4 to 16 steps:
  // the view of hundreds of steps moves little in between, and computing it
  // at every step cost a sixth of an update).
  struct NormalSlotView {
    bool judged = false;   // enough normal steps to tell
    bool missing = false;  // ... and the slot is missing in too many of them
    double lo = 0, low_tail = 0;
  };
  mutable std::map<std::pair<int, int64_t>, NormalSlotView> normal_slots_;
};

}  // namespace omni
