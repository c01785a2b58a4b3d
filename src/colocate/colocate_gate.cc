#include "omni/colocate_gate.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace omni::colocate {

const char* GateVerdictName(GateVerdict v) {
  switch (v) {
    case GateVerdict::kStart:
      return "start";
    case GateVerdict::kWaitNoWindow:
      return "wait_no_window";
    case GateVerdict::kWaitLowConfidence:
      return "wait_low_confidence";
    case GateVerdict::kWaitTooShort:
      return "wait_too_short";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<GuestGate>> GuestGate::Create(const GateOptions& options,
                                                             const Clock* clock) {
  if (clock == nullptr) return absl::InvalidArgumentError("guest gate: clock is null");
  if (options.guard < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("guest gate: guard is negative");
  }
  if (options.miss_tolerance < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("guest gate: miss_tolerance is negative");
  }
  if (!(options.min_confidence >= 0 && options.min_confidence <= 1)) {
    return absl::InvalidArgumentError("guest gate: min_confidence is outside [0, 1]");
  }
  return std::make_unique<GuestGate>(options, clock);
}

GuestGate::GuestGate(const GateOptions& options, const Clock* clock)
    : options_(options),
      clock_(clock),
      guard_ns_(absl::ToInt64Nanoseconds(options.guard)),
      miss_tolerance_ns_(absl::ToInt64Nanoseconds(options.miss_tolerance)) {}

void GuestGate::HostClosed(uint64_t window_id, int64_t closed_ns) {
  // The time first, then (release) the id it belongs to; a reader that sees
  // the id sees the time. Closes only move forward.
  uint64_t upto = closed_upto_.load(std::memory_order_relaxed);
  while (upto < window_id + 1) {
    closed_at_ns_.store(closed_ns, std::memory_order_relaxed);
    if (closed_upto_.compare_exchange_weak(upto, window_id + 1, std::memory_order_release,
                                           std::memory_order_relaxed)) {
      return;
    }
  }
}

bool GuestGate::ClosedAt(uint64_t window_id, int64_t* closed_ns) const {
  if (closed_upto_.load(std::memory_order_acquire) <= window_id) return false;
  *closed_ns = closed_at_ns_.load(std::memory_order_relaxed);
  return true;
}

GateDecision GuestGate::BeforeUnit(const OpenWindow& window, int64_t unit_cost_ns) {
  const int64_t now = clock_->NowNanos();
  GateDecision d;
  int64_t closed_ns = 0;
  if (!window.open || ClosedAt(window.window_id, &closed_ns)) {
    d.verdict = GateVerdict::kWaitNoWindow;
  } else {
    d.remaining_ns = std::max<int64_t>(0, window.remaining_ns - (now - window.as_of_ns));
    if (window.confidence < options_.min_confidence) {
      d.verdict = GateVerdict::kWaitLowConfidence;
    } else if (d.remaining_ns < unit_cost_ns + guard_ns_) {
      d.verdict = GateVerdict::kWaitTooShort;
      ++stats_.too_short_waits;
      if (std::exchange(short_window_, window.window_id + 1) != window.window_id + 1) {
        ++stats_.too_short_windows;
      }
      stats_.too_short_longest_ns = std::max(stats_.too_short_longest_ns, d.remaining_ns);
    } else {
      d.verdict = GateVerdict::kStart;
    }
  }
  if (d.start()) {
    unit_running_ = true;
    unit_window_ = window.window_id;
    ++stats_.units_started;
  } else {
    ++stats_.waits;
  }
  return d;
}

void GuestGate::UnitDone(int64_t end_ns) {
  if (!unit_running_) return;
  unit_running_ = false;
  int64_t closed_ns = 0;
  if (!ClosedAt(unit_window_, &closed_ns)) return;
  if (yielded_window_ > unit_window_) return;  // this close was counted already
  yielded_window_ = unit_window_ + 1;
  const int64_t latency = std::max<int64_t>(0, end_ns - closed_ns);
  if (end_ns > closed_ns) {
    ++stats_.overruns;
    stats_.overrun_ns += end_ns - closed_ns;
    if (end_ns - closed_ns > miss_tolerance_ns_) ++stats_.deadline_misses;
  }
  RecordYield(latency);
}

void GuestGate::RecordYield(int64_t latency_ns) {
  ++stats_.yields;
  yield_ns_.push_back(latency_ns);
}

GateStats GuestGate::Stats() const {
  GateStats s = stats_;
  if (!yield_ns_.empty()) {
    std::vector<int64_t> v = yield_ns_;
    std::sort(v.begin(), v.end());
    auto at = [&](double q) {
      const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
      return v[std::min(i, v.size() - 1)];
    };
    s.yield_p50_ns = at(0.5);
    s.yield_p99_ns = at(0.99);
    s.yield_max_ns = v.back();
  }
  return s;
}

void UnitCostBound::Observe(int64_t unit_ns) {
  if (!warmed_up_) {
    warmed_up_ = true;
    return;
  }
  if (probing()) {
    ++probes_;
    if (unit_ns <= ProbeNs()) {
      // The slow unit was one: the sample again without it, oldest first.
      ++forgiven_;
      probe_after_ = kProbeAfter;
      const int64_t k = std::min<int64_t>(n_, kRecent);
      std::vector<int64_t> kept;
      kept.reserve(static_cast<size_t>(k));
      for (int64_t i = n_ - k; i < n_; ++i) kept.push_back(recent_[i % kRecent]);
      kept.erase(std::max_element(kept.begin(), kept.end()));
      n_ = 0;
      mean_ = var_ = 0;
      for (const int64_t x : kept) Add(x);
    } else {
      probe_after_ = std::min(2 * probe_after_, kMaxProbeAfter);
    }
  }
  refused_ = 0;
  Add(unit_ns);
}

void UnitCostBound::Add(int64_t unit_ns) {
  const double x = static_cast<double>(unit_ns);
  if (n_ == 0) {
    mean_ = x;
    var_ = 0;
  } else {
    const double diff = x - mean_;
    const double incr = alpha_ * diff;
    mean_ += incr;
    var_ = (1 - alpha_) * (var_ + diff * incr);
  }
  recent_[n_ % kRecent] = unit_ns;
  ++n_;
}

void UnitCostBound::Refused() {
  if (refused_ < probe_after_) ++refused_;
}

int64_t UnitCostBound::SampleBoundNs() const {
  if (n_ == 0) return initial_ns_;
  const int64_t recent_max = *std::max_element(recent_, recent_ + std::min<int64_t>(n_, kRecent));
  const auto ew = static_cast<int64_t>(std::ceil(mean_ + k_ * std::sqrt(std::max(0.0, var_))));
  return std::max(ew, recent_max);
}

int64_t UnitCostBound::ProbeNs() const {
  const int64_t k = std::min<int64_t>(n_, kRecent);
  if (k <= 1) return std::min(initial_ns_, k == 1 ? recent_[0] : initial_ns_);
  int64_t v[kRecent];
  std::copy(recent_, recent_ + k, v);
  std::sort(v, v + k);
  return v[k - 2];
}

int64_t UnitCostBound::BoundNs() const { return probing() ? ProbeNs() : SampleBoundNs(); }

}  // namespace omni::colocate
