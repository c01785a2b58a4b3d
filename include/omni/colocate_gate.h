// Guest side of co-location: a job that runs in a critical (host) job's idle
// windows gates its own work unit by unit.
//
// Before each unit (a step or a micro-batch) the guest asks BeforeUnit with
// the window that is open now (an adapter fills OpenWindow from the host's
// live notices or its store key) and a bound of the unit's cost: it starts the
// unit only when the window's remaining duration at the stated confidence
// covers cost + guard, and otherwise waits. When the host leaves its idle
// phase early, whoever reads the host's notices calls HostClosed (any
// thread); the guest sees it at its next unit boundary (cooperative yield:
// the latency is at most one unit) or is paused from outside (ProcessPauser,
// omni/colocate_pause.h). Both latencies are recorded: Stats().
//
// All times are nanoseconds on the gate's Clock.
//
// Thread safety: BeforeUnit, UnitDone and Stats are called by the guest's
// training thread; HostClosed may be called from any thread concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/export.h"

namespace omni::colocate {

// The host's window that is open now, as the notices channel states it.
struct OpenWindow {
  bool open = false;
  uint64_t window_id = 0;
  int64_t opened_at_ns = 0;
  // Remaining idle duration at `confidence`, as of as_of_ns.
  int64_t remaining_ns = 0;
  int64_t as_of_ns = 0;
  double confidence = 0;
};

enum class GateVerdict : uint8_t {
  kStart = 0,         // start the unit now
  kWaitNoWindow = 1,  // no window is open (or the host closed it)
  kWaitLowConfidence = 2,
  kWaitTooShort = 3,  // the window's remainder does not cover cost + guard
};

OMNI_EXPORT const char* GateVerdictName(GateVerdict v);

struct GateDecision {
  GateVerdict verdict = GateVerdict::kWaitNoWindow;
  // Remaining duration of the window at decision time (0 when none).
  int64_t remaining_ns = 0;
  bool start() const { return verdict == GateVerdict::kStart; }
};

struct GateOptions {
  // Margin between the end of a unit and the end of the window.
  absl::Duration guard = absl::Milliseconds(1);
  // Windows stated at a lower confidence are not used.
  double min_confidence = 0.9;
  // A unit that ends within this time after the host's close is a yield
  // within its bound, not a deadline miss (GateStats::overruns counts it).
  // 0 (the default) for units run to their boundary; a supervisor that pauses
  // the guest states its own bound: one poll + the stop latency.
  absl::Duration miss_tolerance = absl::ZeroDuration();
};

struct GateStats {
  int64_t units_started = 0;
  int64_t waits = 0;
  // Units that ended more than miss_tolerance after the host's window
  // closed (the host was delayed beyond the bound).
  int64_t deadline_misses = 0;
  int64_t overruns = 0;    // units that ended after the close at all
  int64_t overrun_ns = 0;  // total time units ran past the close
  // Yields: from the host's close to the guest's stop.
  int64_t yields = 0;
  int64_t yield_p50_ns = 0;
  int64_t yield_p99_ns = 0;
  int64_t yield_max_ns = 0;
  // Waits at an open window too short for the unit (kWaitTooShort), the
  // windows they came in, and the longest remainder such a window claimed at
  // a look: a cost bound above every claim of the host shows here.
  int64_t too_short_waits = 0;
  int64_t too_short_windows = 0;
  int64_t too_short_longest_ns = 0;
};

class OMNI_EXPORT GuestGate {
 public:
  // InvalidArgument for a null clock, a negative guard or miss_tolerance, a
  // min_confidence outside [0, 1].
  static absl::StatusOr<std::unique_ptr<GuestGate>> Create(const GateOptions& options,
                                                           const Clock* clock = Clock::Real());

  // At a unit boundary: start a unit whose cost is at most unit_cost_ns, or
  // wait? A close reported by HostClosed for this window (or a later one)
  // counts as "no window" and records the yield latency of the unit that was
  // running. A start is counted in Stats().units_started, a wait in waits.
  GateDecision BeforeUnit(const OpenWindow& window, int64_t unit_cost_ns);

  // The unit started by the last kStart ended at end_ns. When the host closed
  // the window before end_ns, the unit is a deadline miss and the overrun is
  // recorded.
  void UnitDone(int64_t end_ns);

  // The host left window `window_id` (or every window up to it) at closed_ns.
  // Any thread; lock-free.
  void HostClosed(uint64_t window_id, int64_t closed_ns);

  // Whether the host closed window `window_id` (or a later one): then true,
  // with the close time in *closed_ns. Any thread.
  bool ClosedAt(uint64_t window_id, int64_t* closed_ns) const;

  // Records a yield that happened outside the gate (e.g. a measured pause).
  void RecordYield(int64_t latency_ns);

  GateStats Stats() const;

  GuestGate(const GateOptions& options, const Clock* clock);  // use Create

 private:
  GateOptions options_;
  const Clock* clock_;
  int64_t guard_ns_;
  int64_t miss_tolerance_ns_;
  // Written by HostClosed (any thread): the highest closed window id + 1
  // (0: none) and when it closed.
  std::atomic<uint64_t> closed_upto_{0};
  std::atomic<int64_t> closed_at_ns_{0};
  // Training thread only.
  bool unit_running_ = false;
  uint64_t unit_window_ = 0;
  uint64_t yielded_window_ = 0;  // id + 1 of the last window whose close was counted
  uint64_t short_window_ = 0;    // id + 1 of the last window found too short
  GateStats stats_;
  std::vector<int64_t> yield_ns_;
};

// An upper bound of a unit's cost from the units seen: mean + k·stddev over an
// exponentially weighted history (weight `alpha` for the newest), never below
// the longest of the last few units; `initial_ns` before any unit.
//
// The first unit is a warm-up (a trainer's first step allocates, builds its
// graph, compiles kernels: 16-18 ms against 1 ms for the next ones here on a
// loaded machine) and is left out: `initial_ns` stays the bound until a
// second unit is measured. Learned from, it held the bound above every
// window its host opened, and such a bound is never corrected, since only
// units that ran are observed (the guest waited until its max_wait).
//
// A bound held up by one slow unit after that (a page fault, the host's
// burst on the guest's core) has the same defect: it keeps the guest out of
// every window shorter than it, and nothing corrects it. So after
// kProbeAfter windows refused as too short (Refused), one unit may start at
// a probe bound: the largest of the recent units but the largest one (the
// estimate given, while one unit is measured). A probe that costs no more
// than that forgives the slow unit: it leaves the sample the bound is drawn
// from. A slower one keeps the bound, and the next probe waits for twice as
// many refused windows (at most kMaxProbeAfter): a guest whose units are
// really that slow overruns a window once per probe, ever more rarely.
//
// Thread safety: one thread at a time.
class OMNI_EXPORT UnitCostBound {
 public:
  static constexpr int kProbeAfter = 4;
  static constexpr int kMaxProbeAfter = 256;

  explicit UnitCostBound(int64_t initial_ns, double k = 3.0, double alpha = 0.1)
      : initial_ns_(initial_ns), k_(k), alpha_(alpha) {}
  void Observe(int64_t unit_ns);
  // A window was refused as too short for BoundNs(); call once per window.
  void Refused();
  int64_t BoundNs() const;
  int64_t count() const { return n_ + (warmed_up_ ? 1 : 0); }
  // Whether BoundNs() is a probe's bound (the next unit is a probe).
  bool probing() const { return n_ > 0 && refused_ >= probe_after_ && ProbeNs() < SampleBoundNs(); }
  int64_t probes() const { return probes_; }
  int64_t forgiven() const { return forgiven_; }

 private:
  static constexpr int kRecent = 8;
  void Add(int64_t unit_ns);
  int64_t SampleBoundNs() const;
  int64_t ProbeNs() const;
  int64_t initial_ns_;
  double k_;
  double alpha_;
  bool warmed_up_ = false;  // the first unit was seen
  int64_t n_ = 0;           // units seen after it
  double mean_ = 0;
  double var_ = 0;
  int64_t recent_[kRecent] = {};
  int refused_ = 0;  // windows refused since the last unit
  int probe_after_ = kProbeAfter;
  int64_t probes_ = 0, forgiven_ = 0;
};

}  // namespace omni::colocate
