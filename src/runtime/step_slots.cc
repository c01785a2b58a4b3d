#include "step_slots.h"

#include <algorithm>
#include <utility>

namespace omni {

const SlotObs* StepObs::Find(int key) const {
  for (int i = 0; i < num_slots; ++i) {
    if (slots[i].key == key) return &slots[i];
  }
  return nullptr;
}

namespace {

// The deepest span covering [a, b), or -1 (uncovered).
int CoveringSpan(const StepRecord& rec, int64_t a, int64_t b) {
  int best = -1;
  for (int i = 0; i < rec.num_spans; ++i) {
    const PhaseSpan& s = rec.spans[i];
    if (s.start_ns <= a && s.end_ns >= b && (best < 0 || s.depth > rec.spans[best].depth)) {
      best = i;
    }
  }
  return best;
}

// Past kMaxOrdinal intervals of a kind, the last ordinal's slot moves to the
// latest one (kept in time order): a phase split into many pieces, such as an
// eval's decode passes, keeps the stretch after its last piece, where most of
// its idle time tends to be.
void AddSlot(StepObs& o, std::array<int, kNumIdleKinds>& ordinals, IdleKind kind, int64_t a,
             int64_t b, int span, const StepRecord& rec) {
  const int k = static_cast<int>(kind);
  int ordinal = ordinals[k];
  if (ordinal >= kMaxOrdinal) {
    ordinal = kMaxOrdinal - 1;
    const int key = SlotKey(kind, ordinal);
    const auto end = o.slots.begin() + o.num_slots;
    const auto it =
        std::find_if(o.slots.begin(), end, [&](const SlotObs& s) { return s.key == key; });
    if (it == end) return;
    std::rotate(it, it + 1, end);
    --o.num_slots;
  } else if (o.num_slots >= kMaxSlotsPerStep) {
    return;
  } else {
    ++ordinals[k];
  }
  SlotObs& s = o.slots[o.num_slots++];
  s.key = SlotKey(kind, ordinal);
  s.a = a - rec.start_ns;
  s.b = b - rec.start_ns;
  s.has_phase = span >= 0;
  s.phase = span >= 0 ? rec.spans[span].phase : 0;
}

}  // namespace

StepObs ReduceStep(const StepRecord& rec, const PhaseCatalog& catalog,
                   const PipelineSchedule& pipeline, int64_t min_host_ns, int64_t prev_end_ns) {
  StepObs o;
  o.step = rec.step;
  o.start_ns = rec.start_ns;
  o.end_ns = rec.end_ns;
  o.kind = rec.kind();
  o.after_logged = prev_end_ns >= 0;
  if (o.after_logged) o.gap_ns = std::max<int64_t>(rec.start_ns - prev_end_ns, 0);
  if (o.after_logged && rec.start_ns - prev_end_ns >= std::max<int64_t>(min_host_ns, 1)) {
    SlotObs& g = o.slots[o.num_slots++];
    g.key = kGapKey;
    g.a = prev_end_ns - rec.start_ns;
    g.b = 0;
  }
  std::array<int, kNumIdleKinds> ordinals{};
  bool bubbles = false;
  ForEachIdleInterval(rec, catalog, [&](const IdleInterval& iv) {
    if (iv.kind == IdleKind::kHostSide && iv.end_ns - iv.start_ns < min_host_ns) return;
    if (iv.kind == IdleKind::kPipelineBubble) bubbles = true;
    AddSlot(o, ordinals, iv.kind, iv.start_ns, iv.end_ns, CoveringSpan(rec, iv.start_ns, iv.end_ns),
            rec);
  });
  if (pipeline.stages <= 1 || bubbles) return o;
  // Declared schedule, bubbles not logged: split the first compute span.
  for (int i = 0; i < rec.num_spans; ++i) {
    const PhaseSpan& c = rec.spans[i];
    if (c.phase != phase::kCompute || c.depth != 0) continue;
    const double p = pipeline.stages, m = pipeline.micro_batches, r = pipeline.stage;
    const double len = static_cast<double>(c.end_ns - c.start_ns);
    const double tf = len / ((m + p - 1) * (1 + pipeline.backward_over_forward));
    const double tb = tf * pipeline.backward_over_forward;
    const double starts[3] = {0, r * tf + m * tf, len - r * tb};
    const double lens[3] = {r * tf, (p - 1 - r) * (tf + tb), r * tb};
    for (int j = 0; j < 3; ++j) {
      if (lens[j] <= 0) continue;
      const auto a = c.start_ns + static_cast<int64_t>(starts[j]);
      AddSlot(o, ordinals, IdleKind::kPipelineBubble, a, a + static_cast<int64_t>(lens[j]), i, rec);
    }
    break;
  }
  return o;
}

int RealiseClaim(const WindowClaim& claim, const StepObs& obs, std::array<ClaimInterval, 2>& out) {
  int n = 0;
  if (claim.sure_b > claim.sure_a) out[n++] = {claim.sure_a, claim.sure_b};
  if (claim.guaranteed <= 0) return n;
  const SlotObs* s = obs.Find(claim.key);
  const int64_t open = s != nullptr ? obs.start_ns + s->a : claim.latest_start;
  ClaimInterval g{open, open + claim.guaranteed};
  if (n == 0) {
    out[n++] = g;
    return n;
  }
  ClaimInterval& f = out[0];
  if (g.b < f.a || g.a > f.b) {  // disjoint: in time order
    if (g.a < f.a) std::swap(g, f);
    out[n++] = g;
  } else {
    f = {std::min(f.a, g.a), std::max(f.b, g.b)};
  }
  return n;
}

}  // namespace omni
