#include "omni/evaluator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "notice_replay.h"
#include "omni/window_channel.h"
#include "step_slots.h"

namespace omni {

using nlohmann::json;

double EvaluationReport::Score::precision() const {
  return forecast_ns > 0 ? static_cast<double>(forecast_true_ns) / static_cast<double>(forecast_ns)
                         : std::numeric_limits<double>::quiet_NaN();
}
double EvaluationReport::Score::recall() const {
  return real_ns > 0 ? static_cast<double>(real_covered_ns) / static_cast<double>(real_ns)
                     : std::numeric_limits<double>::quiet_NaN();
}

namespace {

struct Interval {
  int64_t a, b;
  IdleKind kind;
};

// Calls fn(i, j, overlap) for every overlapping pair of the two sorted,
// internally non-overlapping interval lists.
template <typename Fn>
void ForEachOverlap(const Interval* x, size_t nx, const Interval* y, size_t ny, Fn&& fn) {
  size_t i = 0, j = 0;
  while (i < nx && j < ny) {
    const int64_t lo = std::max(x[i].a, y[j].a);
    const int64_t hi = std::min(x[i].b, y[j].b);
    if (hi > lo) fn(i, j, hi - lo);
    if (x[i].b < y[j].b) {
      ++i;
    } else {
      ++j;
    }
  }
}

// Sorts `v` and merges overlapping or touching intervals (the kind of the
// first of each merged run is kept).
void MergeInPlace(std::vector<Interval>& v) {
  std::sort(v.begin(), v.end(), [](const Interval& x, const Interval& y) { return x.a < y.a; });
  size_t n = 0;
  for (size_t k = 0; k < v.size(); ++k) {
    if (n > 0 && v[k].a <= v[n - 1].b) {
      v[n - 1].b = std::max(v[n - 1].b, v[k].b);
    } else {
      v[n++] = v[k];
    }
  }
  v.resize(n);
}

// `v` merged (MergeInPlace), then cut to known time (`known` is sorted and
// disjoint).
std::vector<Interval> MergedKnownPart(std::vector<Interval>& v,
                                      const std::vector<Interval>& known) {
  MergeInPlace(v);
  std::vector<Interval> cut;
  ForEachOverlap(
      v.data(), v.size(), known.data(), known.size(), [&](size_t vi, size_t ki, int64_t) {
        cut.push_back({std::max(v[vi].a, known[ki].a), std::min(v[vi].b, known[ki].b), v[vi].kind});
      });
  return cut;
}

// Claims past the next forecast (Evaluate): their claimed and true time,
// by kind and in total, cut to known time; the cut claims are appended to
// `kept` (the combined guest's).
void ScoreBeyond(const std::vector<Interval>& claims, const std::vector<Interval>& known,
                 const std::vector<Interval>& truth, EvaluationReport& report,
                 std::vector<Interval>& kept) {
  if (claims.empty()) return;
  std::array<std::vector<Interval>, kNumIdleKinds> by_kind;
  for (const Interval& c : claims) {
    if (c.b > c.a) by_kind[static_cast<int>(c.kind)].push_back(c);
  }
  for (std::vector<Interval>& v : by_kind) {
    const std::vector<Interval> cut = MergedKnownPart(v, known);
    if (cut.empty()) continue;
    kept.insert(kept.end(), cut.begin(), cut.end());
    const auto first = std::lower_bound(truth.begin(), truth.end(), cut.front().a,
                                        [](const Interval& iv, int64_t t) { return iv.b <= t; });
    std::vector<Interval> real;
    for (auto it = first; it != truth.end() && it->a < cut.back().b; ++it) real.push_back(*it);
    EvaluationReport::Score& k = report.by_kind[static_cast<int>(cut.front().kind)];
    for (const Interval& c : cut) {
      k.forecast_ns += c.b - c.a;
      report.total.forecast_ns += c.b - c.a;
    }
    ForEachOverlap(cut.data(), cut.size(), real.data(), real.size(),
                   [&](size_t, size_t, int64_t len) {
                     k.forecast_true_ns += len;
                     report.total.forecast_true_ns += len;
                   });
  }
}

// A guest acting on both the forecasts' windows and the live notices: the
// union of their claims, scored against the real idle time from `from` on.
void ScoreCombined(const std::vector<Interval>& forecast_claims,
                   const std::vector<NoticeClaim>& notice_claims,
                   const std::vector<Interval>& truth, const std::vector<Interval>& known,
                   int64_t from, bool keep_claims, EvaluationReport& report) {
  // Each kind's claims merged, then cut to known time; `all`: every kind's
  // together.
  std::array<std::vector<Interval>, kNumIdleKinds> by_kind;
  for (const Interval& c : forecast_claims) by_kind[static_cast<int>(c.kind)].push_back(c);
  for (const NoticeClaim& c : notice_claims) {
    if (c.end_ns > from) {
      by_kind[static_cast<int>(c.kind)].push_back({std::max(c.start_ns, from), c.end_ns, c.kind});
    }
  }
  std::vector<Interval> all;
  for (std::vector<Interval>& v : by_kind) {
    v = MergedKnownPart(v, known);
    all.insert(all.end(), v.begin(), v.end());
  }
  std::vector<Interval> real;
  for (const Interval& t : truth) {
    if (t.b > from) real.push_back({std::max(t.a, from), t.b, t.kind});
  }
  MergeInPlace(all);
  if (keep_claims) {
    report.combined_claims.reserve(all.size());
    for (const Interval& c : all) report.combined_claims.push_back({c.a, c.b, c.kind});
  }
  EvaluationReport::Score& total = report.combined_total;
  for (const Interval& c : all) total.forecast_ns += c.b - c.a;
  for (const Interval& r : real) {
    total.real_ns += r.b - r.a;
    report.combined_by_kind[static_cast<int>(r.kind)].real_ns += r.b - r.a;
  }
  ForEachOverlap(all.data(), all.size(), real.data(), real.size(),
                 [&](size_t, size_t ri, int64_t len) {
                   total.forecast_true_ns += len;
                   total.real_covered_ns += len;
                   report.combined_by_kind[static_cast<int>(real[ri].kind)].real_covered_ns += len;
                 });
  for (int k = 0; k < kNumIdleKinds; ++k) {
    const std::vector<Interval>& v = by_kind[k];
    EvaluationReport::Score& s = report.combined_by_kind[k];
    for (const Interval& c : v) s.forecast_ns += c.b - c.a;
    ForEachOverlap(v.data(), v.size(), real.data(), real.size(),
                   [&](size_t, size_t, int64_t len) { s.forecast_true_ns += len; });
  }
}

json ScoreJson(const EvaluationReport::Score& s) {
  const auto num = [](double v) {
    return std::isnan(v) ? json(nullptr) : json(std::round(v * 1e4) / 1e4);
  };
  return {{"forecast_ms", static_cast<double>(s.forecast_ns) / 1e6},
          {"forecast_true_ms", static_cast<double>(s.forecast_true_ns) / 1e6},
          {"real_ms", static_cast<double>(s.real_ns) / 1e6},
          {"real_covered_ms", static_cast<double>(s.real_covered_ns) / 1e6},
          {"precision", num(s.precision())},
          {"recall", num(s.recall())}};
}

// The kinds (not kNone) that were claimed or idle, each scored.
json KindsJson(const std::array<EvaluationReport::Score, kNumIdleKinds>& by_kind) {
  json k = json::object();
  for (int i = 1; i < kNumIdleKinds; ++i) {
    const EvaluationReport::Score& s = by_kind[i];
    if (s.forecast_ns == 0 && s.real_ns == 0) continue;
    k[std::string(IdleKindName(static_cast<IdleKind>(i)))] = ScoreJson(s);
  }
  return k;
}

}  // namespace

namespace {

// Next-step bound bookkeeping while replaying.
struct BoundTally {
  int64_t steps = 0, covered = 0;
  std::vector<double> slack;
  void Add(const StepBound& b, int64_t duration) {
    ++steps;
    if (duration >= b.lo_ns && duration <= b.hi_ns) ++covered;
    if (duration > 0) slack.push_back(static_cast<double>(b.hi_ns) / static_cast<double>(duration));
  }
  EvaluationReport::BoundScore Score() {
    EvaluationReport::BoundScore s;
    s.steps = steps;
    s.covered = covered;
    if (!slack.empty()) {
      std::nth_element(slack.begin(), slack.begin() + static_cast<long>(slack.size() / 2),
                       slack.end());
      s.slack_median = slack[slack.size() / 2];
    }
    return s;
  }
};

}  // namespace

namespace {

WindowClaim ClaimOf(const IdleWindow& w) {
  return WindowClaim{
      w.step,
      w.before_step ? kGapKey : SlotKey(w.kind, std::clamp(w.ordinal, 0, kMaxOrdinal - 1)),
      w.start_ns,
      w.start_ns + w.duration_ns,
      w.latest_start_ns,
      w.guaranteed_ns};
}

// RealiseClaim; `obs` nullptr: the step is not logged (the sure part only).
int Realise(const IdleWindow& w, const StepObs* obs, std::array<ClaimInterval, 2>& parts) {
  WindowClaim c = ClaimOf(w);
  if (obs == nullptr) {
    c.guaranteed = 0;
    return RealiseClaim(c, StepObs{}, parts);
  }
  return RealiseClaim(c, *obs, parts);
}

// The log's steps reduced as the forecaster sees them (ReduceStep): where
// each window's slot actually opened, the moment its live notice would be
// written. A step is reduced when a forecast first names it and kept while
// later forecasts may name it again; the steps a forecast has passed are
// dropped. (Reducing every step up front held about 1.1 KB a step beside
// the log's own records: 220 MB of 682 MB for 200,000 steps.)
class ReducedSteps {
 public:
  ReducedSteps(const StepLog& log, const ForecastOptions& fo) : log_(log), fo_(fo) {}

  // Whether step `step` is in the log.
  bool Logged(int64_t step) const { return IndexOf(step) < log_.steps.size(); }
  // The reduced step `step`, or null when it is not in the log. Valid until
  // the next call of DropBefore.
  const StepObs* Find(int64_t step) {
    const size_t i = IndexOf(step);
    if (i == log_.steps.size()) return nullptr;
    auto it = cache_.find(i);
    if (it == cache_.end()) {
      const StepRecord& rec = log_.steps[i];
      const bool consecutive = i > 0 && rec.step == log_.steps[i - 1].step + 1;
      it = cache_
               .emplace(i, ReduceStep(rec, log_.header.phases, fo_.pipeline, fo_.min_window_ns,
                                      consecutive ? log_.steps[i - 1].end_ns : -1))
               .first;
    }
    return &it->second;
  }
  // Drops the reduced steps before the log's i-th.
  void DropBefore(size_t i) { cache_.erase(cache_.begin(), cache_.lower_bound(i)); }

 private:
  // The index of step `step` in the log, or its size when not logged.
  size_t IndexOf(int64_t step) const {
    const auto it = std::lower_bound(log_.steps.begin(), log_.steps.end(), step,
                                     [](const StepRecord& r, int64_t s) { return r.step < s; });
    return it != log_.steps.end() && it->step == step ? static_cast<size_t>(it - log_.steps.begin())
                                                      : log_.steps.size();
  }

  const StepLog& log_;
  const ForecastOptions& fo_;
  std::map<size_t, StepObs> cache_;  // by index in the log
};

}  // namespace

std::vector<ClaimedSpan> WindowClaimedSpans(const IdleWindow& w, const StepRecord* step_record,
                                            const PhaseCatalog& catalog,
                                            const ForecastOptions& options, int64_t prev_end_ns) {
  std::array<ClaimInterval, 2> parts{};
  int n = 0;
  if (step_record != nullptr && !(w.before_step && prev_end_ns < 0)) {
    const StepObs obs =
        ReduceStep(*step_record, catalog, options.pipeline, options.min_window_ns, prev_end_ns);
    n = Realise(w, &obs, parts);
  } else {
    n = Realise(w, nullptr, parts);
  }
  std::vector<ClaimedSpan> out;
  out.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out.push_back({parts[i].a, parts[i].b});
  return out;
}

double EvaluationReport::BoundScore::coverage() const {
  return steps > 0 ? static_cast<double>(covered) / static_cast<double>(steps)
                   : std::numeric_limits<double>::quiet_NaN();
}

absl::StatusOr<EvaluationReport> Evaluate(const StepLog& log, const EvaluateOptions& options) {
  if (options.stride_steps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stride_steps must be positive, got ", options.stride_steps));
  }
  if (options.previous_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("previous_steps must not be negative, got ", options.previous_steps));
  }
  const NoticeReplayOptions& n = options.notices;
  if (!(n.confidence > 0 && n.confidence < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("notices.confidence must be in (0, 1), got ", n.confidence));
  }
  if (n.min_samples < 1 || n.window < 1 || n.poll_ns <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "notices.min_samples, notices.window and notices.poll_ns must be positive, got ",
        n.min_samples, ", ", n.window, " and ", n.poll_ns));
  }
  if (n.poll_ns > kMaxClockNs) {
    return absl::InvalidArgumentError(
        absl::StrCat("notices.poll_ns must be at most 2^62, got ", n.poll_ns));
  }
  if (log.steps.empty()) return absl::InvalidArgumentError("step log has no steps");
  // A resumed run: the previous run's steps, learned first (the live
  // telemetry's LearnPrevious) and not scored.
  std::vector<StepRecord> learned;
  if (options.previous != nullptr) {
    absl::StatusOr<std::vector<StepRecord>> prev = PreviousRunSteps(
        *options.previous, log.steps.front(), log.header.phases, options.previous_steps);
    if (!prev.ok()) return prev.status();
    learned = *std::move(prev);
  }
  // A log built in code, not read by ReadStepLog: the step numbers and
  // clock readings below are reckoned with before the forecaster sees them.
  for (const StepRecord& rec : log.steps) {
    if (auto st = ValidateStepRecord(rec, log.header.phases); !st.ok()) return st;
  }
  for (size_t i = 1; i < log.steps.size(); ++i) {
    if (log.steps[i].start_ns < log.steps[i - 1].start_ns) {  // (ReadStepLog refuses it too)
      return absl::InvalidArgumentError(absl::StrCat("step ", log.steps[i].step,
                                                     " starts before step ", log.steps[i - 1].step,
                                                     " started: the log's clock went back"));
    }
  }
  ForecastOptions fo = options.forecast;
  if (options.events_from_header) {
    fo.checkpoint = log.header.checkpoint;
    fo.eval = log.header.eval;
    fo.pipeline = log.header.pipeline;
  }
  auto forecaster = Forecaster::Create(fo);
  if (!forecaster.ok()) return forecaster.status();
  for (const StepRecord& rec : learned) {
    if (auto st = forecaster->Observe(rec, log.header.phases); !st.ok()) return st;
  }

  // Real idle time: the innermost-phase rule inside steps, and the gaps
  // between consecutive steps (host-side). Known time: the logged steps and
  // those gaps (a sampled log leaves the steps in between unknown).
  std::vector<Interval> truth, known;
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& rec = log.steps[i];
    const bool consecutive = i > 0 && rec.step == log.steps[i - 1].step + 1;
    if (consecutive && rec.start_ns > log.steps[i - 1].end_ns) {
      truth.push_back({log.steps[i - 1].end_ns, rec.start_ns, IdleKind::kHostSide});
    }
    if (consecutive && !known.empty()) {
      known.back().b = std::max(known.back().b, rec.end_ns);
    } else if (known.empty() || rec.start_ns >= known.back().b) {
      known.push_back({rec.start_ns, rec.end_ns, IdleKind::kNone});
    }
    ForEachIdleInterval(rec, log.header.phases, [&](const IdleInterval& iv) {
      truth.push_back({iv.start_ns, iv.end_ns, iv.kind});
    });
  }
  const int64_t log_end = log.steps.back().end_ns;
  if (options.scoring == Scoring::kHorizon) {
    // Each forecast scores up to a horizon of the log again (its windows,
    // the claims past it, the real idle time): the sums must fit in an
    // int64, with room to spare (live scoring scores each stretch once).
    const int64_t span = std::min(fo.horizon_ns, log_end - log.steps.front().start_ns);
    int64_t most = 0;
    if (__builtin_mul_overflow(span, 4 * static_cast<int64_t>(log.steps.size()), &most)) {
      return absl::InvalidArgumentError(
          absl::StrCat("horizon scoring of ", log.steps.size(), " forecasts over up to ", span,
                       " ns each overflows the sums: score live, or over a shorter horizon"));
    }
  }
  ReducedSteps reduced(log, fo);

  EvaluationReport report;
  report.scoring = options.scoring;
  report.claimed_confidence = fo.StatedConfidence();
  BoundTally all_bounds;
  std::array<BoundTally, kNumStepKinds> kind_bounds;
  int64_t ready = 0;
  std::vector<Interval> wins, clipped, real, beyond;
  std::vector<Interval> forecast_claims;  // every forecast's, for the combined score
  // Per step, the forecast windows its notices are matched to.
  std::vector<std::vector<ForecastClaim>> outlook_claims(log.steps.size());
  int64_t scored_from = -1;
  const size_t stride = static_cast<size_t>(options.stride_steps);
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& rec = log.steps[i];
    // The bound for this step, from the past only.
    const int64_t ahead = rec.step - forecaster->last_step();
    if (forecaster->last_step() >= 0 && ahead >= 1 && ahead <= 4096) {
      auto b = forecaster->NextStepBounds(static_cast<int>(ahead));
      if (b.ok() && !b->empty() && b->back().step == rec.step) {
        all_bounds.Add(b->back(), rec.duration_ns());
        kind_bounds[static_cast<int>(rec.kind())].Add(b->back(), rec.duration_ns());
      }
    }
    if (auto st = forecaster->Observe(rec, log.header.phases); !st.ok()) return st;
    const int64_t now = rec.end_ns;
    int64_t end = std::min(now + fo.horizon_ns, log_end);
    if (options.scoring == Scoring::kLive && i + stride < log.steps.size()) {
      end = std::min(end, log.steps[i + stride].end_ns);  // until the next forecast
    }
    auto f = forecaster->Predict(now);
    if (!f.ok()) continue;  // too few steps in the current regime
    if (i + 1 < log.steps.size()) {
      // The next step's windows as the channel reader matches them to its
      // notices (the outlook the worker publishes with this forecast).
      const WindowOutlook o = OutlookOf(*f, fo.max_windows, {}, &log.header.phases);
      for (int c = 0; c < o.num_claims; ++c) {
        const ForecastClaim& claim = o.claims[static_cast<size_t>(c)];
        if (claim.step == log.steps[i + 1].step) outlook_claims[i + 1].push_back(claim);
      }
    }
    if (ready++ % options.stride_steps != 0) continue;
    if (end <= now) continue;
    ++report.forecasts;
    // Each window as a guest uses it (RealiseClaim): its sure part, and its
    // guaranteed length from the moment it actually opens. A window whose
    // opening the log does not show is scored by its sure part only: one of
    // an unlogged step (sampled logs), and the host-side time before a step
    // whose predecessor is unlogged (it opened when that step ended).
    wins.clear();
    beyond.clear();
    std::array<ClaimInterval, 2> parts{};
    reduced.DropBefore(i);
    for (const IdleWindow& w : f->windows) {
      const bool opening_unseen = w.before_step && !reduced.Logged(w.step - 1);
      const int np = Realise(w, opening_unseen ? nullptr : reduced.Find(w.step), parts);
      for (int p = 0; p < np; ++p) {
        const int64_t a = std::max(parts[p].a, now);
        const int64_t b = std::min(parts[p].b, end);
        if (b > a) wins.push_back({a, b, w.kind});
        // A claim a guest began to use before the next forecast is its to
        // the claim's end: the part past that forecast counts in the
        // precision (an eval at a step's end claimed 1.27 s and lasted
        // 0.52 s: cut at the step's end, the next forecast's time, the
        // claim was all true). Not in the recall: that time is the next
        // forecast's.
        if (a < end && parts[p].b > end)
          beyond.push_back({end, std::min(parts[p].b, log_end), w.kind});
      }
    }
    ScoreBeyond(beyond, known, truth, report, forecast_claims);
    // In time order, overlaps merged (a window's guaranteed part may reach
    // into the next window's sure part).
    MergeInPlace(wins);
    // Only known time is scored.
    clipped.clear();
    ForEachOverlap(wins.data(), wins.size(), known.data(), known.size(),
                   [&](size_t wi, size_t ki, int64_t) {
                     clipped.push_back({std::max(wins[wi].a, known[ki].a),
                                        std::min(wins[wi].b, known[ki].b), wins[wi].kind});
                   });
    report.windows += static_cast<int64_t>(clipped.size());
    if (scored_from < 0) scored_from = now;
    forecast_claims.insert(forecast_claims.end(), clipped.begin(), clipped.end());
    // Truth intervals overlapping [now, end), clipped.
    auto first = std::lower_bound(truth.begin(), truth.end(), now,
                                  [](const Interval& iv, int64_t t) { return iv.b <= t; });
    real.clear();
    for (auto it = first; it != truth.end() && it->a < end; ++it) {
      real.push_back({std::max(it->a, now), std::min(it->b, end), it->kind});
    }
    for (const Interval& w : clipped) {
      report.by_kind[static_cast<int>(w.kind)].forecast_ns += w.b - w.a;
      report.total.forecast_ns += w.b - w.a;
    }
    for (const Interval& r : real) {
      report.by_kind[static_cast<int>(r.kind)].real_ns += r.b - r.a;
      report.total.real_ns += r.b - r.a;
    }
    ForEachOverlap(clipped.data(), clipped.size(), real.data(), real.size(),
                   [&](size_t wi, size_t ri, int64_t len) {
                     report.by_kind[static_cast<int>(clipped[wi].kind)].forecast_true_ns += len;
                     report.by_kind[static_cast<int>(real[ri].kind)].real_covered_ns += len;
                     report.total.forecast_true_ns += len;
                     report.total.real_covered_ns += len;
                   });
  }
  if (report.forecasts == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no forecast could be made from ", log.steps.size(),
                     " steps (too few steps in any regime, or the log ends there)"));
  }
  report.regime_changes = forecaster->regime_changes();
  report.transients = forecaster->transients();
  report.notice_options = options.notices;
  std::vector<NoticeClaim> notice_claims;
  report.notices =
      ReplayNotices(log, learned, options.notices, fo.min_window_ns,
                    options.notices.match_forecast ? &outlook_claims : nullptr, &notice_claims);
  ScoreCombined(forecast_claims, notice_claims, truth, known, scored_from,
                options.keep_notice_claims, report);
  if (options.keep_notice_claims) report.notice_claims = std::move(notice_claims);
  report.next_step = all_bounds.Score();
  for (int k = 0; k < kNumStepKinds; ++k) report.next_step_by_kind[k] = kind_bounds[k].Score();
  return report;
}

std::string EvaluationReport::ToJson() const {
  json j;
  j["schema"] = "omni.forecast_eval";
  j["version"] = 2;
  j["scoring"] = scoring == Scoring::kLive ? "live" : "horizon";
  j["forecasts"] = forecasts;
  j["windows"] = windows;
  j["claimed_confidence"] = std::round(claimed_confidence * 1e4) / 1e4;
  j["regime_changes"] = regime_changes;
  j["transients"] = transients;
  j["total"] = ScoreJson(total);
  const auto num = [](double v) {
    return std::isnan(v) ? json(nullptr) : json(std::round(v * 1e4) / 1e4);
  };
  j["next_step_coverage"] = num(next_step.coverage());
  j["next_step_slack_median"] = num(next_step.slack_median);
  j["next_step_steps"] = next_step.steps;
  json nk = json::object();
  for (int i = 0; i < kNumStepKinds; ++i) {
    const BoundScore& b = next_step_by_kind[i];
    if (b.steps == 0) continue;
    nk[StepKindName(static_cast<StepKind>(i))] = {{"steps", b.steps},
                                                  {"next_step_coverage", num(b.coverage())},
                                                  {"next_step_slack_median", num(b.slack_median)}};
  }
  j["next_step_by_kind"] = std::move(nk);
  j["by_kind"] = KindsJson(by_kind);
  j["notices"] = {{"confidence", notice_options.confidence},
                  {"min_samples", notice_options.min_samples},
                  {"window", notice_options.window},
                  {"poll_ms", static_cast<double>(notice_options.poll_ns) / 1e6},
                  {"first_claims", notices.first_claims},
                  {"first_claims_held", notices.first_claims_held},
                  {"forecast_matched", notices.forecast_matched},
                  {"match_forecast", notice_options.match_forecast},
                  {"total", ScoreJson(notices.total)},
                  {"by_kind", KindsJson(notices.by_kind)}};
  j["combined"] = {{"total", ScoreJson(combined_total)}, {"by_kind", KindsJson(combined_by_kind)}};
  return j.dump();
}

std::string EvaluationReport::ToTable() const {
  std::string out = absl::StrFormat("%d forecasts, %d windows scored (%s scoring)\n", forecasts,
                                    windows, scoring == Scoring::kLive ? "live" : "horizon");
  absl::StrAppend(&out, absl::StrFormat("  %-16s %12s %12s %10s %10s\n", "kind", "forecast(ms)",
                                        "real(ms)", "precision", "recall"));
  const auto row = [&](const std::string& name, const Score& s) {
    absl::StrAppend(
        &out, absl::StrFormat("  %-16s %12.1f %12.1f %10.4f %10.4f\n", name,
                              static_cast<double>(s.forecast_ns) / 1e6,
                              static_cast<double>(s.real_ns) / 1e6, s.precision(), s.recall()));
  };
  // The kinds claimed or idle (`claimed_only`: claimed).
  const auto kinds = [&](const std::array<Score, kNumIdleKinds>& by, bool claimed_only) {
    for (int i = 1; i < kNumIdleKinds; ++i) {
      const Score& s = by[i];
      if (s.forecast_ns == 0 && (claimed_only || s.real_ns == 0)) continue;
      row(std::string(IdleKindName(static_cast<IdleKind>(i))), s);
    }
  };
  kinds(by_kind, false);
  row("all", total);
  absl::StrAppend(&out,
                  absl::StrFormat("live notices (remaining duration at %.2f, read every %.1f ms "
                                  "while a window is open):\n",
                                  notice_options.confidence,
                                  static_cast<double>(notice_options.poll_ns) / 1e6));
  kinds(notices.by_kind, true);
  absl::StrAppend(&out, absl::StrFormat("  the claim at the open held in %d of %d windows; %d "
                                        "windows matched to a forecast window\n",
                                        notices.first_claims_held, notices.first_claims,
                                        notices.forecast_matched));
  absl::StrAppend(&out,
                  "a guest acting on both (the union of the windows' and the notices' claims):\n");
  kinds(combined_by_kind, false);
  row("all", combined_total);
  absl::StrAppend(&out,
                  absl::StrFormat("claimed confidence %.4f; next-step bounds: coverage %.4f, "
                                  "median slack %.3f over %d steps; %d regime changes, "
                                  "%d transients\n",
                                  claimed_confidence, next_step.coverage(), next_step.slack_median,
                                  next_step.steps, regime_changes, transients));
  return out;
}

}  // namespace omni
