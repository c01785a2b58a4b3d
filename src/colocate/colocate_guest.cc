#include "omni/colocate_guest.h"

#include <algorithm>
#include <limits>

namespace omni::colocate {

void ManualWindowSource::Open(const OpenWindow& window) {
  absl::MutexLock l(&mu_);
  window_ = window;
  window_.open = true;
  ++version_;
}

void ManualWindowSource::Close(uint64_t window_id, int64_t closed_ns) {
  if (gate_ != nullptr) gate_->HostClosed(window_id, closed_ns);
  absl::MutexLock l(&mu_);
  if (window_.window_id == window_id) window_.open = false;
  ++version_;
}

OpenWindow ManualWindowSource::Current() {
  absl::MutexLock l(&mu_);
  seen_ = version_;
  return window_;
}

bool ManualWindowSource::WaitForChange(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  const uint64_t seen = seen_;
  auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return version_ != seen; };
  return mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
}

const char* GuestStopName(GuestStop why) {
  switch (why) {
    case GuestStop::kMaxUnits:
      return "max_units";
    case GuestStop::kStopRequested:
      return "stop_requested";
    case GuestStop::kUnitFailed:
      return "unit_failed";
    case GuestStop::kHostBusy:
      return "host_busy";
    case GuestStop::kWaitedTooLong:
      return "waited_too_long";
  }
  return "unit_failed";
}

std::optional<GuestStop> StopWaiting(int64_t now_ns, int64_t waiting_since_ns,
                                     int64_t no_window_before_ns, absl::Duration max_wait) {
  if (max_wait == absl::InfiniteDuration()) return std::nullopt;
  const int64_t max_ns = absl::ToInt64Nanoseconds(std::max(max_wait, absl::ZeroDuration()));
  if (no_window_before_ns > 0 && no_window_before_ns - now_ns > max_ns) return GuestStop::kHostBusy;
  if (now_ns - waiting_since_ns >= max_ns) return GuestStop::kWaitedTooLong;
  return std::nullopt;
}

GuestLoopResult RunGuestLoop(GuestGate& gate, WindowSource& source,
                             const std::function<absl::Status()>& unit,
                             const std::atomic<bool>& stop, const GuestLoopOptions& options,
                             const Clock* clock) {
  GuestLoopResult r;
  UnitCostBound cost(options.initial_unit_ns);
  int64_t waiting_since = clock->NowNanos();
  uint64_t refused_window =
      std::numeric_limits<uint64_t>::max();  // the last window refused as too short
  for (;;) {
    if (stop.load(std::memory_order_acquire)) {
      r.why = GuestStop::kStopRequested;
      break;
    }
    if (options.max_units >= 0 && r.units >= options.max_units) {
      r.why = GuestStop::kMaxUnits;
      break;
    }
    const OpenWindow window = source.Current();
    const GateDecision d = gate.BeforeUnit(window, cost.BoundNs());
    if (d.verdict == GateVerdict::kWaitTooShort && window.window_id != refused_window) {
      refused_window = window.window_id;
      cost.Refused();
    }
    if (!d.start()) {
      const int64_t now = clock->NowNanos();
      const int64_t before =
          d.verdict == GateVerdict::kWaitNoWindow ? source.NoWindowBeforeNs() : 0;
      if (std::optional<GuestStop> why =
              StopWaiting(now, waiting_since, before, options.max_wait)) {
        r.why = *why;
        r.no_window_before_ns = before;
        r.waited_ns = now - waiting_since;
        break;
      }
      // Wake when the wait reaches max_wait, if that comes first.
      absl::Duration wait = options.wait_poll;
      if (options.max_wait != absl::InfiniteDuration()) {
        wait = std::min(wait, options.max_wait - absl::Nanoseconds(now - waiting_since));
      }
      source.WaitForChange(wait);
      continue;
    }
    const int64_t t0 = clock->NowNanos();
    absl::Status st = unit();
    const int64_t t1 = clock->NowNanos();
    gate.UnitDone(t1);
    if (!st.ok()) {
      r.why = GuestStop::kUnitFailed;
      r.unit_status = std::move(st);
      break;
    }
    cost.Observe(t1 - t0);
    ++r.units;
    waiting_since = t1;
  }
  r.unit_bound_ns = cost.BoundNs();
  r.unit_probes = cost.probes();
  r.unit_forgiven = cost.forgiven();
  r.stats = gate.Stats();
  return r;
}

PauseController::Action PauseController::Tick(const OpenWindow& window) {
  if (running_ && window.open && window.window_id != window_id_) {
    return Action::kPause;  // replaced: the host was busy between the two
  }
  OpenWindow w = window;
  if (until_close_ && w.open) {
    // Not bounded by the remainder: stopped at the close instead.
    w.remaining_ns = std::numeric_limits<int64_t>::max() / 2;
    w.as_of_ns = 0;
  }
  const GateDecision d = gate_->BeforeUnit(w, slice_ns_);
  if (d.start()) {
    window_id_ = window.window_id;
    return running_ ? Action::kNone : Action::kResume;
  }
  return running_ ? Action::kPause : Action::kNone;
}

void PauseController::Resumed() { running_ = true; }

void PauseController::Paused(int64_t stopped_ns) {
  running_ = false;
  gate_->UnitDone(stopped_ns);
}

}  // namespace omni::colocate
