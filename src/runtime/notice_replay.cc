#include "notice_replay.h"

#include <algorithm>
#include <vector>

#include "omni/stats.h"
#include "omni/window_channel.h"
#include "quantile.h"

namespace omni {

namespace {

// One window's claims: a read at elapsed 0, then every `poll` (and at the
// last poll before each claim's end, where a later read would only extend
// it: the claimed end never falls as the elapsed time grows) until the
// window closed. Adds the claimed time and the part of it inside the window.
// The claimed stretches go to `claims` (if any) from `origin` (the open).
// `guaranteed`: the forecast's guaranteed length for the window (0: none).
void ScoreWindow(const DurationQuantiles& q, int64_t guaranteed, int64_t origin, int64_t duration,
                 IdleKind kind, const NoticeReplayOptions& o, EvaluationReport::Score& s,
                 EvaluationReport::NoticeScore& out, std::vector<NoticeClaim>* claims) {
  int64_t e = 0, covered_to = 0;
  bool first = true;
  while (e < duration) {
    const int64_t r = WithForecastClaim(RemainingGivenElapsed(q, e, o.confidence), guaranteed, e);
    if (first && r > 0) {
      ++out.first_claims;
      if (duration >= r) ++out.first_claims_held;
    }
    first = false;
    int64_t next = e + o.poll_ns;
    if (r > 0) {
      const int64_t end = e + r;
      const int64_t from = std::max(e, covered_to);
      if (end > from) {
        s.forecast_ns += end - from;
        s.forecast_true_ns += std::max<int64_t>(std::min(end, duration) - from, 0);
        s.real_covered_ns += std::max<int64_t>(std::min(end, duration) - from, 0);
        if (claims != nullptr) {
          if (!claims->empty() && claims->back().end_ns == origin + from) {
            claims->back().end_ns = origin + end;
          } else {
            claims->push_back({origin + from, origin + end, kind});
          }
        }
        covered_to = end;
      }
      next = std::max(next, end - (end - e) % o.poll_ns);
    } else {
      // Nothing claimed at e (so e is past the forecast's guaranteed
      // length): skip the polls before the table can claim again, rather
      // than poll every 0.5 ms of a window of days (a job paused
      // between two steps of its log).
      const int64_t until = NoClaimUntil(q, e, o.confidence);
      if (until >= duration) break;
      next = std::max(next, e + (until - e + o.poll_ns - 1) / o.poll_ns * o.poll_ns);
    }
    e = next;
  }
}

}  // namespace

EvaluationReport::NoticeScore ReplayNotices(const StepLog& log,
                                            const std::vector<StepRecord>& learned,
                                            const NoticeReplayOptions& o, int64_t min_window_ns,
                                            const std::vector<std::vector<ForecastClaim>>* forecast,
                                            std::vector<NoticeClaim>* claims) {
  EvaluationReport::NoticeScore out;
  const PhaseCatalog& catalog = log.header.phases;
  // The durations of each (phase, ordinal)'s last `window` windows, as the
  // telemetry worker keeps them (LearnWindows in telemetry.cc).
  std::vector<RollingWindow> seen(static_cast<size_t>(kNoticePhases) * kMaxWindowOrdinals,
                                  RollingWindow(o.window));
  const auto slot = [&](const PhaseWindow& w) -> RollingWindow& {
    return seen[NoticeTableIndex(w.phase, w.ordinal)];
  };
  const auto kind_of = [&](const PhaseWindow& w) {
    return w.phase == kBetweenStepsPhase ? IdleKind::kHostSide : catalog.idle_kind(w.phase);
  };
  // Of the last `window` gaps between steps, 1 for each that lasted
  // min_window: the gaps are announced while one did (telemetry.cc).
  RollingWindow long_gaps(o.window);
  // The forecast's claims scaled as the worker scales them.
  ForecastClaimScale scale(o.window, o.min_samples, o.confidence);
  // The confidence the tables' claims are computed at, as the worker
  // calibrates it.
  NoticeClaimLevel level(o.confidence);
  struct Matched {
    int64_t guaranteed = 0, table = -1;  // unscaled; the table's claim at the open
    int64_t claimed = -1;                // the notice's claim at the open
  };
  std::vector<Matched> matched;
  std::vector<PhaseWindow> windows;
  // The learned steps, then the log's: step j of the log is i = j + nl.
  const size_t nl = learned.size();
  const auto at = [&](size_t i) -> const StepRecord& {
    return i < nl ? learned[i] : log.steps[i - nl];
  };
  for (size_t i = 0; i < nl + log.steps.size(); ++i) {
    const StepRecord& rec = at(i);
    const bool scored = i >= nl;
    windows.clear();
    PhaseWindow gap;
    const bool gap_known =
        i > 0 && i != nl && GapWindowBefore(at(i - 1).step, at(i - 1).end_ns, rec, &gap);
    if (gap_known) windows.push_back(gap);
    ForEachPhaseWindow(rec, catalog, [&](const PhaseWindow& w) { windows.push_back(w); });
    matched.assign(windows.size(), Matched{});
    for (size_t wi = 0; wi < windows.size(); ++wi) {
      const PhaseWindow& w = windows[wi];
      const IdleKind kind = kind_of(w);
      if (kind == IdleKind::kNone) continue;
      const int64_t d = w.end_ns - w.start_ns;
      EvaluationReport::Score& s = out.by_kind[static_cast<int>(kind)];
      if (!scored) continue;  // learned below, not scored
      s.real_ns += d;
      // No notice for a gap while none of the last ones was long.
      const bool announced = w.phase != kBetweenStepsPhase || long_gaps.mean() > 0;
      int64_t guaranteed = 0;
      if (forecast != nullptr && i - nl < forecast->size()) {
        const std::vector<ForecastClaim>& c = (*forecast)[i - nl];
        guaranteed = ClaimFor(c.data(), c.data() + c.size(), rec.step, w.phase, kind, w.ordinal);
      }
      // The table (the fourth and later windows share one); none below
      // min_samples.
      DurationQuantiles table;
      if (slot(w).size() >= o.min_samples) {
        table = ClaimableQuantilesOf(slot(w).Values());
        table.claim_confidence = level.Confidence(w.phase, w.ordinal);
      }
      matched[wi] = {guaranteed, RemainingGivenElapsed(table, 0, o.confidence)};
      const int64_t scaled =
          scale.Scaled(w.phase, w.ordinal, guaranteed, level.Confidence(w.phase, w.ordinal));
      matched[wi].claimed = WithForecastClaim(matched[wi].table, scaled, 0);
      if (!announced) continue;
      if (scaled > 0) ++out.forecast_matched;
      if (table.samples == 0 && scaled <= 0) continue;
      ScoreWindow(table, scaled, w.start_ns, d, kind, o, s, out, claims);
    }
    if (gap_known) {
      long_gaps.Add(gap.end_ns - gap.start_ns >= min_window_ns ? 1.0 : 0.0);
    }
    for (size_t wi = 0; wi < windows.size(); ++wi) {
      const PhaseWindow& w = windows[wi];
      if (kind_of(w) == IdleKind::kNone) continue;
      // A record whose spans were truncated: not all its windows are there.
      if (rec.spans_truncated && w.phase != kBetweenStepsPhase) continue;
      const int64_t d = w.end_ns - w.start_ns;
      if (matched[wi].guaranteed > 0) {
        scale.Record(w.phase, w.ordinal, d, matched[wi].table, matched[wi].guaranteed);
      }
      if (matched[wi].claimed > 0) level.Record(w.phase, w.ordinal, d >= matched[wi].claimed);
      slot(w).Add(static_cast<double>(d));
    }
  }
  for (const EvaluationReport::Score& s : out.by_kind) {
    out.total.forecast_ns += s.forecast_ns;
    out.total.forecast_true_ns += s.forecast_true_ns;
    out.total.real_ns += s.real_ns;
    out.total.real_covered_ns += s.real_covered_ns;
  }
  return out;
}

}  // namespace omni
