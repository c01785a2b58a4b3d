#include "omni/clock.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace omni {
namespace {

class SteadyClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
};

}  // namespace

const Clock* Clock::Real() {
  static const SteadyClock clock;
  return &clock;
}

void Clock::SleepUntil(int64_t deadline_ns) const {
  for (int64_t left = deadline_ns - NowNanos(); left > 0; left = deadline_ns - NowNanos()) {
    absl::SleepFor(absl::Nanoseconds(left));
  }
}

bool Clock::AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, int64_t deadline_ns) const {
  for (;;) {
    const int64_t left = std::max<int64_t>(deadline_ns - NowNanos(), 0);
    if (mu.AwaitWithTimeout(cond, absl::Nanoseconds(left))) return true;
    if (NowNanos() >= deadline_ns) return false;
  }
}

// One thread waiting in AwaitUntil. Its waker (the thread that moves the time
// past its deadline) takes it out of the clock's map, then sets `due` under
// the waiter's own mutex; the waiter returns only once that is done, so that
// no waker touches its mutex afterwards.
struct FakeClock::Waiter {
  explicit Waiter(absl::Mutex& m) : mu(m) {}
  absl::Mutex& mu;
  bool due = false;  // guarded by `mu`
};

FakeClock::FakeClock(int64_t start_ns) : now_(start_ns) {}

FakeClock::~FakeClock() {
  absl::MutexLock lock(&mu_);
  if (!waiters_.empty()) {
    std::fprintf(stderr,
                 "omni::FakeClock destroyed while %zu thread(s) wait on it: they would never wake "
                 "(stop them before the clock)\n",
                 waiters_.size());
    std::abort();
  }
}

std::vector<std::shared_ptr<FakeClock::Waiter>> FakeClock::MoveLocked(int64_t ns) {
  now_.store(ns, std::memory_order_release);
  std::vector<std::shared_ptr<Waiter>> due;
  while (!waiters_.empty() && waiters_.begin()->first <= ns) {
    due.push_back(std::move(waiters_.begin()->second));
    waiters_.erase(waiters_.begin());
  }
  return due;
}

void FakeClock::Wake(const std::vector<std::shared_ptr<Waiter>>& due) {
  // Without mu_ held: a waiter holds its own mutex while it takes mu_.
  for (const std::shared_ptr<Waiter>& w : due) {
    absl::MutexLock lock(&w->mu);
    w->due = true;
  }
}

void FakeClock::Advance(std::chrono::nanoseconds d) {
  std::vector<std::shared_ptr<Waiter>> due;
  {
    absl::MutexLock lock(&mu_);
    due = MoveLocked(NowNanos() + d.count());
  }
  Wake(due);
}

void FakeClock::Set(int64_t ns) {
  std::vector<std::shared_ptr<Waiter>> due;
  {
    absl::MutexLock lock(&mu_);
    due = MoveLocked(ns);
  }
  Wake(due);
}

std::optional<int64_t> FakeClock::NextWakeNanos() const {
  absl::MutexLock lock(&mu_);
  if (waiters_.empty()) return std::nullopt;
  return waiters_.begin()->first;
}

bool FakeClock::AdvanceToNextWake() {
  std::vector<std::shared_ptr<Waiter>> due;
  {
    absl::MutexLock lock(&mu_);
    if (waiters_.empty()) return false;
    due = MoveLocked(std::max(NowNanos(), waiters_.begin()->first));
  }
  Wake(due);
  return true;
}

void FakeClock::SleepUntil(int64_t deadline_ns) const {
  absl::Mutex mu;
  bool never = false;
  absl::MutexLock lock(&mu);
  AwaitUntil(mu, absl::Condition(&never), deadline_ns);
}

bool FakeClock::AwaitUntil(absl::Mutex& mu, const absl::Condition& cond,
                           int64_t deadline_ns) const {
  if (cond.Eval()) return true;
  auto w = std::make_shared<Waiter>(mu);
  {
    absl::MutexLock lock(&mu_);
    if (NowNanos() >= deadline_ns) return false;
    waiters_.emplace(deadline_ns, w);
  }
  const auto ready = [&] { return w->due || cond.Eval(); };
  mu.Await(absl::Condition(&ready));
  bool taken = true;  // by a waker, which sets `due` (now, or soon)
  {
    absl::MutexLock lock(&mu_);
    auto [first, last] = waiters_.equal_range(deadline_ns);
    for (auto it = first; it != last; ++it) {
      if (it->second == w) {
        waiters_.erase(it);  // `cond` held first: no waker will touch `mu`
        taken = false;
        break;
      }
    }
  }
  if (taken) mu.Await(absl::Condition(&w->due));
  return cond.Eval();
}

}  // namespace omni
