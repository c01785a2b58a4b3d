// Implementation detail of omni/phase.h. Not part of the public API.
#pragma once

#include <algorithm>
#include <array>

namespace omni {

namespace internal {

// Calls out(a, b, span) for each elementary segment [a, b) of a valid record
// between consecutive span boundaries, in time order, with the index of the
// deepest span covering it (spans are nested, so that is unique), or -1 for
// uncovered step time.
template <typename Fn>
void ForEachInnermostSegment(const StepRecord& rec, Fn&& out) {
  std::array<int64_t, 2 * kMaxSpansPerStep + 2> cuts{};
  int n = 0;
  cuts[n++] = rec.start_ns;
  cuts[n++] = rec.end_ns;
  for (int i = 0; i < rec.num_spans; ++i) {
    cuts[n++] = rec.spans[i].start_ns;
    cuts[n++] = rec.spans[i].end_ns;
  }
  std::sort(cuts.begin(), cuts.begin() + n);
  n = static_cast<int>(std::unique(cuts.begin(), cuts.begin() + n) - cuts.begin());
  for (int c = 0; c + 1 < n; ++c) {
    const int64_t a = cuts[c], b = cuts[c + 1];
    if (a < rec.start_ns || b > rec.end_ns) continue;
    int best_depth = -1;
    int best = -1;
    for (int i = 0; i < rec.num_spans; ++i) {
      const PhaseSpan& s = rec.spans[i];
      if (s.start_ns <= a && s.end_ns >= b && static_cast<int>(s.depth) > best_depth) {
        best_depth = s.depth;
        best = i;
      }
    }
    out(a, b, best);
  }
}

}  // namespace internal

template <typename Fn>
void ForEachIdleInterval(const StepRecord& rec, const PhaseCatalog& catalog, Fn&& out) {
  bool have = false;
  IdleInterval cur;
  internal::ForEachInnermostSegment(rec, [&](int64_t a, int64_t b, int span) {
    IdleKind kind = IdleKind::kHostSide;  // uncovered step time
    if (span >= 0) {
      const PhaseId p = rec.spans[span].phase;
      kind = catalog.Contains(p) ? catalog.idle_kind(p) : IdleKind::kNone;
    }
    if (kind == IdleKind::kNone) return;
    if (have && cur.kind == kind && cur.end_ns == a) {
      cur.end_ns = b;
      return;
    }
    if (have) out(cur);
    cur = IdleInterval{a, b, kind};
    have = true;
  });
  if (have) out(cur);
}

template <typename Fn>
void ForEachPhaseWindow(const StepRecord& rec, const PhaseCatalog& catalog, Fn&& out) {
  std::array<int, kMaxPhases> count{};
  bool have = false;
  PhaseWindow cur;
  int cur_span = -1;  // innermost span of the last segment of `cur`
  internal::ForEachInnermostSegment(rec, [&](int64_t a, int64_t b, int span) {
    const PhaseId p = span >= 0 ? rec.spans[span].phase : PhaseId{0};
    const bool idle = span >= 0 && catalog.Contains(p) && catalog.idle_kind(p) != IdleKind::kNone;
    if (have && idle && cur.phase == p && cur.end_ns == a) {
      // The hooks keep a window open across one phase boundary that leaves the
      // same phase innermost (entering or leaving a nested span of it); a
      // span of the phase ending where a sibling of it begins closed it.
      const PhaseSpan& prev = rec.spans[cur_span];
      const bool continues = prev.end_ns >= b || rec.spans[span].start_ns < a;
      if (continues) {
        cur.end_ns = b;
        cur_span = span;
        return;
      }
    }
    if (have) out(cur);
    have = false;
    if (!idle) return;
    cur = PhaseWindow{a, b, p, count[p]++};
    cur_span = span;
    have = true;
  });
  if (have) out(cur);
}

}  // namespace omni
