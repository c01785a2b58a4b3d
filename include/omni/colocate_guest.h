// The guest's loop: run units of work while the host's open window allows,
// wait otherwise, stop at a unit boundary when told, or when waiting is not
// worth it (the host states it is busy for longer than the guest will wait). The pieces that do not
// depend on the Runtime: the Runtime facade wires its own save-and-exit
// decision into `stop`, and an adapter over the live notices channel (or the
// host's store key) implements WindowSource.
//
// Thread safety: RunGuestLoop runs on the guest's training thread.
// ManualWindowSource may be written from any thread (the notices reader)
// while the loop reads it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "omni/clock.h"
#include "omni/colocate_gate.h"
#include "omni/export.h"

namespace omni::colocate {

// Where a guest reads its host's windows.
class OMNI_EXPORT WindowSource {
 public:
  virtual ~WindowSource() = default;
  // The window open now (open == false when none).
  virtual OpenWindow Current() = 0;
  // Blocks until Current() may have changed, at most `timeout`; true when it
  // changed.
  virtual bool WaitForChange(absl::Duration timeout) = 0;
  // The earliest time (clock nanoseconds) a window this guest may use can
  // open, as the host states it: its latest forecast's next window of the
  // guest's kinds, or a busy period it announced (WindowOutlook::
  // NoWindowBeforeNs). 0 when the host states nothing (the default).
  virtual int64_t NoWindowBeforeNs() { return 0; }
};

// A WindowSource that a notices reader sets: Open when the host enters an
// idle phase, Close when it leaves (Close also tells the gate, so that a unit
// in flight is counted as a yield).
class OMNI_EXPORT ManualWindowSource final : public WindowSource {
 public:
  // `gate` (optional, not owned) receives HostClosed on Close.
  explicit ManualWindowSource(GuestGate* gate = nullptr) : gate_(gate) {}
  void Open(const OpenWindow& window);
  void Close(uint64_t window_id, int64_t closed_ns);
  // What the host states about its next window (NoWindowBeforeNs; 0: nothing).
  void SetNoWindowBefore(int64_t ns) { no_window_before_ns_.store(ns, std::memory_order_relaxed); }
  OpenWindow Current() override;
  bool WaitForChange(absl::Duration timeout) override;
  int64_t NoWindowBeforeNs() override {
    return no_window_before_ns_.load(std::memory_order_relaxed);
  }

 private:
  GuestGate* gate_;
  absl::Mutex mu_;
  OpenWindow window_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;  // the version Current() last returned
  std::atomic<int64_t> no_window_before_ns_{0};
};

struct GuestLoopOptions {
  // Stop after this many units (< 0: no limit).
  int64_t max_units = -1;
  // The longest single wait for a window change before looking again.
  absl::Duration wait_poll = absl::Milliseconds(50);
  // The unit cost bound before any unit ran (e.g. the guest's next-step
  // bound from its own forecaster); then UnitCostBound learns it.
  int64_t initial_unit_ns = 50'000'000;
  // The longest the guest waits for a window it can use (StopWaiting): it
  // stops (kHostBusy) as soon as the host states that no window of its kinds
  // can open within max_wait, and (kWaitedTooLong) once it has waited that
  // long without starting a unit. Infinite: it waits for ever.
  absl::Duration max_wait = absl::InfiniteDuration();
};

enum class GuestStop : uint8_t {
  kMaxUnits = 0,       // max_units done
  kStopRequested = 1,  // `stop` was set (e.g. the runtime decided to save and exit)
  kUnitFailed = 2,     // a unit returned an error (in unit_status)
  // Waiting for a window (max_wait): the host states that none of the
  // guest's kinds opens before no_window_before_ns, beyond max_wait.
  kHostBusy = 3,
  kWaitedTooLong = 4,  // no unit could start for max_wait
};
OMNI_EXPORT const char* GuestStopName(GuestStop why);  // "max_units", ..., "waited_too_long"

// The guest's decision while it waits for a window, at `now_ns`: it has
// waited since `waiting_since_ns` (its last unit's end, or its start), and
// the host states that no window it may use opens before
// `no_window_before_ns` (WindowSource::NoWindowBeforeNs; 0: no statement;
// pass 0 while a window is open, even one too short to use). kHostBusy when
// that time is more than `max_wait` away, else kWaitedTooLong when the wait
// has lasted `max_wait`, else nothing (keep waiting). An infinite max_wait
// never stops; a zero one stops at the first wait.
OMNI_EXPORT std::optional<GuestStop> StopWaiting(int64_t now_ns, int64_t waiting_since_ns,
                                                 int64_t no_window_before_ns,
                                                 absl::Duration max_wait);

struct GuestLoopResult {
  GuestStop why = GuestStop::kMaxUnits;
  int64_t units = 0;
  absl::Status unit_status;  // the failing unit's error for kUnitFailed
  // kHostBusy / kWaitedTooLong: the host's statement when the guest stopped
  // waiting (0: none) and how long it had waited.
  int64_t no_window_before_ns = 0;
  int64_t waited_ns = 0;
  int64_t unit_bound_ns = 0;  // the unit's cost bound when it stopped
  // Units run at a probe bound after windows were refused as too short,
  // and how many of them forgave a slow unit (UnitCostBound).
  int64_t unit_probes = 0, unit_forgiven = 0;
  GateStats stats;
};

// Runs `unit` whenever `gate` allows it in `source`'s current window, waits
// for a change otherwise, and checks `stop` at every boundary (so a stop
// takes at most one unit, or one wait_poll while waiting). While it waits it
// asks StopWaiting with options.max_wait at every wake-up (at least every
// wait_poll, and when the wait reaches max_wait). Times are read from
// `clock`.
OMNI_EXPORT GuestLoopResult RunGuestLoop(GuestGate& gate, WindowSource& source,
                                         const std::function<absl::Status()>& unit,
                                         const std::atomic<bool>& stop,
                                         const GuestLoopOptions& options,
                                         const Clock* clock = Clock::Real());

// Pausing instead of yielding at a unit boundary: a guest process whose
// units may not fit a window (or that does not use units at all) is resumed
// while a window is open and stopped from outside before it closes
// (ProcessPauser, omni/colocate_pause.h). The controller decides; the
// supervisor (e.g. `colocate_guest --pause`) acts, calling Tick every poll:
//  - kResume when the guest is stopped and the gate would start a unit of one
//    `slice` (the poll period) in the open window: the remainder at the
//    stated confidence covers slice + guard;
//  - kPause when it runs and the next slice no longer fits, the window closed,
//    or another window replaced it (the host was busy in between); after the
//    stop the supervisor calls Paused with the time the guest stopped, and
//    the gate records a yield (and a deadline miss when the host closed
//    before the stop) as for a unit that ended then.
// So the guest uses a window whatever the length of its own units, and is
// gone within one poll plus the stop latency of a close it did not foresee.
//
// With `until_close` the remainder is no constraint: the guest runs from the
// first poll of an open window until its close (the whole window, not only
// its part guaranteed at the stated confidence) and every window ends with a
// stop after the close, within the supervisor's yield bound. That suits a
// host whose wake-up preempts the guest at once (a CPU host blocked on I/O:
// the kernel runs the woken host before the running guest), not one that
// waits for the guest to stop (an accelerator's queue).
//
// Thread safety: one thread (the supervisor's) at a time; the gate's
// HostClosed may be called concurrently by the window source.
class OMNI_EXPORT PauseController {
 public:
  enum class Action : uint8_t { kNone = 0, kResume = 1, kPause = 2 };
  // `gate` (not owned) must outlive the controller. The guest starts stopped.
  PauseController(GuestGate* gate, int64_t slice_ns, bool until_close = false)
      : gate_(gate), slice_ns_(slice_ns), until_close_(until_close) {}
  Action Tick(const OpenWindow& window);
  // The guest was resumed / stopped (at stopped_ns on the gate's clock).
  void Resumed();
  void Paused(int64_t stopped_ns);
  bool running() const { return running_; }
  // The window the guest was last resumed in (0 before any).
  uint64_t window_id() const { return window_id_; }

 private:
  GuestGate* gate_;
  int64_t slice_ns_;
  bool until_close_;
  bool running_ = false;
  uint64_t window_id_ = 0;  // the window the guest runs in
};

}  // namespace omni::colocate
