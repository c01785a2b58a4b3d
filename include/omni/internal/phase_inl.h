// Implementation detail of omni/phase.h. Not part of the public API.
#pragma once

#include <algorithm>

namespace omni {

template <typename Fn>
void ForEachIdleInterval(const StepRecord& rec, const PhaseCatalog& catalog, Fn&& out) {
  // Elementary segments between consecutive span boundaries; in each, the
  // deepest span covering it decides (spans are nested, so that is unique).
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
  bool have = false;
  IdleInterval cur;
  for (int c = 0; c + 1 < n; ++c) {
    const int64_t a = cuts[c], b = cuts[c + 1];
    if (a < rec.start_ns || b > rec.end_ns) continue;
    int best_depth = -1;
    IdleKind kind = IdleKind::kHostSide;  // uncovered step time
    for (int i = 0; i < rec.num_spans; ++i) {
      const PhaseSpan& s = rec.spans[i];
      if (s.start_ns <= a && s.end_ns >= b && static_cast<int>(s.depth) > best_depth) {
        best_depth = s.depth;
        kind = catalog.Contains(s.phase) ? catalog.idle_kind(s.phase) : IdleKind::kNone;
      }
    }
    if (kind == IdleKind::kNone) continue;
    if (have && cur.kind == kind && cur.end_ns == a) {
      cur.end_ns = b;
      continue;
    }
    if (have) out(cur);
    cur = IdleInterval{a, b, kind};
    have = true;
  }
  if (have) out(cur);
}

}  // namespace omni
