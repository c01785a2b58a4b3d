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
inline constexpr int kMaxSlotsPerStep = 16;

inline int SlotKey(IdleKind kind, int ordinal) {
  return static_cast<int>(kind) * kMaxOrdinal + ordinal;
}
inline IdleKind SlotKind(int key) { return static_cast<IdleKind>(key / kMaxOrdinal); }

struct SlotObs {
  int key = 0;
  int64_t a = 0, b = 0;  // relative to the step's start
  PhaseId phase = 0;
  bool has_phase = false;  // false: uncovered (host-side) time
};

struct StepObs {
  int64_t step = 0;
  int64_t start_ns = 0, end_ns = 0;
  StepKind kind = StepKind::kNormal;
  int num_slots = 0;
  std::array<SlotObs, kMaxSlotsPerStep> slots{};
  // The slots far longer here than in most steps (a bit per key; the
  // forecaster's spike test).
  uint64_t spikes = 0;
  int64_t duration() const { return end_ns - start_ns; }
  // The slot with `key`, or nullptr.
  const SlotObs* Find(int key) const;
};

// Reduces a valid record. Host-side intervals shorter than `min_host_ns` are
// dropped (the slivers between phases); when the schedule has stages > 1 and
// the record logs no pipeline_bubble time, the bubbles are derived from its
// compute phase.
StepObs ReduceStep(const StepRecord& rec, const PhaseCatalog& catalog,
                   const PipelineSchedule& pipeline, int64_t min_host_ns);

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
