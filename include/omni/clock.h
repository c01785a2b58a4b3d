// Monotonic clocks, and waiting on them. Every timing in Omni goes through a
// Clock so that tests run on a FakeClock (no sleeps) and production on the
// steady system clock.
//
// Waiting: SleepUntil, SleepFor and AwaitUntil wait on the clock's own time
// line. On Clock::Real() they are the system's sleeps and timed waits. On a
// FakeClock no real time counts: a waiter wakes when Advance, Set or
// AdvanceToNextWake moves the fake time to its deadline (or, in AwaitUntil,
// as soon as its condition holds), so a test decides when time passes. A
// FakeClock that nobody moves never wakes a sleeper: a test whose code waits
// on the clock in threads of its own moves it while they wait (the tests'
// AutoAdvance, tests/unit/auto_advance.h, moves it to the next deadline
// whenever every thread of the process is blocked).
//
// Thread safety: all methods of both implementations may be called from any
// thread concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "omni/export.h"

namespace omni {

class OMNI_EXPORT Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds on a monotonic time line; only differences are meaningful.
  // Never compare values from two processes or hosts.
  virtual int64_t NowNanos() const = 0;

  // Blocks the calling thread until NowNanos() >= deadline_ns; returns at
  // once when it already is. The default sleeps in real time for what is
  // left, until the clock says the deadline has passed.
  virtual void SleepUntil(int64_t deadline_ns) const;
  // SleepUntil(NowNanos() + d).
  void SleepFor(std::chrono::nanoseconds d) const { SleepUntil(NowNanos() + d.count()); }

  // absl::Mutex::AwaitWithDeadline on this clock's time line. REQUIRES `mu`
  // held: waits, with `mu` released, until `cond` holds or NowNanos() >=
  // deadline_ns, whichever comes first, and returns with `mu` held again;
  // true when `cond` holds then. `cond` is evaluated with `mu` held, so what
  // makes it true must be changed under `mu`. The default waits in real time
  // for what is left, until the clock says the deadline has passed.
  virtual bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, int64_t deadline_ns) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // The process-wide steady clock (CLOCK_MONOTONIC). Never null, never freed.
  static const Clock* Real();
};

// A clock that only moves when told to. Starts at `start_ns`.
class OMNI_EXPORT FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 1'000'000'000);
  // A thread still waiting on the clock would never wake: destroying a
  // FakeClock with waiters aborts the process, naming how many wait.
  ~FakeClock() override;
  FakeClock(const FakeClock&) = delete;
  FakeClock& operator=(const FakeClock&) = delete;

  int64_t NowNanos() const override { return now_.load(std::memory_order_acquire); }
  // Moves the time by `d` (Set: to `ns`; it may move backwards) and wakes
  // every waiter whose deadline the new time reaches. Takes each such
  // waiter's mutex: call it without holding one a waiter waits with.
  void Advance(std::chrono::nanoseconds d);
  void Set(int64_t ns);

  // The earliest deadline a thread waits for (SleepUntil, AwaitUntil);
  // nullopt while none waits.
  std::optional<int64_t> NextWakeNanos() const;
  // Moves the time to NextWakeNanos() (never backwards) and wakes the
  // waiters due then (as Advance). False, and nothing moves, while none
  // waits.
  bool AdvanceToNextWake();

  // Wait until Advance, Set or AdvanceToNextWake reaches the deadline (or
  // `cond` holds); no real time counts.
  void SleepUntil(int64_t deadline_ns) const override;
  bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, int64_t deadline_ns) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

 private:
  struct Waiter;
  // Sets the time to `ns` and takes out of waiters_ those it makes due.
  std::vector<std::shared_ptr<Waiter>> MoveLocked(int64_t ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes them (without mu_ held).
  static void Wake(const std::vector<std::shared_ptr<Waiter>>& due);

  mutable absl::Mutex mu_;
  std::atomic<int64_t> now_;
  // By deadline. A waiter is in the map until it is woken (removed by the
  // waker) or its condition held first (removed by itself).
  mutable std::multimap<int64_t, std::shared_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace omni
