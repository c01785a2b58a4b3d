// Monotonic clocks. Every timing in Omni goes through a Clock so that tests run
// on a FakeClock (no sleeps) and production on the steady system clock.
//
// Thread safety: all methods of both implementations may be called from any
// thread concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "omni/export.h"

namespace omni {

class OMNI_EXPORT Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds on a monotonic time line; only differences are meaningful.
  // Never compare values from two processes or hosts.
  virtual int64_t NowNanos() const = 0;

  // The process-wide steady clock (CLOCK_MONOTONIC). Never null, never freed.
  static const Clock* Real();
};

// A clock that only moves when told to. Starts at `start_ns`.
class OMNI_EXPORT FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ns = 1'000'000'000) : now_(start_ns) {}
  int64_t NowNanos() const override { return now_.load(std::memory_order_relaxed); }
  void Advance(std::chrono::nanoseconds d) { now_.fetch_add(d.count(), std::memory_order_relaxed); }
  void Set(int64_t ns) { now_.store(ns, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace omni
