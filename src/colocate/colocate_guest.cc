#include "omni/colocate_guest.h"

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

GuestLoopResult RunGuestLoop(GuestGate& gate, WindowSource& source,
                             const std::function<absl::Status()>& unit,
                             const std::atomic<bool>& stop, const GuestLoopOptions& options,
                             const Clock* clock) {
  GuestLoopResult r;
  UnitCostBound cost(options.initial_unit_ns);
  for (;;) {
    if (stop.load(std::memory_order_acquire)) {
      r.why = GuestStop::kStopRequested;
      break;
    }
    if (options.max_units >= 0 && r.units >= options.max_units) {
      r.why = GuestStop::kMaxUnits;
      break;
    }
    if (!gate.BeforeUnit(source.Current(), cost.BoundNs()).start()) {
      source.WaitForChange(options.wait_poll);
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
  }
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
