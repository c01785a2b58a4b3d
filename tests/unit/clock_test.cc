// Clock: waiting on the real and the fake time line, and the tests'
// AutoAdvance that moves a FakeClock while every thread waits.
#include "omni/clock.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "auto_advance.h"

namespace omni {
namespace {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;

// Waits (bounded, without sleeping) until `clock` has a waiter with the
// deadline `ns`.
bool AwaitWaiter(const FakeClock& clock, int64_t ns) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (clock.NextWakeNanos() != std::optional<int64_t>(ns)) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(FakeClock, ASleeperWakesOnlyOnceTheTimeReachesItsDeadline) {
  FakeClock clock(1000);
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepUntil(1100);
    woke = true;
  });
  ASSERT_TRUE(AwaitWaiter(clock, 1100));
  clock.Advance(nanoseconds(99));
  EXPECT_EQ(clock.NextWakeNanos(), std::optional<int64_t>(1100));  // still asleep
  EXPECT_FALSE(woke.load());
  clock.Advance(nanoseconds(1));
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_EQ(clock.NextWakeNanos(), std::nullopt);
}

TEST(FakeClock, SetWakesEverySleeperItPassesAndMayGoBack) {
  FakeClock clock(0);
  std::thread b([&] { clock.SleepUntil(20); });
  ASSERT_TRUE(AwaitWaiter(clock, 20));
  std::thread a([&] { clock.SleepFor(nanoseconds(10)); });
  ASSERT_TRUE(AwaitWaiter(clock, 10));  // both wait
  clock.Set(25);
  a.join();
  b.join();
  clock.Set(5);
  EXPECT_EQ(clock.NowNanos(), 5);
}

TEST(FakeClock, AdvanceToNextWakeMovesToTheEarliestDeadlineOnly) {
  FakeClock clock(0);
  EXPECT_FALSE(clock.AdvanceToNextWake());  // nobody waits: nothing moves
  EXPECT_EQ(clock.NowNanos(), 0);
  std::atomic<int> woke{0};
  std::thread late([&] {
    clock.SleepUntil(300);
    woke += 10;
  });
  ASSERT_TRUE(AwaitWaiter(clock, 300));
  std::thread early([&] {
    clock.SleepUntil(100);
    woke += 1;
  });
  ASSERT_TRUE(AwaitWaiter(clock, 100));
  ASSERT_TRUE(clock.AdvanceToNextWake());
  EXPECT_EQ(clock.NowNanos(), 100);
  early.join();
  EXPECT_EQ(woke.load(), 1);
  ASSERT_TRUE(clock.AdvanceToNextWake());
  EXPECT_EQ(clock.NowNanos(), 300);
  late.join();
  EXPECT_EQ(woke.load(), 11);
}

// A thread that waits on `clock`, until `deadline_ns`, for `ready`; `got`
// is what AwaitUntil answered, once `thread` is joined.
struct ConditionWaiter {
  ConditionWaiter(const FakeClock& clock, int64_t deadline_ns)
      : thread([this, &clock, deadline_ns] {
          absl::MutexLock lock(&mu);
          got = clock.AwaitUntil(mu, absl::Condition(&ready), deadline_ns);
        }) {}
  absl::Mutex mu;
  bool ready = false;  // guarded by mu
  std::optional<bool> got;
  std::thread thread;  // last: starts once the rest is initialised
};

TEST(FakeClock, AwaitUntilReturnsOnceItsConditionHoldsWithoutTimeMoving) {
  FakeClock clock(0);
  ConditionWaiter w(clock, 1'000'000);
  ASSERT_TRUE(AwaitWaiter(clock, 1'000'000));
  {
    absl::MutexLock lock(&w.mu);
    w.ready = true;
  }
  w.thread.join();
  EXPECT_EQ(w.got, std::optional<bool>(true));
  EXPECT_EQ(clock.NowNanos(), 0);
  EXPECT_EQ(clock.NextWakeNanos(), std::nullopt);  // it took itself out
}

TEST(FakeClock, AwaitUntilReturnsFalseAtItsDeadlineAndAtOnceWhenItHasPassed) {
  FakeClock clock(0);
  ConditionWaiter w(clock, 50);
  ASSERT_TRUE(AwaitWaiter(clock, 50));
  clock.Advance(nanoseconds(50));
  w.thread.join();
  EXPECT_EQ(w.got, std::optional<bool>(false));
  absl::MutexLock lock(&w.mu);
  EXPECT_FALSE(clock.AwaitUntil(w.mu, absl::Condition(&w.ready), 50));
  w.ready = true;
  EXPECT_TRUE(clock.AwaitUntil(w.mu, absl::Condition(&w.ready), 50));
  clock.SleepUntil(10);  // passed: returns at once
}

TEST(RealClock, WaitsTakeTheirTimeAndAConditionThatHoldsReturnsAtOnce) {
  const Clock* clock = Clock::Real();
  const int64_t t0 = clock->NowNanos();
  clock->SleepFor(milliseconds(2));
  EXPECT_GE(clock->NowNanos() - t0, 2'000'000);
  absl::Mutex mu;
  bool ready = false;
  absl::MutexLock lock(&mu);
  const int64_t t1 = clock->NowNanos();
  EXPECT_FALSE(clock->AwaitUntil(mu, absl::Condition(&ready), t1 + 2'000'000));
  EXPECT_GE(clock->NowNanos() - t1, 2'000'000);
  ready = true;
  EXPECT_TRUE(clock->AwaitUntil(mu, absl::Condition(&ready), t1 + 3'600'000'000'000));
}

// The fake time of a test stands still while any thread computes, and moves
// once all of them wait.
TEST(AutoAdvance, MovesTheClockOnlyWhileEveryOtherThreadIsBlocked) {
  FakeClock clock(0);
  test_util::AutoAdvance advance(clock);
  std::atomic<bool> computing{true};
  std::atomic<int64_t> seen_while_computing{-1};
  std::thread worker([&] {
    const auto until = std::chrono::steady_clock::now() + milliseconds(50);
    int64_t last = clock.NowNanos();
    while (std::chrono::steady_clock::now() < until) last = clock.NowNanos();  // computes
    seen_while_computing = last;
    computing = false;
  });
  clock.SleepFor(milliseconds(10));  // due long before the worker is done
  EXPECT_FALSE(computing.load());
  EXPECT_EQ(seen_while_computing.load(), 0);
  EXPECT_EQ(clock.NowNanos(), 10'000'000);
  worker.join();
  // Waiting threads alone: the time runs to each deadline in turn.
  std::thread a([&] { clock.SleepFor(milliseconds(300)); });
  clock.SleepFor(milliseconds(200));
  a.join();
  EXPECT_EQ(clock.NowNanos(), 310'000'000);
}

}  // namespace
}  // namespace omni
