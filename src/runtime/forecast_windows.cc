// The forecaster's publishing side: the model of a future step from the
// matching past steps, windows anchored to steps, next-step and save bounds.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "forecast_impl.h"

namespace omni {

namespace {

constexpr double kMinSpreadNs = 50'000;  // 50 µs
constexpr int kBoundsInForecast = 8;
constexpr int kClaimSteps = 64;
// How many occurrences ahead a residue class's window that stands out of
// its slot's other steps is listed without a sure part (Predict).
constexpr int kResidueAhead = 16;
// Predict jumps over runs of normal steps by their cycle when it is at most
// this long (else it walks every step).
constexpr int64_t kMaxCycle = 4096;
// A recurring slot of normal steps whose lengths vary more than this
// (standard deviation over mean) in a regime's first ⌈1/α⌉ − 1 steps is
// not claimed until then (WidelyVaryingFew).
constexpr double kFewCv = 0.3;
// ... unless the step's residue class of the slot cuts that spread by this
// factor (a stall every 3rd step: 1.4 in all steps, 0.05 in its class).
constexpr double kFewCvCut = 5;
// A duration's interval gives all but kCliffLoShare of α to its upper end
// where that makes it shorter than kCliffWidth of the interval with the
// lower end's share (Summarize: a mode of long steps just above the upper
// end's share).
constexpr double kCliffWidth = 0.5;
constexpr double kCliffLoShare = 0.1;
// The furthest a fully negative margin pulls a quantile towards the median
// (as a fraction of their distance).
constexpr double kMaxPull = 0.5;
// The least lower-half spread in log space a kPerSideLog summary shrinks by
// (a factor of e^0.02 per unit of margin: the 2% of the median that is
// the least spread in linear space).
constexpr double kMinLogSpread = 0.02;

// How much longer than every later one an event's first occurrence is
// when it ran cold (BuildModel).
constexpr double kColdFactor = 1.25;
// A job started cold when its first step ran this many times the normal
// steps' median (ColdStart); then the first occurrence of an event may have
// run up to kColdFirstRatio times as long as the next (BuildModel).
constexpr double kColdStart = 1.5;
constexpr double kColdFirstRatio = 3.0;

double Mean(std::vector<double>::const_iterator first, std::vector<double>::const_iterator last) {
  return first == last ? 0.0
                       : std::accumulate(first, last, 0.0) / static_cast<double>(last - first);
}

// A length of the forecast (or a time after the last step's end) as an
// int64, saturated at ±kMaxClockNs: the extrapolation from a hostile log's
// lengths may leave the int64 range, where a conversion is undefined.
int64_t SatNs(double ns) {
  constexpr auto kLimit = static_cast<double>(kMaxClockNs);
  return static_cast<int64_t>(std::clamp(ns, -kLimit, kLimit));
}

// The clock reading `offset` after `base`, saturated at the int64 limit.
int64_t AtOffset(int64_t base, double offset) {
  int64_t t = 0;
  return __builtin_add_overflow(base, SatNs(offset), &t) ? std::numeric_limits<int64_t>::max() : t;
}

absl::Status NotReady(int64_t have, int need) {
  return absl::FailedPreconditionError(absl::StrCat("no forecast yet: the current regime has ",
                                                    have, " of the ", need, " steps it needs"));
}

}  // namespace

// Quantiles of `v` at the stated confidence (α·lo_share below the interval,
// the rest of α above it), widened by `margin` spreads.
// Samples too small to hold the quantile (n < 2/α) use the prediction
// interval mean ± t·s·√(1 + 1/n) instead where that is wider; below 5
// values s is at least a share of `scale` (default: the mean; a prior on the
// noise: one or two observations of an event do not show its spread):
// kLengthPriorCv for a window's times, kDurationPriorCv for a duration.
void Forecaster::Impl::Summarize(std::vector<double>& v, SampleSummary& s, double margin,
                                 Spread kind, double scale, double lo_share) const {
  s.n = static_cast<int>(v.size());
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  const auto n = static_cast<double>(v.size());
  s.median = QuantileSorted(v, 0.5);
  double sum = 0, sq = 0;
  for (const double x : v) sum += x;
  s.mean = sum / n;
  double below = 0;
  for (const double x : v) {
    sq += (x - s.mean) * (x - s.mean);
    if (x < s.median) below += (x - s.median) * (x - s.median);
  }
  s.var = sq / n;
  if (n > 1) s.sd_lo = std::min(std::sqrt(sq / (n - 1)), std::sqrt(2 * below / (n - 1)));
  const double q10 = QuantileSorted(v, 0.1), q90 = QuantileSorted(v, 0.9);
  const double floor = std::max(0.02 * std::abs(s.median), kMinSpreadNs);
  s.spread = std::max(q90 - q10, floor);
  // A window's times widen by the spread of their own half: a bimodal
  // quantity (a data wait that is short, or in a burst very long) widens its
  // lower claims on the scale of the short mode, not of the distance between
  // the modes (which would wipe them out at the first positive margin).
  // Durations widen by the whole spread on both sides.
  const bool per_side = kind != Spread::kWhole;
  s.spread_lo = per_side ? std::max(2 * (s.median - q10), floor) : s.spread;
  s.spread_hi = per_side ? std::max(2 * (q90 - s.median), floor) : s.spread;
  const double widen_lo = std::max(margin, 0.0) * s.spread_lo;
  const double widen_hi = std::max(margin, 0.0) * s.spread_hi;
  // kPerSideLog: the lower ends shrink by a factor (v is sorted: v[0] is
  // its least value).
  const bool log_lo = kind == Spread::kPerSideLog && v.front() > 0;
  const double shrink =
      log_lo ? std::exp(-std::max(margin, 0.0) *
                        std::max(2 * (std::log(s.median) - std::log(q10)), kMinLogSpread))
             : 1.0;
  const auto lower = [&](double x) { return log_lo ? x * shrink : x - widen_lo; };
  // A negative margin (claims held more often than needed) moves the
  // quantiles towards the median by at most half their distance.
  // A window's times never move past the sample's quantile at the level
  // moved as far towards 1/2: between two modes (a data wait of 2 ms or
  // 30 ms, as a coin falls) a value a quarter of the way to a median in the
  // upper mode lies in the gap, far above every short wait (claimed 6 ms of
  // 2 ms waits). Durations keep the move by value (their calibrator settled
  // on it).
  const double narrow = std::clamp(-margin, 0.0, kMaxNarrowing) / kMaxNarrowing * kMaxPull;
  double plo = alpha_ * lo_share, phi = 1 - alpha_ * (1 - lo_share);
  if (kind == Spread::kWhole && lo_share == kDurationLoShare) {
    // A step's duration (a save's length and a gap keep their even split)
    // with a mode of long steps whose share lies between the upper end's
    // share of α and 1 − kCliffLoShare of it (GC pauses in 3.6-4.1 % of
    // the history): the upper quantile lies among them, at kCliffLoShare
    // below them. That split of α is taken where it makes the interval the
    // shorter by far (steps of 150 ms were bounded at 270-320 ms for
    // hundreds of steps at a time, whenever the pauses in the history came
    // above 3.6 %). Not beyond: where they come in more than that share,
    // the realised rate holds only if some of them are covered (the step
    // bounds' calibrators aim at 0.9α at most: MarginCalibrator's far misses).
    const double plo_c = alpha_ * kCliffLoShare, phi_c = 1 - alpha_ * (1 - kCliffLoShare);
    if (QuantileSorted(v, phi_c) - QuantileSorted(v, plo_c) <
        kCliffWidth * (QuantileSorted(v, phi) - QuantileSorted(v, plo))) {
      plo = plo_c;
      phi = phi_c;
    }
  }
  const auto toward_median = [&](double p, double q) {
    const double by_value = q + narrow * (s.median - q);
    if (!per_side) return by_value;
    const double at_level = QuantileSorted(v, p + narrow * (0.5 - p));
    if (p < 0.5) {
      // ... and never into a gap between the values: down to the longest
      // value at or below it (the short mode's longest wait).
      const double x = std::min(by_value, at_level);
      const auto it = std::upper_bound(v.begin(), v.end(), x);
      return it == v.begin() ? x : std::max(*std::prev(it), q);
    }
    const double x = std::max(by_value, at_level);
    const auto it = std::lower_bound(v.begin(), v.end(), x);
    return it == v.end() ? x : std::min(*it, std::max(x, q));
  };
  const double qlo = QuantileSorted(v, plo);
  // A duration's upper end from fewer than 4/α values: the quantile the next
  // value exceeds at 1 − phi (type 6). Type 7's is exceeded about
  // (2·phi − 1)/(n + 1) more often, at least a quarter more than 1 − phi
  // below 4/α values (3.8 % instead of 3.6 % of heavy-tailed steps from
  // 51-89); from there on the calibrator, which has seen as many claims,
  // absorbs the rest, and the predictive quantile's step up would cost slack
  // on a spike mode just under the upper share (3 % of GC pauses: median
  // slack 1.206 -> 1.239 on gc_pauses with it at every n).
  // The regime detector keeps type 7's (hi_fit): with one new value among
  // 31, the predictive quantile at 0.964 interpolates into it (30 steady
  // steps, then steps 8 times as long: two of them were covered, and the
  // third miss in a row that starts a new regime never came).
  const double qhi_fit = QuantileSorted(v, phi);
  const double qhi = kind == Spread::kWhole && n < kPredictiveBelow / alpha_
                         ? PredictiveQuantileSorted(v, phi)
                         : qhi_fit;
  const double qtail = QuantileSorted(v, alpha_);
  s.lo = lower(toward_median(plo, qlo));
  s.hi = toward_median(phi, qhi) + widen_hi;
  s.hi_fit = toward_median(phi, qhi_fit) + widen_hi;
  s.low_tail = lower(toward_median(alpha_, qtail));
  if (n >= 2 / alpha_) return;
  const double prior_scale = n < 5 ? std::abs(scale >= 0 ? scale : s.mean) : 0.0;
  const double prior = kLengthPriorCv * prior_scale;
  // A duration's upper end: an event runs far longer than its first
  // occurrences more often than far shorter (kDurationPriorCv).
  const double prior_hi =
      (kind == Spread::kWhole ? kDurationPriorCv : kLengthPriorCv) * prior_scale;
  const double sample_sd = n > 1 ? std::sqrt(sq / (n - 1)) : 0.0;
  const double sd = std::max(sample_sd, prior_hi);
  // A window's lower end (its guaranteed length) from the lower half of its
  // sample and the lower of the mean and the median: a long occurrence
  // moves the mean up and widens the whole sample's spread, not the short
  // ones'. A duration's lower end from the whole sample's spread.
  const double sd_lo = per_side ? std::max(s.sd_lo, prior) : std::max(sample_sd, prior);
  const double root = std::sqrt(1 + 1 / n);
  const double centre_lo = per_side ? std::min(s.mean, s.median) : s.mean;
  s.lo = std::min(s.lo, lower(centre_lo - SmallSampleFactor(z_, n) * sd_lo * root));
  const double t_hi = s.mean + SmallSampleFactor(z_, n) * sd * root + widen_hi;
  s.hi = std::max(s.hi, t_hi);
  s.hi_fit = std::max(s.hi_fit, t_hi);
  s.low_tail = std::min(s.low_tail, lower(centre_lo - SmallSampleFactor(z1_, n) * sd_lo * root));
  if (!log_lo || n < 2) return;
  if (v.front() == v.back() && n >= 5) return;  // no spread: the linear bounds are exact
  // The Student-t prediction bounds of the logs (the whole sample's spread,
  // at least 5% below 5 values): exact for lognormal lengths, about the
  // linear ones for a small spread, and far below them for a heavy tail that
  // 5 or 10 values do not show in linear space (the first 5 stalls of a
  // lognormal of σ 1 all within 19-35 ms: claimed 14 ms, then came 6 ms).
  double lsum = 0, lsq = 0;
  for (const double x : v) lsum += std::log(x);
  const double lmean = lsum / n;
  for (const double x : v) lsq += (std::log(x) - lmean) * (std::log(x) - lmean);
  const double lsd = std::max(std::sqrt(lsq / (n - 1)), n < 5 ? 0.05 : 0.0);
  s.lo = std::min(s.lo, lower(std::exp(lmean - SmallSampleFactor(z_, n) * lsd * root)));
  s.low_tail =
      std::min(s.low_tail, lower(std::exp(lmean - SmallSampleFactor(z1_, n) * lsd * root)));
}

void Forecaster::Impl::KeepOccurrenceClass(int64_t step, const Occurrences& oc,
                                           std::vector<double>& a, std::vector<double>& b,
                                           std::vector<double>& d, std::vector<double>& lead,
                                           std::vector<double>& lead_level,
                                           std::vector<int64_t>& d_step) {
  if (!oc.HasLengthRhythm()) return;
  const int64_t want = oc.ClassOf(step);
  const auto n = static_cast<size_t>(std::count_if(
      d_step.begin(), d_step.end(), [&](int64_t st) { return oc.ClassOf(st) == want; }));
  if (n < kMinOccurrencesPerClass) return;
  size_t w = 0;
  for (size_t i = 0; i < d_step.size(); ++i) {
    if (oc.ClassOf(d_step[i]) != want) continue;
    a[w] = a[i];
    b[w] = b[i];
    d[w] = d[i];
    lead[w] = lead[i];
    if (i < lead_level.size()) lead_level[w] = lead_level[i];
    d_step[w] = d_step[i];
    ++w;
  }
  for (auto* v : {&a, &b, &d, &lead}) v->resize(w);
  if (!lead_level.empty()) lead_level.resize(w);
  d_step.resize(w);
}

bool Forecaster::Impl::ColdStart(const SampleSummary& normal) const {
  return normal.n > 0 && static_cast<double>(first_duration_ns_) >= kColdStart * normal.median;
}

const Forecaster::Impl::NormalBasis& Forecaster::Impl::Basis(bool levels) const {
  NormalBasis& nb = basis_;
  if (!basis_valid_) {
    // Normal steps' lengths: each predicted by the mean of its residue
    // class (the normal steps' period), the residuals about it pooled over
    // all classes at quantiles α/4 and 1 − α/4.
    nb = NormalBasis{};
    nb.period = std::max(dur_period_[static_cast<int>(StepKind::kNormal)], 1);
    nb.class_sum.assign(static_cast<size_t>(nb.period), 0.0);
    nb.class_n.assign(static_cast<size_t>(nb.period), 0);
    double normal_sum = 0;
    std::vector<double> durations;  // for the median (ColdStart)
    for (const StepObs& o : hist_) {
      if (o.kind != StepKind::kNormal) continue;
      const auto r = static_cast<size_t>(o.step % nb.period);
      nb.class_sum[r] += static_cast<double>(o.duration());
      ++nb.class_n[r];
      normal_sum += static_cast<double>(o.duration());
      durations.push_back(static_cast<double>(o.duration()));
      ++nb.normal.n;
    }
    if (nb.normal.n > 0) {
      nb.normal.mean = normal_sum / nb.normal.n;
      nb.normal.median = QuantileInPlace(durations, 0.5);
    }
    std::vector<double> res;
    for (const StepObs& o : hist_) {
      if (o.kind == StepKind::kNormal) {
        res.push_back(static_cast<double>(o.duration()) - nb.ClassMean(o.step));
      }
    }
    if (!res.empty()) {
      std::sort(res.begin(), res.end());
      nb.normal.lo = QuantileSorted(res, alpha_ / 4);
      nb.normal.hi = QuantileSorted(res, 1 - alpha_ / 4);
    }
    basis_valid_ = true;
  }
  if (levels && !nb.levels) {
    // The normal steps' durations by class, and the residuals about each
    // class's level (the median of its last k: ChooseLevelWindow's k).
    const int nk = local_window_[static_cast<int>(StepKind::kNormal)];
    nb.levels = true;
    nb.level_steps.resize(static_cast<size_t>(nb.period));
    nb.level_durs.resize(static_cast<size_t>(nb.period));
    for (const StepObs& o : hist_) {
      if (o.kind != StepKind::kNormal) continue;
      const auto r = static_cast<size_t>(o.step % nb.period);
      nb.level_steps[r].push_back(o.step);
      nb.level_durs[r].push_back(static_cast<double>(o.duration()));
    }
    std::vector<double> res, one;
    for (const std::vector<double>& c : nb.level_durs) {
      if (c.size() <= static_cast<size_t>(nk)) continue;
      LevelResiduals(c, nk, one);
      res.insert(res.end(), one.begin(), one.end());
    }
    nb.level_res_n = res.size();
    if (!res.empty()) {
      std::sort(res.begin(), res.end());
      nb.level_res_lo = QuantileSorted(res, alpha_ / 4);
      nb.level_res_hi = QuantileSorted(res, 1 - alpha_ / 4);
    }
  }
  return nb;
}

bool Forecaster::Impl::WidelyVaryingFew(const std::vector<const StepObs*>& pool, int key,
                                        const SampleSummary& cls) const {
  const auto normal = std::count_if(pool.begin(), pool.end(),
                                    [](const StepObs* o) { return o->kind == StepKind::kNormal; });
  if (static_cast<double>(normal) >= std::ceil(1 / alpha_) - 1) return false;
  std::vector<double> v;  // the slot's lengths in the normal steps
  for (const StepObs* o : pool) {
    const SlotObs* s = o->kind == StepKind::kNormal ? o->Find(key) : nullptr;
    if (s != nullptr) v.push_back(static_cast<double>(s->b - s->a));
  }
  if (v.empty() || !(cls.mean > 0)) return false;
  const double mean = Mean(v.begin(), v.end());
  double sq = 0;
  for (const double x : v) sq += (x - mean) * (x - mean);
  const double all = std::sqrt(sq / static_cast<double>(v.size())) / mean;
  return all > kFewCv && std::sqrt(cls.var) / cls.mean > all / kFewCvCut;
}

StepModel Forecaster::Impl::BuildModel(int64_t step, StepKind kind, bool combo, ModelParts parts,
                                       bool next, bool between) const {
  StepModel m;
  m.all_slots = parts == ModelParts::kAll;
  m.rule_bits = RuleBits(step);
  if (!between) m.spike_bits = SpikeBits(step);
  // The steps an event step is predicted from: the event steps kept beyond
  // the history, then the history.
  std::vector<const StepObs*> pool;
  pool.reserve(hist_.size() + kept_events_.size());
  if (kind != StepKind::kNormal) {
    for (const StepObs& o : kept_events_) pool.push_back(&o);
  }
  for (const StepObs& o : hist_) pool.push_back(&o);
  bool measured = false;
  for (const StepObs* o : pool) measured = measured || o->kind == kind;
  const StepKind base = measured ? kind : StepKind::kNormal;
  m.kind_known = measured;
  const auto kb = static_cast<int>(base);
  // The past steps of the same kind in the same residue class (all of the
  // kind when the class has fewer than 3).
  // A checkpoint step that also ran an eval is no sample of a checkpoint
  // step alone (its checkpoint came late), unless both are predicted.
  const auto has_eval = [](const StepObs& o) {
    return o.Find(SlotKey(IdleKind::kEval, 0)) != nullptr;
  };
  const auto usable = [&](const StepObs& o) {
    return o.kind == base && (combo || base != StepKind::kCheckpoint || !has_eval(o));
  };
  // A step a spike rule names is predicted from the spike steps, the others
  // from the others (Spikes); with fewer than 3 alike, from all.
  // (A step's spikes off the rules are neither: a minor one that is no
  // rule's is the noise of the steps that did not spike.)
  const auto alike = [&](const StepObs& o) {
    if (between) return true;
    return !(o.spikes & spike_mask_).any() ? !m.spike_bits.any()
                                           : (o.spikes & SpikeBits(o.step)) == m.spike_bits;
  };
  std::vector<const StepObs*> same;
  const auto matching = [&](int period) {
    if (between) period = 1;
    same.clear();
    if (m.spike_bits.any()) {
      const int key = m.spike_bits.first();
      for (const StepObs& o : spikes_[static_cast<size_t>(key)].kept) {
        if (usable(o) && alike(o)) same.push_back(&o);
      }
      if (same.size() >= 3) return;
      same.clear();
    }
    for (const StepObs* o : pool) {
      if (usable(*o) && alike(*o) && o->step % period == step % period) same.push_back(o);
    }
    if (same.size() < 3 && period > 1) {
      same.clear();
      for (const StepObs* o : pool) {
        if (usable(*o) && alike(*o)) same.push_back(o);
      }
    }
    if (same.size() < 3 && m.spike_bits.any()) {
      same.clear();
      for (const StepObs* o : pool) {
        if (usable(*o)) same.push_back(o);
      }
    }
  };
  // Normal steps' lengths: each predicted by the mean of its residue class
  // (the normal steps' period), the residuals about it pooled over all
  // classes at quantiles α/4 and 1 − α/4 (below). An event's training work
  // follows the same rhythm as a normal step's, so its duration (next) and
  // its start (the slots, below) are predicted from the class of its own
  // step, and its start spreads like these residuals.
  const int nk = local_window_[static_cast<int>(StepKind::kNormal)];
  const bool want_levels = next && base != StepKind::kNormal && nk > 0;
  const NormalBasis& nb = Basis(want_levels);
  const SampleSummary& normal = nb.normal;
  const int np_period = nb.period;
  const auto class_mean = [&](int64_t st) { return nb.ClassMean(st); };
  std::vector<double> v;
  matching(dur_period_[kb]);
  if (combo && base == StepKind::kCheckpoint) {
    // A step with both events lasts as those measured did, not as a
    // checkpoint step alone (a 10 ms save among 270 ms saves with evals
    // bounded the next of those at 266 ms). Its windows keep the samples
    // of every checkpoint step (the save's length is its own; the slots
    // below match again).
    std::vector<const StepObs*> both;
    for (const StepObs* o : pool) {
      if (o->kind == base && has_eval(*o)) both.push_back(o);
    }
    if (!both.empty()) same = std::move(both);
  }
  if (!combo && (base == StepKind::kEval || base == StepKind::kCheckpoint)) {
    // An event whose lengths follow a rhythm of its occurrences: its steps
    // last as those of the next one's class did.
    const IdleKind event = base == StepKind::kEval ? IdleKind::kEval : IdleKind::kCheckpoint;
    const Occurrences& oc = occ_[static_cast<size_t>(SlotKey(event, 0))];
    if (oc.HasLengthRhythm()) {
      std::vector<const StepObs*> in_class;
      for (const StepObs* o : same) {
        if (oc.ClassOf(o->step) == oc.ClassOf(step)) in_class.push_back(o);
      }
      if (in_class.size() >= kMinOccurrencesPerClass) same = std::move(in_class);
    }
  }
  v.reserve(same.size());
  for (const StepObs* o : same) v.push_back(static_cast<double>(o->duration()));
  const std::vector<double> series = v;  // in step order (Summarize sorts v)
  const double bound_margin = bound_cal_[static_cast<int>(kind)].margin();
  Summarize(v, m.dur, bound_margin, Spread::kWhole, -1, kDurationLoShare);
  if (m.dur.n == 0) return m;
  if (base != StepKind::kNormal && np_period > 1) {
    // An event step's training work follows the normal steps' rhythm (a
    // loader that stalls every 7th step stalls on an eval step of that
    // residue too): each past event step's excess over its own class's
    // normal step, on this step's class. The bound covers both readings
    // (the event may skip the rhythm's slot: a checkpoint step that loads
    // no data).
    v.clear();
    const double here = class_mean(step);
    for (const StepObs* o : same) {
      v.push_back(static_cast<double>(o->duration()) - class_mean(o->step) + here);
    }
    SampleSummary shifted;
    Summarize(v, shifted, bound_margin, Spread::kWhole, -1, kDurationLoShare);
    m.dur.lo = std::min(m.dur.lo, shifted.lo);
    m.dur.hi = std::max(m.dur.hi, shifted.hi);
    m.dur.hi_fit = std::max(m.dur.hi_fit, shifted.hi_fit);
    m.dur.low_tail = std::min(m.dur.low_tail, shifted.low_tail);
    m.dur.median = shifted.median;
    m.dur.mean = shifted.mean;
    m.dur.var = std::max(m.dur.var, shifted.var);
  }
  m.ok = true;
  const int level_k = local_window_[static_cast<size_t>(kb)];
  const auto min_n = static_cast<size_t>(std::ceil(2 / alpha_));
  if (!combo && base == kind && level_k > 0 && series.size() >= min_n + level_k) {
    // The next step of this class (no later one of the class pending) leans
    // on the class's recent level (ChooseLevelWindow).
    std::vector<int64_t> gaps;
    for (size_t i = 1; i < same.size(); ++i) gaps.push_back(same[i]->step - same[i - 1]->step);
    std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2),
                     gaps.end());
    const int64_t until = same.back()->step + gaps[gaps.size() / 2];
    if (step <= until) {
      std::vector<double> residuals;
      LevelResiduals(series, level_k, residuals);
      Summarize(residuals, m.dur_local, local_cal_[static_cast<int>(kind)].margin(), Spread::kWhole,
                -1, kDurationLoShare);
      const double level = RecentLevel(series, level_k);
      for (double* x : {&m.dur_local.lo, &m.dur_local.hi, &m.dur_local.hi_fit,
                        &m.dur_local.low_tail, &m.dur_local.median, &m.dur_local.mean}) {
        *x += level;
      }
      m.local_until = until;
    }
  }
  // The next step's event starts where its step's training work ends now:
  // where the normal steps' durations have memory (a slow drift, contention
  // that comes and goes: ChooseLevelWindow chose a level window k), that is
  // the median of the last k normal steps of its class plus the event's own
  // lead over the same level before each past occurrence, give or take a
  // normal step's residual about its own preceding level. Over the whole
  // history the class mean is a level of long ago and the residuals spread
  // with the drift (an eval claimed to start anywhere in 130 ms of a
  // 1% contention's steps).
  const std::vector<std::vector<int64_t>>& level_steps = nb.level_steps;
  const std::vector<std::vector<double>>& level_durs = nb.level_durs;
  const double level_res_lo = nb.level_res_lo, level_res_hi = nb.level_res_hi;
  const bool level_ok =
      want_levels && nb.level_res_n >= static_cast<size_t>(std::ceil(2 / alpha_)) &&
      level_durs[static_cast<size_t>(step % np_period)].size() >= static_cast<size_t>(nk);
  // The level of step `st`'s class before it; NaN with fewer than k normal
  // steps of the class before it.
  const auto level_before = [&](int64_t st) {
    const auto r = static_cast<size_t>(st % np_period);
    const std::vector<int64_t>& at = level_steps[r];
    const auto end = static_cast<size_t>(std::lower_bound(at.begin(), at.end(), st) - at.begin());
    return end >= static_cast<size_t>(nk) ? LevelBefore(level_durs[r], end, nk)
                                          : std::numeric_limits<double>::quiet_NaN();
  };
  std::array<bool, kNumSlots> candidates{};
  for (const StepObs* o : pool) {
    if (o->kind != base) continue;
    for (int i = 0; i < o->num_slots; ++i) candidates[o->slots[i].key] = true;
  }
  for (int key = 0; key < kNumSlots; ++key) {
    if (m.rule_bits.test(key)) candidates[key] = true;
  }
  std::vector<double> a, b, d, lead, lead_level;
  std::vector<int64_t> d_step;  // the step of each length in d
  for (int key = 0; key < kNumSlots; ++key) {
    if (!candidates[key] || (!m.all_slots && key != kGapKey)) continue;
    const Occurrences& oc = occ_[key];
    a.clear();
    b.clear();
    d.clear();
    lead.clear();
    lead_level.clear();
    d_step.clear();
    if (oc.rule_valid) {
      // A learned event: it occurs exactly where its rule says.
      if (!oc.rule.OccursAt(step)) continue;
      // At a spike rule's step, its kept spike steps when 3 of them have the
      // slot (a full eval among short ones); else the steps alike.
      const auto take = [&](const StepObs& o) {
        const SlotObs* s = o.Find(key);
        if (s == nullptr || (measured && !usable(o)) || !alike(o)) return;
        lead.push_back(static_cast<double>(s->a) - class_mean(o.step));
        if (level_ok) lead_level.push_back(static_cast<double>(s->a) - level_before(o.step));
        a.push_back(static_cast<double>(s->a));
        b.push_back(static_cast<double>(s->b));
        d.push_back(static_cast<double>(s->b - s->a));
        d_step.push_back(o.step);
      };
      if (m.spike_bits.any()) {
        for (const StepObs& o : spikes_[static_cast<size_t>(m.spike_bits.first())].kept) {
          take(o);
        }
        if (a.size() < 3) {
          lead.clear();
          lead_level.clear();
          d_step.clear();
          a.clear();
          b.clear();
          d.clear();
        }
      }
      if (a.empty()) {
        for (const StepObs* o : pool) take(*o);
      }
      if (a.empty()) continue;
    } else {
      matching(slot_period_[kb][key]);
      const auto n = static_cast<int>(
          std::count_if(same.begin(), same.end(), [&](const StepObs* o) { return o->Knows(key); }));
      for (const StepObs* o : same) {
        const SlotObs* s = o->Find(key);
        if (s == nullptr) continue;
        lead.push_back(static_cast<double>(s->a) - class_mean(o->step));
        if (level_ok) lead_level.push_back(static_cast<double>(s->a) - level_before(o->step));
        a.push_back(static_cast<double>(s->a));
        b.push_back(static_cast<double>(s->b));
        d.push_back(static_cast<double>(s->b - s->a));
        d_step.push_back(o->step);
      }
      // Published only where the slot occurs in (nearly) every matching
      // step, and for normal steps once there are three of them.
      // The share of missing steps is at most α/2. In normal steps, once
      // the slot has been seen missing, by the rule of succession
      // ((missing + 1) / (n + 2)): it may be missing from far more than it
      // was seen missing from (a host-side gap of lognormal length, σ 0.8,
      // median 3 ms, below the 1 ms window minimum in 8.5 % of the steps,
      // missing from 1 of its first 44, was claimed in the next 24 at
      // precision 0.9495).
      const int need = base == StepKind::kNormal ? 3 : 1;
      const auto missing = static_cast<double>(n) - static_cast<double>(a.size());
      const double missing_share = base == StepKind::kNormal && missing > 0
                                       ? (missing + 1) / (n + 2)
                                       : missing / std::max(n, 1);
      if (n < need || missing_share > alpha_ / 2) continue;
    }
    const bool recurring = Recurring(key);
    if (key == kGapKey && d.size() > kRecentGaps) {
      // The gaps between steps come from the host's own loop (a loader
      // outside the hooks, logging), which may slow down or speed up without
      // any change in the steps (no regime change): their latest ones.
      const size_t n = d.size();
      const auto cut = static_cast<std::ptrdiff_t>(n - kRecentGaps);
      for (auto* xs : {&a, &b, &d, &lead, &lead_level}) {
        if (xs->size() == n) xs->erase(xs->begin(), xs->begin() + cut);
      }
      d_step.erase(d_step.begin(), d_step.begin() + cut);
    }
    // An event whose lengths follow its occurrences' own rhythm (a quick
    // eval every 200 steps and a full one every 400): the occurrences in
    // the next one's class only.
    if (!recurring) KeepOccurrenceClass(step, oc, a, b, d, lead, lead_level, d_step);
    std::vector<double> before_rise;
    if (!recurring && d.size() >= 2 && d_step.front() == oc.first &&
        d.front() > kColdFactor * *std::max_element(d.begin() + 1, d.end())) {
      // The job's first occurrence of an event ran cold (kernels compiled,
      // caches and lazy state filled), far longer than every later one: no
      // sample of their lengths. Kept, it spread the few lengths so that
      // nothing was guaranteed (the DataLoader recording's first eval took
      // 193 ms, the next 119: no claim for the third).
      d.erase(d.begin());
    }
    if (!recurring) {
      // An event's lengths from their latest level on (LevelShiftStart).
      // Where it starts and ends keeps the whole sample: a level of length
      // says nothing of the start's spread (steady_text's first eval ran
      // long and started late; without it the start was claimed too
      // early).
      auto start = static_cast<std::ptrdiff_t>(LevelShiftStart(d));
      if (start > 0 && Mean(d.begin() + start, d.end()) > Mean(d.begin(), d.begin() + start)) {
        // A rise is a new level only from its third length on, and only
        // above every length before it. Two lengths close by chance make
        // one of noise (saves of a lognormal σ 0.5: 381, 373, then 740, 715
        // claimed the next at 614 ms, and it took 155), and a rise to
        // lengths measured before is two modes at random (a quick or a
        // full eval by a coin's toss: 900, 900, 300, 300, then 900, 900
        // claimed the next at 758 ms, and it took 300).
        if (d.size() - static_cast<size_t>(start) < 3 ||
            *std::max_element(d.begin(), d.begin() + start) >=
                *std::min_element(d.begin() + start, d.end())) {
          start = 0;
        } else {
          before_rise = d;  // a rise: the whole sample's lower end still holds (below)
        }
      }
      d.erase(d.begin(), d.begin() + start);
    }
    // One occurrence of an event shows nothing of its spread: its start is
    // not claimed, its length only with the small-sample prior (at least 5%
    // noise, 1.5 z; Summarize) until a second one is measured.
    StepModel::Slot sl;
    sl.anchored_only = base != StepKind::kNormal && a.size() < 2;
    sl.key = key;
    sl.phase = slot_phase_[key];
    const double wm = window_cal_[static_cast<int>(SlotKind(key))].margin();
    // A window of every step (a data stall, a bubble, host-side time), not
    // an event, may have a heavy tail: its length and where it ends are
    // summarised in log space at the lower end (Spread::kPerSideLog). An
    // event's few lengths keep the lower half's linear spread: one that ran
    // late does not shorten the next one's guarantee.
    const Spread lengths = recurring ? Spread::kPerSideLog : Spread::kPerSide;
    Summarize(d, sl.d, wm, lengths);
    // A slot of every normal step whose lengths vary widely (a loader's
    // fetch overlapping the previous step's compute: what is left, often
    // nothing) in a regime's first ⌈1/α⌉ − 1 steps (21 at the default
    // confidence): its few lengths show nothing of how often it is missing
    // or short, and the next falls below all n of them with probability
    // 1 / (n + 1). Not claimed until then; one of nearly constant length is
    // structural, claimed from 3 with the small-sample prior. (A generated
    // loader's first 5 waits, 31-81 ms, claimed 18.5 ms of the next, which
    // waited 0.5.) The lengths of all its steps: a period chosen from so few
    // is no evidence (a loader that started 8 steps behind, 73-225 ms, got a
    // period of 2 whose classes varied by 0.15 and 0.26, and claimed 73 ms
    // of the next step, which waited 2), unless it cuts the spread to a
    // fifth (a stall every 3rd step: 1.4 in all steps, 0.05 in its class).
    // Later the slot's residue classes are few by their period, not by the
    // regime's length (a wait of ~5 ms, σ 0.3 in log space, with a stall
    // every 50th step: the waits' 50 classes claimed nothing for 1,000
    // steps when held to 21 each).
    if (recurring && base == StepKind::kNormal && key != kGapKey &&
        WidelyVaryingFew(pool, key, sl.d)) {
      continue;
    }
    if (!recurring && d_step.size() == 1 && d_step.front() == oc.first && ColdStart(normal)) {
      // Measured once (d_step: before a cold first length was left out
      // above), at its first occurrence in a job that started cold:
      // that one may have run cold too, and the next far shorter (a
      // recorded PyTorch LM trainer's first checkpoint took 17.1 ms, the
      // next 6.5 to 7.3: 14.0 ms was claimed for the second from the
      // first; the DataLoader recording's first eval 193 ms, the next 119).
      const double cold = d.front() / kColdFirstRatio;
      sl.d.lo = std::min(sl.d.lo, cold);
      sl.d.low_tail = std::min(sl.d.low_tail, cold);
    }
    if (!before_rise.empty()) {
      // After a rise the few lengths of the new level may claim less than
      // all of them do (a machine whose evals ran 120 ms, then 187, 170 and
      // 128 in a slow spell: 53 ms claimed from the last three, 115 ms from
      // all); the lower claim of the two is needlessly low.
      SampleSummary all;
      Summarize(before_rise, all, wm, lengths);
      sl.d.lo = std::max(sl.d.lo, all.lo);
      sl.d.low_tail = std::max(sl.d.low_tail, all.low_tail);
    }
    if (!recurring && d.size() < 3 && !pool.empty() && ModelNormalLevel() > 0) {
      // Fewer than three lengths in this regime (a change cut the history)
      // and some measured before it (older than every step the model is
      // built from): the few show little of the spread, and the event's
      // length did not change with the steps (scaled down where they are
      // faster now, as for an event not measured in this regime, below).
      // The lower claim of the two: a recording's saves of 8-13 ms with one
      // of 25.8, the first after a regime change, claimed the next at 21.1
      // ms from that one, and it took 10.5.
      int64_t oldest = std::numeric_limits<int64_t>::max();
      for (const StepObs* o : pool) oldest = std::min(oldest, o->step);
      const double now_level = ModelNormalLevel();
      std::vector<double> before;
      for (const Occurrences::Measured& x : oc.measured) {
        if (x.step < oldest && x.level > 0) before.push_back(x.LengthAt(now_level));
      }
      if (!before.empty()) {
        before.insert(before.end(), d.begin(), d.end());
        SampleSummary all;
        Summarize(before, all, wm, lengths);
        sl.d.lo = std::min(sl.d.lo, all.lo);
        sl.d.low_tail = std::min(sl.d.low_tail, all.low_tail);
      }
    }
    Summarize(a, sl.a, wm, Spread::kPerSide, sl.d.median);
    Summarize(b, sl.b, wm, lengths, sl.d.median);
    const auto np = static_cast<double>(d.size());
    if (base != StepKind::kNormal && recurring && np < 2 / alpha_ &&
        !PoolWithNormalSteps(step, key, wm, sl)) {
      continue;
    }
    if (np < 2 / alpha_ && sl.a.mean > 0.5 * normal.mean && normal.n >= 10) {
      // Few occurrences of a slot late in its step (an eval or checkpoint
      // after the training work): its start is the normal work of its own
      // step's residue class plus the event's own lead (the start offsets'
      // excess over their steps' class means), and varies like a normal
      // step's residual, which is well measured; its length is its own (at
      // least 5% noise assumed below 5 occurrences). Each at half the error
      // budget. Not where the event's own leads disagree (an eval whose
      // forward pass changed length): then their own spread rules.
      SampleSummary ls;
      Summarize(lead, ls, wm, Spread::kPerSide, sl.d.median);
      const bool residue_aware = ls.n > 0;
      const double a_mean = residue_aware ? class_mean(step) + ls.mean : sl.a.mean;
      const double lead_var = residue_aware ? ls.var : sl.a.var;
      const double own =
          np > 1 ? SmallSampleFactor(z_, np) * std::sqrt(lead_var * np / (np - 1) * (1 + 1 / np))
                 : 0.0;
      sl.a.lo = a_mean - std::max(-normal.lo, own);
      sl.a.hi = a_mean + std::max(normal.hi, own) + std::max(wm, 0.0) * sl.a.spread_hi;
      sl.a.mean = sl.a.median = a_mean;
      if (level_ok && !lead_level.empty() && lead_level.size() == lead.size() &&
          std::none_of(lead_level.begin(), lead_level.end(),
                       [](double x) { return std::isnan(x); })) {
        // The same at the normal steps' recent level (above), where that
        // is tighter.
        SampleSummary lv;
        Summarize(lead_level, lv, wm, Spread::kPerSide, sl.d.median);
        const double lv_mean =
            RecentLevel(level_durs[static_cast<size_t>(step % np_period)], nk) + lv.mean;
        const double lv_own =
            np > 1 ? SmallSampleFactor(z_, np) * std::sqrt(lv.var * np / (np - 1) * (1 + 1 / np))
                   : 0.0;
        const double lv_lo = lv_mean - std::max(-level_res_lo, lv_own);
        const double lv_hi = lv_mean + std::max(level_res_hi, lv_own);
        if (lv_hi - lv_lo < sl.a.hi - sl.a.lo - std::max(wm, 0.0) * sl.a.spread_hi) {
          sl.a.lo = lv_lo;
          sl.a.hi = lv_hi + std::max(wm, 0.0) * sl.a.spread_hi;
          sl.a.mean = sl.a.median = lv_mean;
        }
      }
      const double sd = std::max(sl.d.sd_lo, np < 5 ? 0.05 * sl.d.mean : 0.0);
      const double low = recurring ? sl.d.lo
                                   : std::min(sl.d.mean, sl.d.median) -
                                         SmallSampleFactor(z_, np) * sd * std::sqrt(1 + 1 / np) -
                                         std::max(wm, 0.0) * sl.d.spread_lo;
      // The end offsets of occurrences in other residue classes are no
      // sample of this one's when the normal steps have a rhythm.
      sl.b.lo = np_period > 1 ? sl.a.lo + low : std::max(sl.b.lo, sl.a.lo + low);
    }
    m.slots.push_back(std::move(sl));
  }
  // An event step not measured in this regime (a change cut the history)
  // whose event was measured before: each of its windows after a normal
  // step's work of now and its lead then (below), its lengths those
  // measured before, each scaled down where the normal steps are now
  // faster than when it was measured (never up: a slower machine or loader
  // does not shorten an eval). Claimed by its guaranteed length from the
  // window's open only; the step gets no duration bound until one is
  // measured. Without it the first event after every change went unclaimed
  // (the demo's last eval, after its machine slowed down 9 steps before).
  bool carried = false;
  if (!measured && kind != StepKind::kNormal && !combo) {
    const IdleKind ik = kind == StepKind::kCheckpoint ? IdleKind::kCheckpoint : IdleKind::kEval;
    const double now_level = ModelNormalLevel();
    std::vector<double> lengths, start_lo, start_hi;
    for (int ordinal = 0; ordinal < kMaxOrdinal && now_level > 0; ++ordinal) {
      const int key = SlotKey(ik, ordinal);
      const Occurrences& oc = occ_[key];
      lengths.clear();
      start_lo.clear();
      start_hi.clear();
      for (const Occurrences::Measured& x : oc.measured) {
        if (!(x.level > 0)) continue;
        const double speed = now_level / x.level;
        lengths.push_back(x.LengthAt(now_level));
        // It starts after a normal step's work of now plus its lead over
        // the work then (a forward pass before an eval's idle time), the
        // lead as it was or scaled by the steps' speed: only the training
        // work, or all of it, may have changed speed.
        const double ahead = x.start - x.level;
        start_lo.push_back(now_level + ahead * std::min(1.0, speed));
        start_hi.push_back(now_level + ahead * std::max(1.0, speed));
      }
      if (lengths.size() < 2) continue;
      StepModel::Slot sl;
      sl.key = key;
      sl.phase = slot_phase_[key];
      sl.anchored_only = true;
      Summarize(lengths, sl.d, window_cal_[static_cast<int>(ik)].margin(), Spread::kPerSide);
      if (sl.d.low_tail <= 0) continue;
      // Its start: within those, widened by a normal step's spread about
      // its median.
      sl.a = m.dur;
      sl.a.lo = *std::min_element(start_lo.begin(), start_lo.end()) -
                std::max(m.dur.median - m.dur.lo, 0.0);
      sl.a.hi = *std::max_element(start_hi.begin(), start_hi.end()) +
                std::max(m.dur.hi - m.dur.median, 0.0);
      std::sort(start_lo.begin(), start_lo.end());
      sl.a.median = sl.a.mean = QuantileSorted(start_lo, 0.5);
      sl.b = sl.a;
      sl.b.lo = sl.a.lo + sl.d.low_tail;
      sl.b.median = sl.a.median + sl.d.median;
      m.slots.push_back(std::move(sl));
      carried = true;
    }
  }
  // A declared event step not measured yet: the declared duration at the
  // end of a normal step, its guaranteed length 80% of it.
  if (!measured && kind != StepKind::kNormal && !carried) {
    const PeriodicEvent& ev =
        DeclaredEvent(kind == StepKind::kCheckpoint ? IdleKind::kCheckpoint : IdleKind::kEval);
    if (ev.expected_ns > 0) {
      const auto e = static_cast<double>(ev.expected_ns);
      StepModel::Slot sl;
      sl.key = SlotKey(kind == StepKind::kCheckpoint ? IdleKind::kCheckpoint : IdleKind::kEval, 0);
      sl.phase = kind == StepKind::kCheckpoint ? "checkpoint" : "eval";
      sl.declared = true;
      sl.anchored_only = true;
      m.kind_known = true;
      sl.a = m.dur;
      sl.b = m.dur;
      sl.b.lo = m.dur.lo + 0.8 * e;
      sl.b.median = m.dur.median + e;
      sl.d.n = 1;
      sl.d.median = sl.d.mean = e;
      sl.d.low_tail = 0.8 * e;
      sl.d.var = 0.01 * e * e;
      m.slots.push_back(sl);
      m.dur.lo += 0.8 * e;
      m.dur.hi += 1.2 * e;
      m.dur.hi_fit += 1.2 * e;
      m.dur.median += e;
      m.dur.mean += e;
      m.dur.var += 0.01 * e * e;
    }
  }
  std::sort(m.slots.begin(), m.slots.end(), [](const StepModel::Slot& x, const StepModel::Slot& y) {
    return x.a.median < y.a.median;
  });
  return m;
}

bool Forecaster::Impl::PoolWithNormalSteps(int64_t step, int key, double margin,
                                           StepModel::Slot& sl) const {
  const int period = std::max(slot_period_[static_cast<int>(StepKind::kNormal)][key], 1);
  auto [it, fresh] = normal_slots_.try_emplace({key, step % period});
  NormalSlotView& view = it->second;
  if (fresh) {
    int steps = 0;
    std::vector<double> lengths;
    for (const StepObs& o : hist_) {
      if (o.kind != StepKind::kNormal || o.step % period != step % period) continue;
      ++steps;
      if (const SlotObs* s = o.Find(key)) lengths.push_back(static_cast<double>(s->b - s->a));
    }
    // Too few to tell, or not the same slot (none of them has it): no view.
    view.judged = steps >= 2 / alpha_ && !lengths.empty();
    if (view.judged) {
      view.missing = static_cast<double>(lengths.size()) < (1 - alpha_ / 2) * steps;
      SampleSummary normal;
      Summarize(lengths, normal, margin, Spread::kPerSideLog);
      view.lo = normal.lo;
      view.low_tail = normal.low_tail;
    }
  }
  if (!view.judged) return true;
  if (view.missing) return false;
  if (view.low_tail >= sl.d.low_tail && view.lo >= sl.d.lo) return true;
  sl.d.lo = std::min(sl.d.lo, view.lo);
  sl.d.low_tail = std::min(sl.d.low_tail, view.low_tail);
  sl.b.lo = std::min(sl.b.lo, sl.a.lo + sl.d.lo);
  return true;
}

const StepModel& Forecaster::Impl::ModelFor(int64_t step, ModelParts parts) const {
  const StepKind kind = KindAt(step);
  const bool combo = EventAt(IdleKind::kCheckpoint, step) && EventAt(IdleKind::kEval, step);
  // Steps with the same kind and the same residues modulo every period in
  // use look alike: one model each.
  // The next logged step's event has a model of its own (BuildModel).
  const bool next = kind != StepKind::kNormal && step > last_step_ && step <= last_step_ + stride_;
  // A normal step between the logged ones: one model for all of them.
  const bool between = BetweenLogged(step);
  uint64_t h = ((static_cast<uint64_t>(kind) * 2 + (combo ? 1 : 0)) * 2 + (next ? 1 : 0)) * 2 +
               (between ? 1 : 0);
  for (const int p : periods_) h = h * 1'000'003 + static_cast<uint64_t>(between ? 0 : step % p);
  const SlotMask spikes = between ? SlotMask{} : SpikeBits(step);
  h = h * 1'000'003 + spikes.Hash();
  if (kind != StepKind::kNormal) {
    // An event's lengths may follow its occurrences' rhythm
    // (KeepOccurrenceClass): its place in a cycle of every such rhythm.
    for (const Occurrences& oc : occ_) {
      if (oc.HasLengthRhythm()) h = h * 1'000'003 + static_cast<uint64_t>(oc.ClassOf(step));
    }
  }
  // The learned spacing rules that put a window at the step: part of the
  // key, so that steps whose rules differ (a stall every 10th step, found by
  // its spacing, beside residues of other periods) do not evict each other's
  // models (the colocation demo's critical replica rebuilt 44,211 of the
  // 44,461 models its 121 forecasts built).
  const SlotMask bits = RuleBits(step);
  h = h * 1'000'003 + bits.Hash();
  const auto key = static_cast<int64_t>(h);
  auto it = cache_.find(key);
  if (it != cache_.end() && it->second.rule_bits == bits && it->second.spike_bits == spikes &&
      (it->second.all_slots || parts == ModelParts::kDuration)) {
    return it->second;
  }
  StepModel m = BuildModel(step, kind, combo, parts, next, between);
  bool seen = false;
  for (size_t i = 0; combo && !seen && i < hist_.size(); ++i) {
    seen = hist_[i].Find(SlotKey(IdleKind::kCheckpoint, 0)) != nullptr &&
           hist_[i].Find(SlotKey(IdleKind::kEval, 0)) != nullptr;
  }
  if (combo && !seen && m.ok) {
    // Checkpoint and eval in one step, never seen together: both lengths
    // add up; the windows before the events (at the step's start) keep
    // their sure parts; the others, and the eval's own, are claimed by their
    // guaranteed lengths only (the events' order and offsets are unknown,
    // their lengths are their own).
    const StepModel ev = BuildModel(step, StepKind::kEval, false, parts, next);
    const StepModel normal = BuildModel(step, StepKind::kNormal, false, ModelParts::kDuration);
    m.kind_known = m.kind_known && ev.kind_known;  // no length for an eval never measured
    if (ev.ok && normal.ok) {
      m.dur.lo += ev.dur.lo - normal.dur.hi;
      m.dur.hi += ev.dur.hi - normal.dur.lo;
      m.dur.hi_fit += ev.dur.hi_fit - normal.dur.lo;
      m.dur.mean += ev.dur.mean - normal.dur.mean;
      m.dur.median += ev.dur.median - normal.dur.median;
      m.dur.var += ev.dur.var + normal.dur.var;
    }
    for (StepModel::Slot& sl : m.slots) {
      if (sl.a.hi > std::max(normal.dur.lo, 0.0) / 2) sl.anchored_only = true;
    }
    for (const StepModel::Slot& sl : ev.slots) {
      if (SlotKind(sl.key) != IdleKind::kEval) continue;
      bool have = false;
      for (const StepModel::Slot& x : m.slots) have = have || x.key == sl.key;
      if (have) continue;
      StepModel::Slot e = sl;
      e.anchored_only = true;
      m.slots.push_back(std::move(e));
    }
  }
  StepModel& slot = cache_[key];
  slot = std::move(m);
  return slot;
}

bool Forecaster::Impl::DurationBound(int64_t step, double& lo, double& hi, bool* local) const {
  double widen = 0;
  if (!UnwidenedBound(step, lo, hi, local, &widen)) return false;
  if (AfterHighMiss()) hi += widen;
  return true;
}

bool Forecaster::Impl::UnwidenedBound(int64_t step, double& lo, double& hi, bool* local,
                                      double* widen) const {
  const StepModel& m = ModelFor(step, ModelParts::kDuration);
  if (!m.ok || !m.kind_known) return false;
  const bool use_local = step <= m.local_until;
  const SampleSummary& s = use_local ? m.dur_local : m.dur;
  // A level tells where the steps are now, not that they stay above it: a
  // loader that falls behind for a spell (its steps long) catches up on
  // any step.
  lo = std::max(use_local ? std::min(s.lo, m.dur.lo) : s.lo, 0.0);
  hi = s.hi;
  if (local != nullptr) *local = use_local;
  if (widen != nullptr) {
    *widen = std::max(burst_cal_[static_cast<int>(KindAt(step))].margin(), 0.0) *
             std::max(high_miss_excess_, s.spread);
  }
  return true;
}

bool Forecaster::Impl::MarginalBound(int64_t step, double& lo, double& hi, double& fit) const {
  const StepModel& m = ModelFor(step, ModelParts::kDuration);
  if (!m.ok || !m.kind_known) return false;
  lo = std::max(m.dur.lo, 0.0);
  hi = m.dur.hi;
  fit = m.dur.hi_fit;
  return true;
}

absl::StatusOr<std::vector<StepBound>> Forecaster::Impl::NextStepBounds(int n) const {
  if (n < 1)
    return absl::InvalidArgumentError(absl::StrCat("NextStepBounds: n must be >= 1, got ", n));
  if (!Ready()) return NotReady(static_cast<int64_t>(hist_.size()), opt_.min_steps);
  std::vector<StepBound> out;
  out.reserve(static_cast<size_t>(n));
  for (int i = 1; i <= n; ++i) {
    double lo = 0, hi = 0;
    if (!DurationBound(last_step_ + i, lo, hi)) break;
    out.push_back(StepBound{last_step_ + i, SatNs(std::floor(lo)), SatNs(std::ceil(hi)), conf_,
                            SatNs(std::ceil(GapHi(last_step_ + i)))});
  }
  return out;
}

double Forecaster::Impl::GapHi(int64_t step) const {
  // Never below mean + z·σ: the windows' calibrator, which narrows the
  // quantiles of claims that held more often than needed, is no judge of an
  // upper bound.
  if (const StepModel::Slot* gs = ModelFor(step, ModelParts::kDuration).GapSlot()) {
    return std::max({gs->d.hi, gs->d.mean + z_ * std::sqrt(gs->d.var), 0.0});
  }
  // No gap slot (gaps below min_window, or not in nearly every step of its
  // class): the gaps before the past steps of its residue class.
  const int64_t p = std::max(slot_period_[static_cast<int>(StepKind::kNormal)][kGapKey], 1);
  auto [it, fresh] = class_gap_hi_.try_emplace(step % p, 0.0);
  if (!fresh) return it->second;
  std::vector<double> v;
  for (const StepObs& o : hist_) {
    if (o.gap_ns >= 0 && o.step % p == step % p) v.push_back(static_cast<double>(o.gap_ns));
  }
  if (v.empty()) return 0;
  SampleSummary s;
  Summarize(v, s, 0.0, Spread::kWhole);
  it->second = std::max(s.hi, 0.0);
  return it->second;
}

absl::StatusOr<StepBound> Forecaster::Impl::SaveBound() const {
  const Occurrences& o = occ_[SlotKey(IdleKind::kCheckpoint, 0)];
  if (o.measured.empty()) {
    return absl::NotFoundError("no save bound: no checkpoint phase has been observed");
  }
  std::vector<double> v;
  for (const Occurrences::Measured& x : o.measured) v.push_back(x.length);
  SampleSummary s;
  Summarize(v, s, bound_cal_[static_cast<int>(StepKind::kCheckpoint)].margin(), Spread::kWhole);
  StepBound b;
  b.step = -1;
  for (int64_t st = last_step_ + 1; st <= last_step_ + 100'000; ++st) {
    if (DeclaredEvent(IdleKind::kCheckpoint).OccursAt(st) ||
        (o.rule_valid && o.rule.OccursAt(st)) || st == o.wall_step) {
      b.step = st;
      break;
    }
    if (DeclaredEvent(IdleKind::kCheckpoint).every_steps == 0 && !o.rule_valid &&
        st >= o.wall_step) {
      break;
    }
  }
  b.lo_ns = SatNs(std::floor(std::max(s.lo, 0.0)));
  b.hi_ns = SatNs(std::ceil(s.hi));
  b.confidence = conf_;
  return b;
}

int64_t Forecaster::Impl::LogStride() const {
  if (log_stride_ >= 0) return log_stride_;
  // The least gap, where every gap is a multiple of it: a change taken
  // back (Transient) leaves out the slow spell's steps, and a log of every
  // 10th step with one gap of 40 is still a log of every 10th.
  int64_t k = 0;
  for (size_t i = 1; i < hist_.size(); ++i) {
    const int64_t gap = hist_[i].step - hist_[i - 1].step;
    if (k == 0 || gap < k) k = gap;
  }
  for (size_t i = 1; k > 1 && i < hist_.size(); ++i) {
    if ((hist_[i].step - hist_[i - 1].step) % k != 0) k = 0;
  }
  log_stride_ = k > 1 ? k : 0;
  return log_stride_;
}

bool Forecaster::Impl::BetweenLogged(int64_t step) const {
  const int64_t k = LogStride();
  return k > 1 && step > last_step_ && (step - last_step_) % k != 0 &&
         KindAt(step) == StepKind::kNormal;
}

int64_t Forecaster::Impl::CycleLength() const {
  int64_t l = 1;
  for (const int p : periods_) {
    l = std::lcm(l, static_cast<int64_t>(p));
    if (l > kMaxCycle) return 0;
  }
  return l;
}

int64_t Forecaster::Impl::NextEventStep(int64_t from, int64_t limit) const {
  if (KindAt(from) != StepKind::kNormal) return from;  // inside a run of event steps
  int64_t best = limit;
  const auto consider = [&](const SpacingRule& rule) {
    if (rule.every > 0) best = std::min(best, rule.NextAt(from));
  };
  best = std::min(best, NextEvalOrCheckpoint(from));
  for (const int key : rule_keys_) consider(occ_[key].rule);
  spike_mask_.ForEach([&](int key) { consider(spikes_[static_cast<size_t>(key)].rule); });
  return std::max(best, from);
}

int64_t Forecaster::Impl::NextEvalOrCheckpoint(int64_t from) const {
  int64_t best = std::numeric_limits<int64_t>::max();
  const auto consider = [&](const SpacingRule& rule) {
    if (rule.every > 0) best = std::min(best, rule.NextAt(from));
  };
  for (const IdleKind k : {IdleKind::kCheckpoint, IdleKind::kEval}) {
    consider({DeclaredEvent(k).every_steps, DeclaredEvent(k).offset});
  }
  for (const IdleKind k : {IdleKind::kEval, IdleKind::kCheckpoint}) {
    const Occurrences& o = occ_[SlotKey(k, 0)];
    if (o.rule_valid) consider(o.rule);
    if (o.run_rule_valid && o.run_length >= 2) consider(o.run_rule);
    if (o.wall_step >= from) best = std::min(best, o.wall_step);
  }
  return best;
}

absl::StatusOr<Forecast> Forecaster::Impl::Predict(int64_t now_ns) {
  if (now_ns < 0 || now_ns > kMaxClockNs) {
    return absl::InvalidArgumentError(
        absl::StrCat("forecast time ", now_ns, " ns outside [0, 2^62] (0, ", kMaxClockNs, ")"));
  }
  if (!Ready()) return NotReady(static_cast<int64_t>(hist_.size()), opt_.min_steps);
  Forecast f;
  f.made_at_ns = now_ns;
  f.horizon_ns = opt_.horizon_ns;
  f.last_step = last_step_;
  f.steps_observed = static_cast<int64_t>(hist_.size());
  f.k = opt_.k;
  f.confidence = conf_;
  claims_.clear();

  std::array<int, kNumSlots> residue_listed{};  // far-ahead residue windows, per slot
  std::vector<double> g(gaps_.begin(), gaps_.end());
  double gap_lo = 0, gap_hi = 0, gap_var = 0;
  const double gap_mean = GapMean();
  if (!g.empty()) {
    std::sort(g.begin(), g.end());
    gap_lo = QuantileSorted(g, alpha_ / 2);
    gap_hi = QuantileSorted(g, 1 - alpha_ / 2);
    for (const double x : g) gap_var += (x - gap_mean) * (x - gap_mean);
    gap_var /= static_cast<double>(g.size());
  }
  // Times in doubles from the last step's end on: a clock reading near
  // 2^62 has a resolution of 1 µs in a double, and the sums along the walk
  // lost more (windows 2.1 µs late, one of exactly min_window dropped).
  const int64_t base = last_end_ns_;
  const auto now = static_cast<double>(now_ns - base);
  const double horizon_end = now + static_cast<double>(opt_.horizon_ns);
  const auto min_window = static_cast<double>(opt_.min_window_ns);
  double mid = gap_mean;  // expected start of the step
  double var = gap_var;   // variance of that start
  double level = 0;       // accumulated uncertainty of the level
  bool needed_known = false;
  const auto n_hist = static_cast<double>(hist_.size());
  // Jumping: once a whole cycle of consecutive normal steps (past the next
  // observed one) has given no window, no later normal step gives one either
  // (the start's uncertainty only grows), so the walk jumps from event to
  // event, advancing the start by the cycle's per-step increments (prefix
  // sums over one cycle). The cost is then independent of the horizon.
  // In a log of every k-th step, the steps between the logged ones have a
  // model of their own (BetweenLogged): the cycle spans k steps too.
  const int64_t stride = LogStride();
  int64_t cycle = CycleLength();
  if (stride > 1 && cycle > 0) {
    cycle = std::lcm(cycle, stride);
    if (cycle > kMaxCycle) cycle = 0;
  }
  const int64_t limit = last_step_ + 10'000'000;
  std::vector<double> inc_mid, inc_var, inc_level;  // per residue mod cycle
  std::vector<char> inc_seen;
  std::vector<double> pre_mid, pre_var, pre_level;  // prefix sums, once complete
  int64_t quiet = 0;
  const auto sum_over = [&](const std::vector<double>& pre, int64_t a, int64_t b) {
    // Σ over steps [a, b) of the per-residue increments.
    const double full = pre[static_cast<size_t>(cycle)];
    const auto upto = [&](int64_t x) {  // Σ over steps [0, x)
      const int64_t whole_cycles = x / cycle;
      return static_cast<double>(whole_cycles) * full + pre[static_cast<size_t>(x % cycle)];
    };
    return upto(b) - upto(a);
  };
  // A log of every k-th step (each gap in the history k) shows nothing of
  // the steps between: a stall every 5th step looks like a stall in every
  // step, and one every 3rd like one every 15th. No window is published for
  // the steps between (their times, drawn from the logged steps' lengths,
  // fell in the next logged step's work: a stall rhythm that changed from
  // every 3rd to every 5th step, logged every 5th, claimed windows at
  // precision 0.86). Their lengths still place the later steps. A log with
  // steps missing at random (gaps of 5, 10, 25) keeps them: there the walk
  // below stopped at the first cycle of steps without windows, and the
  // logged steps' windows after it were lost (recall 0.86 → 0.69).
  for (int64_t s = last_step_ + 1; s < limit; ++s) {
    const StepModel& m = ModelFor(s, ModelParts::kAll);
    if (!m.ok || m.dur.mean <= 0) break;
    const bool between_logged = stride > 1 && (s - last_step_) % stride != 0;
    // A step whose model has a gap before it (kGapKey: a flush every 50
    // steps, a batch fetched outside the hooks) starts after that gap, not
    // after the pooled gaps' mean.
    const StepModel::Slot* gs = m.GapSlot();
    const bool own_gap = gs != nullptr;
    const double gap_m = own_gap ? gs->d.mean : gap_mean, gap_v = own_gap ? gs->d.var : gap_var;
    mid += gap_m - gap_mean;
    var = std::max(var + gap_v - gap_var, 0.0);
    double s_lo = mid - z_ * std::sqrt(var) - level, s_hi = mid + z_ * std::sqrt(var) + level;
    // Where the step before it ends (the gap before it opens).
    const double pe_sd = z_ * std::sqrt(std::max(var - gap_v, 0.0));
    double pe_lo = mid - gap_m - pe_sd - level, pe_hi = mid - gap_m + pe_sd + level;
    if (s == last_step_ + 1) {
      s_lo = own_gap ? gs->d.lo : gap_lo;  // after the last step's end, at 0
      s_hi = own_gap ? gs->d.hi : gap_hi;
      pe_lo = pe_hi = 0;
    }
    if (s_lo >= horizon_end) break;
    if (!needed_known) {
      // The devices are needed once the first busy time of this step can begin.
      double needed = s_lo;
      for (const StepModel::Slot& sl : m.slots) {
        if (s_lo + std::max(sl.a.lo, 0.0) <= needed) needed = std::max(needed, s_lo + sl.b.lo);
      }
      f.devices_needed_at_ns = AtOffset(base, std::max(needed, now));
      needed_known = true;
    }
    const bool event_step = KindAt(s) != StepKind::kNormal;
    const size_t windows_before = f.windows.size();
    for (const StepModel::Slot& sl : m.slots) {
      if (suspect_ || between_logged || static_cast<int>(f.windows.size()) >= opt_.max_windows) {
        break;
      }
      IdleWindow w;
      w.step = s;
      w.kind = SlotKind(sl.key);
      w.ordinal = sl.key % kMaxOrdinal;
      w.confidence = conf_;
      w.phase = sl.phase;
      // The gap before a step starts when the step before it ends: known
      // for the next step, before its start (negative offsets) for others.
      w.before_step = sl.key == kGapKey;
      const double earliest = w.before_step ? pe_lo : s_lo + std::max(sl.a.lo, 0.0);
      const double latest = w.before_step ? pe_hi : s_hi + std::max(sl.a.hi, 0.0);
      // Starting more than 2^62 ns (146 years) after the last step: no
      // clock reading of the range (a hostile log's lengths).
      if (latest >= static_cast<double>(kMaxClockNs)) continue;
      w.earliest_start_ns = AtOffset(base, earliest);
      w.latest_start_ns = AtOffset(base, latest);
      w.guaranteed_ns = SatNs(std::max(sl.d.low_tail, 0.0));
      w.expected_ns = SatNs(std::max(sl.d.median, 0.0));
      double end_lo = sl.b.lo;
      CapByPriorRegime(s, sl.key, w.guaranteed_ns, end_lo);
      const double start = std::max(latest, now);
      const double end =
          std::min(w.before_step ? earliest + static_cast<double>(w.guaranteed_ns) : s_lo + end_lo,
                   horizon_end);
      // After one step far outside its bound (the start times are in doubt)
      // and for the slots marked so, no time is claimed by the clock; the
      // length once open still is.
      const bool anchored_only = outlier_ || sl.anchored_only;
      if (!anchored_only && end - start >= min_window && end > start) {
        w.start_ns = AtOffset(base, start);
        w.duration_ns = SatNs(end - start);
      } else {
        // Start too uncertain for a sure part: listed (with its guaranteed
        // length, usable from the window-open notice on) for events
        // (declared or learned), a spike rule's spikes, the next observed
        // step and the next kResidueAhead occurrences of a residue class's
        // window that stands out of its slot's other steps (a shard fetched
        // every 10th step, a buffer refilled every 3rd: kSpikeFactor times
        // the slot's median), not for the idle time of every normal step
        // further ahead.
        const auto key = static_cast<size_t>(sl.key);
        const bool residue =
            !event_step && slot_period_[static_cast<int>(StepKind::kNormal)][key] > 1 &&
            spikes_[key].reference > 0 &&
            static_cast<double>(w.guaranteed_ns) >= kSpikeFactor * spikes_[key].reference &&
            static_cast<double>(w.guaranteed_ns) >= min_window &&
            residue_listed[key] < kResidueAhead;
        if (!event_step && !occ_[sl.key].rule_valid && !m.spike_bits.test(sl.key) &&
            s > last_step_ + stride_ && !residue) {
          continue;
        }
        if (residue && s > last_step_ + stride_) ++residue_listed[key];
        w.start_ns = std::max(w.latest_start_ns, now_ns);
        w.duration_ns = 0;
        if (static_cast<double>(w.guaranteed_ns) < min_window) continue;
        if (static_cast<double>(w.start_ns - base) >= horizon_end) continue;
      }
      if ((w.duration_ns > 0 || w.guaranteed_ns > 0) && s <= last_step_ + kClaimSteps) {
        claims_.push_back(WindowClaim{s, sl.key, w.start_ns, w.start_ns + w.duration_ns,
                                      w.latest_start_ns, w.guaranteed_ns});
      }
      f.windows.push_back(std::move(w));
    }
    if (static_cast<int>(f.windows.size()) >= opt_.max_windows) break;
    const double d_mid = m.dur.mean + gap_mean, d_var = m.dur.var + gap_var;
    const double d_level = z_ * std::sqrt(m.dur.var / std::max(n_hist, 1.0));
    mid += d_mid;
    var += d_var;
    level += d_level;
    if (cycle == 0) continue;
    if (pre_mid.empty()) {
      // Events and spikes neither count nor reset.
      if (event_step || RuleBits(s).any() || m.spike_bits.any()) continue;
      if (s <= last_step_ + stride_ || f.windows.size() != windows_before) {
        quiet = 0;
        continue;
      }
      if (inc_seen.empty()) {
        inc_mid.assign(static_cast<size_t>(cycle), 0);
        inc_var = inc_level = inc_mid;
        inc_seen.assign(static_cast<size_t>(cycle), 0);
      }
      const auto r = static_cast<size_t>(s % cycle);
      inc_mid[r] = d_mid + gap_m - gap_mean;  // with the gap before it (above)
      inc_var[r] = std::max(d_var + gap_v - gap_var, 0.0);
      inc_level[r] = d_level;
      inc_seen[r] = 1;
      if (++quiet < cycle) continue;
      // Residues only ever seen at event steps: their normal steps' model.
      for (int64_t r2 = 0; r2 < cycle; ++r2) {
        if (inc_seen[static_cast<size_t>(r2)] != 0) continue;
        const int64_t at = s + 1 + (((r2 - s - 1) % cycle) + cycle) % cycle;
        const StepModel nm = BuildModel(at, StepKind::kNormal, false, ModelParts::kDuration, false,
                                        BetweenLogged(at));
        const StepModel::Slot* ng = nm.GapSlot();
        inc_mid[static_cast<size_t>(r2)] = nm.dur.mean + (ng != nullptr ? ng->d.mean : gap_mean);
        inc_var[static_cast<size_t>(r2)] = nm.dur.var + (ng != nullptr ? ng->d.var : gap_var);
        inc_level[static_cast<size_t>(r2)] = z_ * std::sqrt(nm.dur.var / std::max(n_hist, 1.0));
      }
      pre_mid.assign(static_cast<size_t>(cycle) + 1, 0);
      pre_var = pre_level = pre_mid;
      for (size_t i = 0; i < static_cast<size_t>(cycle); ++i) {
        pre_mid[i + 1] = pre_mid[i] + inc_mid[i];
        pre_var[i + 1] = pre_var[i] + inc_var[i];
        pre_level[i + 1] = pre_level[i] + inc_level[i];
      }
    }
    // Jump over the normal steps before the next event.
    const int64_t next = NextEventStep(s + 1, limit);
    if (next > s + 1) {
      mid += sum_over(pre_mid, s + 1, next);
      var += sum_over(pre_var, s + 1, next);
      level += sum_over(pre_level, s + 1, next);
      s = next - 1;
    }
  }
  if (!needed_known) f.devices_needed_at_ns = now_ns;
  // In time order, the sure parts not overlapping.
  std::stable_sort(
      f.windows.begin(), f.windows.end(),
      [](const IdleWindow& x, const IdleWindow& y) { return x.start_ns < y.start_ns; });
  int64_t prev_end = std::numeric_limits<int64_t>::min();
  for (IdleWindow& w : f.windows) {
    if (w.duration_ns > 0 && w.start_ns < prev_end) {
      const int64_t end = w.start_ns + w.duration_ns;
      w.start_ns = prev_end;
      w.duration_ns = std::max<int64_t>(end - prev_end, 0);
    }
    if (w.duration_ns > 0) prev_end = w.start_ns + w.duration_ns;
  }
  if (auto b = NextStepBounds(kBoundsInForecast); b.ok()) f.next_steps = *std::move(b);
  if (auto sb = SaveBound(); sb.ok()) f.save_hi_ns = sb->hi_ns;
  return f;
}

}  // namespace omni
