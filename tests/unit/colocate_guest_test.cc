#include "omni/colocate_guest.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <vector>

namespace omni::colocate {
namespace {

constexpr int64_t kMs = 1'000'000;

// A source on a fake clock: a wait advances the clock by its timeout and
// then runs `on_wait`, which may open or close windows or ask to stop.
class FakeSource final : public WindowSource {
 public:
  explicit FakeSource(FakeClock& clock) : clock_(clock) {}
  OpenWindow Current() override { return w_; }
  bool WaitForChange(absl::Duration timeout) override {
    ++waits_;
    waited_ns_.push_back(absl::ToInt64Nanoseconds(timeout));
    clock_.Advance(std::chrono::nanoseconds(waited_ns_.back()));
    if (on_wait_) on_wait_();
    return true;
  }
  int64_t NoWindowBeforeNs() override { return no_window_before_ns_; }
  void Open(uint64_t id, int64_t remaining_ns) {
    w_ = {true, id, clock_.NowNanos(), remaining_ns, clock_.NowNanos(), 0.95};
  }
  OpenWindow w_;
  std::function<void()> on_wait_;
  int waits_ = 0;
  std::vector<int64_t> waited_ns_;   // each wait's timeout
  int64_t no_window_before_ns_ = 0;  // the host's statement (0: none)

 private:
  FakeClock& clock_;
};

class GuestLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = GuestGate::Create({}, &clock_);  // guard 1 ms
    ASSERT_TRUE(g.ok());
    gate_ = *std::move(g);
  }
  std::function<absl::Status()> Unit(int64_t ns) {
    return [this, ns] {
      clock_.Advance(std::chrono::nanoseconds(ns));
      return absl::OkStatus();
    };
  }
  FakeClock clock_;
  std::unique_ptr<GuestGate> gate_;
  std::atomic<bool> stop_{false};
};

TEST_F(GuestLoopTest, RunsUnitsWhileTheWindowCoversThemThenWaits) {
  FakeSource src(clock_);
  src.Open(1, 20 * kMs);
  src.on_wait_ = [&] { stop_ = true; };
  GuestLoopOptions o;
  o.initial_unit_ns = 5 * kMs;
  GuestLoopResult r = RunGuestLoop(*gate_, src, Unit(5 * kMs), stop_, o, &clock_);
  // 20 ms stated: units at 0, 5 and 10 ms; at 15 ms, 5 ms < 5 + 1 remain.
  EXPECT_EQ(r.units, 3);
  EXPECT_EQ(r.why, GuestStop::kStopRequested);
  EXPECT_EQ(src.waits_, 1);
  EXPECT_EQ(r.stats.units_started, 3);
}

TEST_F(GuestLoopTest, AFirstUnitBoundLongerThanTheWindowWaitsForALongerWindow) {
  FakeSource src(clock_);
  src.Open(1, 20 * kMs);
  src.on_wait_ = [&] {
    if (src.waits_ == 1) {
      src.Open(2, 200 * kMs);  // the next window is long enough
    } else {
      stop_ = true;
    }
  };
  GuestLoopOptions o;
  o.initial_unit_ns = 50 * kMs;
  o.max_units = 2;
  GuestLoopResult r = RunGuestLoop(*gate_, src, Unit(50 * kMs), stop_, o, &clock_);
  EXPECT_EQ(r.why, GuestStop::kMaxUnits);
  EXPECT_EQ(r.units, 2);
  EXPECT_EQ(src.waits_, 1);
}

TEST_F(GuestLoopTest, AFailingUnitStopsTheLoopWithItsError) {
  FakeSource src(clock_);
  src.Open(1, 1000 * kMs);
  int calls = 0;
  auto unit = [&]() -> absl::Status {
    clock_.Advance(std::chrono::milliseconds(1));
    return ++calls == 2 ? absl::DataLossError("batch 7 unreadable") : absl::OkStatus();
  };
  GuestLoopResult r = RunGuestLoop(*gate_, src, unit, stop_, {}, &clock_);
  EXPECT_EQ(r.why, GuestStop::kUnitFailed);
  EXPECT_EQ(r.units, 1);
  EXPECT_EQ(r.unit_status.code(), absl::StatusCode::kDataLoss);
}

TEST_F(GuestLoopTest, AnEarlyCloseDuringAUnitIsAYieldAtItsEnd) {
  ManualWindowSource src(gate_.get());
  OpenWindow w;
  w.window_id = 4;
  w.opened_at_ns = clock_.NowNanos();
  w.remaining_ns = 1000 * kMs;
  w.as_of_ns = clock_.NowNanos();
  w.confidence = 0.95;
  src.Open(w);
  auto unit = [&] {
    clock_.Advance(std::chrono::milliseconds(2));
    src.Close(4, clock_.NowNanos());  // the host leaves its idle phase mid-unit
    clock_.Advance(std::chrono::milliseconds(3));
    stop_ = true;
    return absl::OkStatus();
  };
  GuestLoopResult r = RunGuestLoop(*gate_, src, unit, stop_, {}, &clock_);
  EXPECT_EQ(r.units, 1);
  EXPECT_EQ(r.stats.yields, 1);
  EXPECT_EQ(r.stats.yield_max_ns, 3 * kMs);
  EXPECT_EQ(r.stats.deadline_misses, 1);
}

// ---- how long to wait for a window (GuestLoopOptions::max_wait)

constexpr int64_t kS = 1'000'000'000;

TEST(StopWaiting, StopsWhenTheHostStatesNoWindowWithinMaxWait) {
  const int64_t now = 100 * kS;
  EXPECT_EQ(StopWaiting(now, now, now + 10 * kS, absl::Seconds(2)), GuestStop::kHostBusy);
  EXPECT_EQ(StopWaiting(now, now, now + 2 * kS + 1, absl::Seconds(2)), GuestStop::kHostBusy)
      << "a window 1 ns beyond max_wait is beyond it";
}

TEST(StopWaiting, WaitsForAWindowTheHostExpectsWithinMaxWait) {
  const int64_t now = 100 * kS;
  EXPECT_EQ(StopWaiting(now, now, now + 2 * kS, absl::Seconds(2)), std::nullopt);
  EXPECT_EQ(StopWaiting(now, now, now - kS, absl::Seconds(2)), std::nullopt)
      << "a window due already (late): wait";
}

TEST(StopWaiting, WithoutAStatementWaitsUntilMaxWaitHasPassed) {
  const int64_t since = 100 * kS;
  EXPECT_EQ(StopWaiting(since + 2 * kS - 1, since, 0, absl::Seconds(2)), std::nullopt);
  EXPECT_EQ(StopWaiting(since + 2 * kS, since, 0, absl::Seconds(2)), GuestStop::kWaitedTooLong);
  EXPECT_EQ(StopWaiting(since + 2 * kS, since, since + 3 * kS, absl::Seconds(2)),
            GuestStop::kWaitedTooLong)
      << "a window expected soon, but the wait has lasted max_wait";
}

TEST(StopWaiting, AnInfiniteMaxWaitNeverStopsAndAZeroOneStopsAtOnce) {
  const int64_t now = 100 * kS;
  EXPECT_EQ(StopWaiting(now + 1000 * kS, now, now + 10'000 * kS, absl::InfiniteDuration()),
            std::nullopt);
  EXPECT_EQ(StopWaiting(now, now, 0, absl::ZeroDuration()), GuestStop::kWaitedTooLong);
}

TEST_F(GuestLoopTest, StopsWaitingAtTheFirstWaitWhenTheHostIsBusyBeyondMaxWait) {
  FakeSource src(clock_);
  src.Open(1, 12 * kMs);
  // The window holds one 5 ms unit (+ 1 ms guard); then the host is busy
  // for 10 s by its statement.
  src.no_window_before_ns_ = clock_.NowNanos() + 10 * kS;
  GuestLoopOptions o;
  o.initial_unit_ns = 5 * kMs;
  o.max_wait = absl::Seconds(2);
  auto unit = [&] {
    clock_.Advance(std::chrono::milliseconds(5));
    src.w_.open = false;  // the host's close
    return absl::OkStatus();
  };
  const int64_t t0 = clock_.NowNanos();
  GuestLoopResult r = RunGuestLoop(*gate_, src, unit, stop_, o, &clock_);
  EXPECT_EQ(r.why, GuestStop::kHostBusy);
  EXPECT_EQ(r.units, 1);
  EXPECT_EQ(r.no_window_before_ns, t0 + 10 * kS);
  EXPECT_EQ(r.waited_ns, 0) << "decided at its first wait, without waiting";
  EXPECT_EQ(src.waits_, 0);
}

TEST_F(GuestLoopTest, AnOpenWindowTooShortForAUnitIsNotABusyHost) {
  FakeSource src(clock_);
  src.Open(1, 3 * kMs);  // idle now, but 3 ms < 5 + 1
  src.no_window_before_ns_ = clock_.NowNanos() + 10 * kS;
  GuestLoopOptions o;
  o.initial_unit_ns = 5 * kMs;
  o.max_wait = absl::Milliseconds(100);
  o.wait_poll = absl::Milliseconds(30);
  GuestLoopResult r = RunGuestLoop(*gate_, src, Unit(5 * kMs), stop_, o, &clock_);
  EXPECT_EQ(r.why, GuestStop::kWaitedTooLong);
  EXPECT_EQ(r.units, 0);
  EXPECT_EQ(r.waited_ns, 100 * kMs);
  // What shut it out: one window, too short at each of its 5 looks, whose
  // longest claim (3 ms at the first) lies below the bound.
  EXPECT_EQ(r.stats.too_short_windows, 1);
  EXPECT_EQ(r.stats.too_short_waits, 5);
  EXPECT_EQ(r.stats.too_short_longest_ns, 3 * kMs);
  EXPECT_EQ(r.unit_bound_ns, 5 * kMs);
  // Woken at each poll and when the wait reaches max_wait, not after it.
  EXPECT_EQ(src.waited_ns_, (std::vector<int64_t>{30 * kMs, 30 * kMs, 30 * kMs, 10 * kMs}));
}

TEST_F(GuestLoopTest,
       AHostExpectingAWindowWithinMaxWaitIsWaitedForAndTheWaitStartsAgainAfterAUnit) {
  FakeSource src(clock_);
  GuestLoopOptions o;
  o.initial_unit_ns = 5 * kMs;
  o.max_wait = absl::Milliseconds(200);
  o.wait_poll = absl::Milliseconds(50);
  o.max_units = 2;
  // No window now; the host expects one in 150 ms, and it opens then.
  src.no_window_before_ns_ = clock_.NowNanos() + 150 * kMs;
  src.on_wait_ = [&] {
    if (src.waits_ == 3) src.Open(1, 8 * kMs);  // one unit's worth
    if (src.waits_ == 7) src.Open(2, 8 * kMs);  // 200 ms after the first unit: just in time
  };
  auto unit = [&] {
    clock_.Advance(std::chrono::milliseconds(5));
    src.w_.open = false;
    src.no_window_before_ns_ = 0;  // the host's forecast says nothing more
    return absl::OkStatus();
  };
  GuestLoopResult r = RunGuestLoop(*gate_, src, unit, stop_, o, &clock_);
  // Without the restart after the unit, the 4 waits after it (200 ms) and
  // the 150 ms before it would have exceeded max_wait.
  EXPECT_EQ(r.why, GuestStop::kMaxUnits);
  EXPECT_EQ(r.units, 2);
  EXPECT_EQ(src.waits_, 7);
}

// The host opens a 10 ms window at every wait; the guest's n-th unit
// (from 1) takes unit_ms(n) and the window closes after it.
GuestLoopResult RunInTenMsWindows(FakeClock& clock, GuestGate& gate, const std::atomic<bool>& stop,
                                  GuestLoopOptions o, const std::function<int64_t(int)>& unit_ms) {
  FakeSource src(clock);
  uint64_t id = 0;
  src.on_wait_ = [&] { src.Open(++id, 10 * kMs); };
  src.Open(++id, 10 * kMs);
  o.initial_unit_ns = 2 * kMs;
  int n = 0;
  auto unit = [&] {
    clock.Advance(std::chrono::milliseconds(unit_ms(++n)));
    src.w_.open = false;
    return absl::OkStatus();
  };
  return RunGuestLoop(gate, src, unit, stop, o, &clock);
}

TEST_F(GuestLoopTest, OneSlowUnitDoesNotShutTheGuestOutOfWindowsForGood) {
  // Units of 2 ms, but the second (the first measured) took 20 ms: a bound
  // of 20 ms refused every window after it. Before: 2 units, then none
  // until max_wait.
  GuestLoopOptions o;
  o.max_wait = absl::Seconds(2);
  o.max_units = 20;
  GuestLoopResult r =
      RunInTenMsWindows(clock_, *gate_, stop_, o, [](int n) { return n == 2 ? 20 : 2; });
  EXPECT_EQ(r.why, GuestStop::kMaxUnits);
  EXPECT_EQ(r.units, 20);
  EXPECT_EQ(r.unit_probes, 1);
  EXPECT_EQ(r.unit_forgiven, 1);
  EXPECT_EQ(r.stats.too_short_windows, UnitCostBound::kProbeAfter);
  EXPECT_EQ(r.stats.overruns, 0);
  EXPECT_EQ(r.unit_bound_ns, 2 * kMs);
}

TEST_F(GuestLoopTest, AGuestWhoseUnitsBecameSlowProbesOnceThenKeepsItsBound) {
  // Units of 2 ms, then of 20 ms from the third on: one probe after 4
  // refused windows (it overran its window), then the sample shows two slow
  // units of three and the guest waits for longer windows.
  GuestLoopOptions o;
  o.max_wait = absl::Seconds(10);
  o.wait_poll = absl::Milliseconds(10);
  GuestLoopResult r =
      RunInTenMsWindows(clock_, *gate_, stop_, o, [](int n) { return n <= 2 ? 2 : 20; });
  EXPECT_EQ(r.why, GuestStop::kWaitedTooLong);
  EXPECT_EQ(r.units, 4);
  EXPECT_EQ(r.unit_probes, 1);
  EXPECT_EQ(r.unit_forgiven, 0);
  EXPECT_GE(r.unit_bound_ns, 20 * kMs);
}

TEST(ManualWindowSourceTest, WaitForChangeSeesAnOpenOrCloseSinceTheLastLook) {
  ManualWindowSource src;
  EXPECT_FALSE(src.Current().open);
  EXPECT_FALSE(src.WaitForChange(absl::ZeroDuration()));
  OpenWindow w;
  w.window_id = 1;
  src.Open(w);
  EXPECT_TRUE(src.WaitForChange(absl::ZeroDuration()));
  EXPECT_TRUE(src.Current().open);
  EXPECT_FALSE(src.WaitForChange(absl::ZeroDuration()));
  src.Close(1, 0);
  EXPECT_TRUE(src.WaitForChange(absl::ZeroDuration()));
  EXPECT_FALSE(src.Current().open);
  EXPECT_EQ(src.NoWindowBeforeNs(), 0) << "no statement until one is set";
  src.SetNoWindowBefore(42);
  EXPECT_EQ(src.NoWindowBeforeNs(), 42);
}

// The supervisor's view of a paused guest: ticks at a fake poll of 1 ms.
class PauseControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = GuestGate::Create({}, &clock_);  // guard 1 ms
    ASSERT_TRUE(g.ok());
    gate_ = *std::move(g);
  }
  OpenWindow Window(uint64_t id, int64_t remaining_ns) {
    return {true, id, clock_.NowNanos(), remaining_ns, clock_.NowNanos(), 0.95};
  }
  void Advance(int64_t ns) { clock_.Advance(std::chrono::nanoseconds(ns)); }
  FakeClock clock_;
  std::unique_ptr<GuestGate> gate_;
};

TEST_F(PauseControllerTest, ResumesOnlyWhenASliceAndTheGuardFitThenPausesBeforeTheClose) {
  PauseController c(gate_.get(), kMs);
  EXPECT_EQ(c.Tick(OpenWindow{}), PauseController::Action::kNone) << "no window: stays stopped";
  EXPECT_EQ(c.Tick(Window(1, kMs)), PauseController::Action::kNone) << "1 ms < slice + guard";
  const OpenWindow w = Window(2, 5 * kMs);
  ASSERT_EQ(c.Tick(w), PauseController::Action::kResume);
  c.Resumed();
  Advance(kMs);
  EXPECT_EQ(c.Tick(w), PauseController::Action::kNone) << "4 ms left: keeps running";
  Advance(2 * kMs);
  EXPECT_EQ(c.Tick(w), PauseController::Action::kNone) << "2 ms left: slice + guard still fit";
  Advance(kMs);
  ASSERT_EQ(c.Tick(w), PauseController::Action::kPause) << "1 ms left: the next slice does not fit";
  Advance(100'000);
  c.Paused(clock_.NowNanos());
  EXPECT_FALSE(c.running());
  const GateStats s = gate_->Stats();
  EXPECT_EQ(s.yields, 0) << "it left before the host closed";
  EXPECT_EQ(s.deadline_misses, 0);
}

TEST_F(PauseControllerTest, AnEarlyCloseIsAYieldMeasuredToTheStop) {
  PauseController c(gate_.get(), kMs);
  const OpenWindow w = Window(3, 50 * kMs);
  ASSERT_EQ(c.Tick(w), PauseController::Action::kResume);
  c.Resumed();
  Advance(2 * kMs);
  const int64_t closed = clock_.NowNanos();
  gate_->HostClosed(3, closed);
  Advance(500'000);  // the next poll
  OpenWindow gone = w;
  gone.open = false;
  ASSERT_EQ(c.Tick(gone), PauseController::Action::kPause);
  Advance(200'000);  // the stop latency
  c.Paused(clock_.NowNanos());
  const GateStats s = gate_->Stats();
  EXPECT_EQ(s.yields, 1);
  EXPECT_EQ(s.yield_max_ns, 700'000);
  EXPECT_EQ(s.deadline_misses, 1) << "it ran past the host's close";
  EXPECT_EQ(s.overruns, 1);
}

TEST_F(PauseControllerTest, UntilCloseRunsTheWholeWindowWhateverItsRemainder) {
  PauseController c(gate_.get(), kMs, /*until_close=*/true);
  ASSERT_EQ(c.Tick(Window(8, 0)), PauseController::Action::kResume) << "no claim needed";
  c.Resumed();
  Advance(40 * kMs);
  EXPECT_EQ(c.Tick(Window(8, 0)), PauseController::Action::kNone) << "runs on to the close";
  gate_->HostClosed(8, clock_.NowNanos());
  Advance(300'000);
  ASSERT_EQ(c.Tick(OpenWindow{}), PauseController::Action::kPause);
  c.Paused(clock_.NowNanos());
  EXPECT_EQ(gate_->Stats().yields, 1);
  EXPECT_EQ(gate_->Stats().yield_max_ns, 300'000);
  OpenWindow doubtful = Window(9, 0);
  doubtful.confidence = 0.5;
  EXPECT_EQ(c.Tick(doubtful), PauseController::Action::kNone) << "still below min_confidence";
}

TEST_F(PauseControllerTest, AStopWithinTheStatedBoundIsAnOverrunNotADeadlineMiss) {
  GateOptions o;
  o.miss_tolerance = absl::Milliseconds(1);  // one poll + the stop latency
  auto g = GuestGate::Create(o, &clock_);
  ASSERT_TRUE(g.ok());
  PauseController c(g->get(), kMs);
  ASSERT_EQ(c.Tick(Window(3, 50 * kMs)), PauseController::Action::kResume);
  c.Resumed();
  // Stopped 0.7 ms after the close of window 3, then 1.3 ms after that of window 5.
  (*g)->HostClosed(3, clock_.NowNanos());
  Advance(700'000);
  ASSERT_EQ(c.Tick(OpenWindow{}), PauseController::Action::kPause);
  c.Paused(clock_.NowNanos());
  ASSERT_EQ(c.Tick(Window(5, 50 * kMs)), PauseController::Action::kResume);
  c.Resumed();
  (*g)->HostClosed(5, clock_.NowNanos());
  Advance(1'300'000);
  ASSERT_EQ(c.Tick(OpenWindow{}), PauseController::Action::kPause);
  c.Paused(clock_.NowNanos());
  const GateStats s = (*g)->Stats();
  EXPECT_EQ(s.yields, 2);
  EXPECT_EQ(s.overruns, 2);
  EXPECT_EQ(s.deadline_misses, 1) << "only the stop beyond the 1 ms bound";
}

TEST_F(PauseControllerTest, AWindowReplacedBetweenTwoTicksPausesTheGuestFirst) {
  PauseController c(gate_.get(), kMs);
  ASSERT_EQ(c.Tick(Window(4, 50 * kMs)), PauseController::Action::kResume);
  c.Resumed();
  Advance(kMs);
  gate_->HostClosed(4, clock_.NowNanos());  // closed and reopened between two polls
  ASSERT_EQ(c.Tick(Window(6, 50 * kMs)), PauseController::Action::kPause)
      << "the host was busy in between: the guest must not simply run on";
  c.Paused(clock_.NowNanos());
  EXPECT_EQ(gate_->Stats().yields, 1);
  EXPECT_EQ(c.Tick(Window(6, 50 * kMs)), PauseController::Action::kResume);
}

}  // namespace
}  // namespace omni::colocate
