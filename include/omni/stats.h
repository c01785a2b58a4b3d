// Rolling statistics over the last N steps, with warm-up detection and
// attribution of checkpoint / eval steps.
//
// Implementation: src/runtime/stats.cc (StepStats), stats_window.cc
// (RollingWindow), stats_snapshot.cc (StatsSnapshot).
//
// Thread safety: RollingWindow and StepStats are not thread-safe; Telemetry
// owns one StepStats on its worker thread and hands out StatsSnapshot copies.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "omni/export.h"
#include "omni/phase.h"

namespace omni {

// Summary of a window of durations, all in nanoseconds.
struct Summary {
  int64_t count = 0;
  double mean = 0, stddev = 0, p50 = 0, p95 = 0, min = 0, max = 0;
};

// The last `capacity` values. Add and mean/stddev are O(1) and never allocate
// after construction; Summarize() sorts a copy (O(n log n)).
class OMNI_EXPORT RollingWindow {
 public:
  // REQUIRES: capacity > 0 (validated by StepStats::Create).
  explicit RollingWindow(int capacity);

  // REQUIRES: std::isfinite(value).
  void Add(double value);
  int size() const { return count_; }
  int capacity() const { return static_cast<int>(values_.size()); }
  bool empty() const { return count_ == 0; }
  double mean() const;
  double stddev() const;  // population standard deviation
  // Mean of the newest min(k, size()) values (0 when empty). O(k).
  double RecentMean(int k) const;
  Summary Summarize() const;
  // Values oldest first.
  std::vector<double> Values() const;

 private:
  std::vector<double> values_;
  int next_ = 0;
  int count_ = 0;
  double sum_ = 0, sum_sq_ = 0;
  int adds_since_recompute_ = 0;
  void Recompute();
};

// A step sequence is stationary once the median of the older half of the last
// `window` steps is within `max_drift` (relative) of the newer half's, after at
// least `min_steps`; steps before that are warm-up and left out of the
// statistics. Warm-up ends at `max_steps` regardless.
struct WarmupOptions {
  int min_steps = 5;
  int max_steps = 100;
  int window = 10;
  double max_drift = 0.10;
};

struct StepStatsOptions {
  int window = 200;  // steps kept per statistic
  WarmupOptions warmup;
};

// InvalidArgument naming the field for a zero or negative window, a warm-up
// window < 2, min_steps > max_steps, or a non-finite / negative drift.
OMNI_EXPORT absl::Status ValidateStepStatsOptions(const StepStatsOptions& options);

class OMNI_EXPORT StepStats {
 public:
  static absl::StatusOr<StepStats> Create(const StepStatsOptions& options,
                                          const PhaseCatalog& catalog = PhaseCatalog());

  // Adds one completed step. On error (InvalidArgument from
  // ValidateStepRecord, or a step number not after the last one) the record is
  // ignored and the statistics are unchanged.
  absl::Status Add(const StepRecord& rec);

  // Phases registered after construction (ids are stable, so only new names
  // and kinds are taken).
  void UpdateCatalog(const PhaseCatalog& catalog) { catalog_ = catalog; }
  const PhaseCatalog& catalog() const { return catalog_; }

  bool warming_up() const { return warming_up_; }
  int64_t steps_seen() const { return steps_seen_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t last_step() const { return last_step_; }
  int64_t last_end_ns() const { return last_end_ns_; }

  // Whole-step durations of steps of one kind (post warm-up).
  const RollingWindow& steps(StepKind kind) const { return step_windows_[static_cast<int>(kind)]; }
  // Per-step total time in `phase` (all its spans), over steps containing it.
  const RollingWindow& phase_total(PhaseId phase) const { return phase_total_[phase]; }
  // Per-step time of top-level `phase` (depth 0 spans only), over steps where
  // it occurs: the segments a forecast is built from.
  const RollingWindow& segment_total(PhaseId phase) const { return segment_total_[phase]; }
  // Per-step idle time inside top-level `phase` (innermost-phase rule), and
  // the kind of that idle time (last seen).
  const RollingWindow& segment_idle(PhaseId phase) const { return segment_idle_[phase]; }
  IdleKind segment_idle_kind(PhaseId phase) const { return segment_idle_kind_[phase]; }
  // Per-step time not covered by any phase (host-side idle).
  const RollingWindow& uncovered() const { return uncovered_; }
  // Top-level phases of the most recent post-warm-up step of `kind`, in order
  // (empty until one was seen).
  const std::vector<PhaseId>& shape(StepKind kind) const { return shapes_[static_cast<int>(kind)]; }

 private:
  StepStats(const StepStatsOptions& options, const PhaseCatalog& catalog);
  bool UpdateWarmup(double step_ns);

  StepStatsOptions options_;
  PhaseCatalog catalog_;
  bool warming_up_ = true;
  int64_t steps_seen_ = 0, warmup_steps_ = 0;
  int64_t last_step_ = -1, last_end_ns_ = 0;
  std::vector<double> recent_;  // warm-up detection ring, oldest first
  std::vector<RollingWindow> step_windows_, phase_total_, segment_total_, segment_idle_;
  std::array<IdleKind, kMaxPhases> segment_idle_kind_{};
  RollingWindow uncovered_;
  std::vector<std::vector<PhaseId>> shapes_;
};

// A copy of the statistics for reporting, with names resolved.
struct OMNI_EXPORT StatsSnapshot {
  struct Row {
    std::string name;       // "step", "step[checkpoint]", phase name, "uncovered"
    std::string idle_kind;  // for phases; "" for step rows
    Summary summary;
  };
  int64_t steps_seen = 0;
  int64_t warmup_steps = 0;
  bool warming_up = true;
  int window = 0;
  std::vector<Row> rows;  // steps by kind first, then phases, then uncovered

  // JSON object; durations in milliseconds. Schema in docs/telemetry.md.
  std::string ToJson() const;
  // A fixed-width table for terminals.
  std::string ToTable() const;
};

OMNI_EXPORT StatsSnapshot SnapshotOf(const StepStats& stats, int window);

}  // namespace omni
