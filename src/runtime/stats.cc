#include "omni/stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace omni {

absl::Status ValidateStepStatsOptions(const StepStatsOptions& o) {
  if (o.window <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stats window must be positive, got ", o.window));
  }
  if (o.window > 1'000'000) {
    return absl::InvalidArgumentError(
        absl::StrCat("stats window must be at most 1000000, got ", o.window));
  }
  const WarmupOptions& w = o.warmup;
  if (w.window < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("warm-up window must be at least 2, got ", w.window));
  }
  if (w.min_steps < 0 || w.max_steps < 0) {
    return absl::InvalidArgumentError("warm-up min_steps and max_steps must not be negative");
  }
  if (w.min_steps > w.max_steps) {
    return absl::InvalidArgumentError(absl::StrCat("warm-up min_steps (", w.min_steps,
                                                   ") exceeds max_steps (", w.max_steps, ")"));
  }
  if (!std::isfinite(w.max_drift) || w.max_drift < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("warm-up max_drift must be finite and >= 0, got ", w.max_drift));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> StepStats::Create(const StepStatsOptions& options,
                                            const PhaseCatalog& catalog) {
  if (auto st = ValidateStepStatsOptions(options); !st.ok()) return st;
  return StepStats(options, catalog);
}

StepStats::StepStats(const StepStatsOptions& options, const PhaseCatalog& catalog)
    : options_(options),
      catalog_(catalog),
      step_windows_(kNumStepKinds, RollingWindow(options.window)),
      phase_total_(kMaxPhases, RollingWindow(options.window)),
      segment_total_(kMaxPhases, RollingWindow(options.window)),
      segment_idle_(kMaxPhases, RollingWindow(options.window)),
      uncovered_(options.window),
      shapes_(kNumStepKinds) {
  recent_.reserve(static_cast<size_t>(options.warmup.window));
  segment_idle_kind_.fill(IdleKind::kHostSide);
  if (options.warmup.max_steps == 0) warming_up_ = false;
}

namespace {
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

bool StepStats::UpdateWarmup(double step_ns) {
  const WarmupOptions& w = options_.warmup;
  if (static_cast<int>(recent_.size()) == w.window) recent_.erase(recent_.begin());
  recent_.push_back(step_ns);
  ++warmup_steps_;
  if (warmup_steps_ >= w.max_steps) return true;
  if (warmup_steps_ < w.min_steps || static_cast<int>(recent_.size()) < w.window) return false;
  const auto half = static_cast<std::ptrdiff_t>(recent_.size() / 2);
  const double older = Median(std::vector<double>(recent_.begin(), recent_.begin() + half));
  const double newer = Median(std::vector<double>(recent_.begin() + half, recent_.end()));
  const double all = Median(recent_);
  return all > 0 ? std::abs(newer - older) <= w.max_drift * all : true;
}

absl::Status StepStats::Add(const StepRecord& rec) {
  if (auto st = ValidateStepRecord(rec, catalog_); !st.ok()) return st;
  if (steps_seen_ > 0 && rec.step <= last_step_) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", rec.step, " is not after the last step ", last_step_));
  }
  ++steps_seen_;
  last_step_ = rec.step;
  last_end_ns_ = rec.end_ns;
  const StepKind kind = rec.kind();
  const auto dur = static_cast<double>(rec.duration_ns());

  if (warming_up_) {
    // Only normal steps decide stationarity; checkpoint / eval steps during
    // warm-up are left out too.
    if (kind == StepKind::kNormal && UpdateWarmup(dur)) {
      warming_up_ = false;
      recent_.clear();
      recent_.shrink_to_fit();
    } else if (kind != StepKind::kNormal) {
      ++warmup_steps_;
    }
    return absl::OkStatus();
  }

  step_windows_[static_cast<int>(kind)].Add(dur);

  // Per-phase totals (spans at any depth), except work nested inside a
  // checkpoint or eval phase, which belongs to that phase and must not inflate
  // e.g. the compute statistics.
  std::array<double, kMaxPhases> total{};
  std::array<double, kMaxPhases> seg_total{};
  std::array<double, kMaxPhases> seg_idle{};
  std::array<bool, kMaxPhases> present{};
  std::array<bool, kMaxPhases> seg_present{};
  std::vector<PhaseId>& shape = shapes_[static_cast<int>(kind)];
  shape.clear();
  int event_depth = -1;  // depth of the enclosing checkpoint/eval span, if any
  double covered = 0;
  for (int i = 0; i < rec.num_spans; ++i) {
    const PhaseSpan& s = rec.spans[i];
    const auto len = static_cast<double>(s.end_ns - s.start_ns);
    if (event_depth >= 0 && s.depth <= event_depth) event_depth = -1;
    if (event_depth < 0) {
      total[s.phase] += len;
      present[s.phase] = true;
    }
    if ((s.phase == phase::kCheckpoint || s.phase == phase::kEval) && event_depth < 0) {
      event_depth = s.depth;
    }
    if (s.depth == 0) {
      covered += len;
      seg_total[s.phase] += len;
      if (!seg_present[s.phase]) shape.push_back(s.phase);
      seg_present[s.phase] = true;
    }
  }
  // Idle time inside each top-level span (innermost-phase rule).
  int top = 0;  // index of the top-level span considered
  ForEachIdleInterval(rec, catalog_, [&](const IdleInterval& iv) {
    // Walk top-level spans in order; intervals come in time order.
    while (top < rec.num_spans &&
           (rec.spans[top].depth != 0 || rec.spans[top].end_ns <= iv.start_ns)) {
      ++top;
    }
    // Split the interval across the top-level spans it touches.
    int64_t a = iv.start_ns;
    for (int t = top; t < rec.num_spans && a < iv.end_ns; ++t) {
      const PhaseSpan& s = rec.spans[t];
      if (s.depth != 0) continue;
      if (s.start_ns >= iv.end_ns) break;
      const int64_t lo = std::max(a, s.start_ns);
      const int64_t hi = std::min(iv.end_ns, s.end_ns);
      if (hi > lo) {
        seg_idle[s.phase] += static_cast<double>(hi - lo);
        segment_idle_kind_[s.phase] = iv.kind;
      }
    }
  });
  for (int p = 0; p < catalog_.size(); ++p) {
    if (present[p]) phase_total_[p].Add(total[p]);
    if (seg_present[p]) {
      segment_total_[p].Add(seg_total[p]);
      segment_idle_[p].Add(seg_idle[p]);
    }
  }
  uncovered_.Add(std::max(0.0, dur - covered));
  return absl::OkStatus();
}

}  // namespace omni
