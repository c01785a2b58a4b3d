// The guest's loop: run units of work while the host's open window allows,
// wait otherwise, stop at a unit boundary when told. The pieces that do not
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
  OpenWindow Current() override;
  bool WaitForChange(absl::Duration timeout) override;

 private:
  GuestGate* gate_;
  absl::Mutex mu_;
  OpenWindow window_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seen_ ABSL_GUARDED_BY(mu_) = 0;  // the version Current() last returned
};

struct GuestLoopOptions {
  // Stop after this many units (< 0: no limit).
  int64_t max_units = -1;
  // The longest single wait for a window change before looking again.
  absl::Duration wait_poll = absl::Milliseconds(50);
  // The unit cost bound before any unit ran (e.g. the guest's next-step
  // bound from its own forecaster); then UnitCostBound learns it.
  int64_t initial_unit_ns = 50'000'000;
};

enum class GuestStop : uint8_t {
  kMaxUnits = 0,       // max_units done
  kStopRequested = 1,  // `stop` was set (e.g. the runtime decided to save and exit)
  kUnitFailed = 2,     // a unit returned an error (in unit_status)
};

struct GuestLoopResult {
  GuestStop why = GuestStop::kMaxUnits;
  int64_t units = 0;
  absl::Status unit_status;  // the failing unit's error for kUnitFailed
  GateStats stats;
};

// Runs `unit` whenever `gate` allows it in `source`'s current window, waits
// for a change otherwise, and checks `stop` at every boundary (so a stop
// takes at most one unit, or one wait_poll while waiting). Times are read
// from `clock`.
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
