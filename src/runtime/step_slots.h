// A step reduced to what the forecaster learns from: its duration, kind and
// idle intervals relative to its start, each keyed by a "slot" (idle kind,
// ordinal among the step's intervals of that kind). Private to omni_core.
//
// Thread safety: plain values.
#pragma once

#include <array>
#include <cstdint>

#include "omni/forecast.h"
#include "omni/phase.h"

namespace omni {

inline constexpr int kMaxOrdinal = kMaxIdleOrdinals;
inline constexpr int kNumSlots = kNumIdleKinds * kMaxOrdinal;
inline constexpr int kMaxSlotsPerStep = 32;

inline int SlotKey(IdleKind kind, int ordinal) {
  return static_cast<int>(kind) * kMaxOrdinal + ordinal;
}
// The host-side time before a step: from the end of the step before it
// (when that step was logged) to this step's start, a gap between steps. It
// has its own key (kind kNone, which has no other slot) and is published as
// a host_side window with IdleWindow::before_step.
inline constexpr int kGapKey = 0;
inline IdleKind SlotKind(int key) {
  return key == kGapKey ? IdleKind::kHostSide : static_cast<IdleKind>(key / kMaxOrdinal);
}

// A set of slot keys (a bit per key).
class SlotMask {
 public:
  bool test(int key) const { return ((w_[Word(key)] >> Bit(key)) & 1) != 0; }
  void set(int key) { w_[Word(key)] |= uint64_t{1} << Bit(key); }
  bool any() const {
    for (const uint64_t w : w_) {
      if (w != 0) return true;
    }
    return false;
  }
  // The least key in the set; REQUIRES: any().
  int first() const {
    for (size_t i = 0;; ++i) {
      if (w_[i] != 0) return static_cast<int>(i * 64) + __builtin_ctzll(w_[i]);
    }
  }
  // Calls f(key) for each key in the set, in ascending order.
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < w_.size(); ++i) {
      for (uint64_t m = w_[i]; m != 0; m &= m - 1) f(static_cast<int>(i * 64) + __builtin_ctzll(m));
    }
  }
  SlotMask operator&(const SlotMask& o) const {
    SlotMask r;
    for (size_t i = 0; i < w_.size(); ++i) r.w_[i] = w_[i] & o.w_[i];
    return r;
  }
  bool operator==(const SlotMask& o) const { return w_ == o.w_; }
  bool operator!=(const SlotMask& o) const { return w_ != o.w_; }
  uint64_t Hash() const {
    uint64_t h = 0;
    for (const uint64_t w : w_) h = h * 1'000'003 + w;
    return h;
  }

 private:
  static size_t Word(int key) { return static_cast<size_t>(key) / 64; }
  static int Bit(int key) { return key % 64; }
  std::array<uint64_t, (kNumSlots + 63) / 64> w_{};
};

struct SlotObs {
  int key = 0;
  int64_t a = 0, b = 0;  // relative to the step's start (negative before it: kGapKey)
  PhaseId phase = 0;
  bool has_phase = false;  // false: uncovered (host-side) time
};

struct StepObs {
  int64_t step = 0;
  int64_t start_ns = 0, end_ns = 0;
  StepKind kind = StepKind::kNormal;
  bool after_logged = false;  // the step before it is logged: its gap (kGapKey) is known
  int64_t gap_ns = -1;        // that gap, however short (-1: unknown)
  int num_slots = 0;
  std::array<SlotObs, kMaxSlotsPerStep> slots{};
  // The slots far longer here than in most steps (a bit per key; the
  // forecaster's spike test).
  SlotMask spikes;
  int64_t duration() const { return end_ns - start_ns; }
  // The slot with `key`, or nullptr.
  const SlotObs* Find(int key) const;
  // Whether the step tells if slot `key` occurred: not the gap before it
  // when its predecessor is not logged (the first step, a sampled log).
  bool Knows(int key) const { return key != kGapKey || after_logged; }
};

// Reduces a valid record. Host-side intervals shorter than `min_host_ns` are
// dropped (the slivers between phases); when the schedule has stages > 1 and
// the record logs no pipeline_bubble time, the bubbles are derived from its
// compute phase. `prev_end_ns`: the end of step rec.step − 1 when it was
// logged (else -1); a gap of at least `min_host_ns` from it to the step's
// start is the step's first slot, kGapKey.
StepObs ReduceStep(const StepRecord& rec, const PhaseCatalog& catalog,
                   const PipelineSchedule& pipeline, int64_t min_host_ns, int64_t prev_end_ns);

// What a published window lets a guest use, as replay scores it: its sure
// part [sure_a, sure_b) (absolute clock time; empty when the start is too
// uncertain), and, from the moment its slot actually opens in the step (the
// live window-open notice), `guaranteed` nanoseconds. A window whose slot does
// not open in the step claimed its guaranteed length from its latest start
// (a false claim, counted against it).
struct WindowClaim {
  int64_t step = 0;
  int key = 0;  // SlotKey(kind, ordinal)
  int64_t sure_a = 0, sure_b = 0;
  int64_t latest_start = 0;
  int64_t guaranteed = 0;
};

struct ClaimInterval {
  int64_t a = 0, b = 0;
};

// The claim's intervals in `obs` (the reduced record of claim.step), in time
// order and not overlapping: 0, 1 or 2 of them.
int RealiseClaim(const WindowClaim& claim, const StepObs& obs, std::array<ClaimInterval, 2>& out);

}  // namespace omni
