#include "omni/colocate_guest.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>

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
    clock_.Advance(std::chrono::nanoseconds(absl::ToInt64Nanoseconds(timeout)));
    if (on_wait_) on_wait_();
    return true;
  }
  void Open(uint64_t id, int64_t remaining_ns) {
    w_ = {true, id, clock_.NowNanos(), remaining_ns, clock_.NowNanos(), 0.95};
  }
  OpenWindow w_;
  std::function<void()> on_wait_;
  int waits_ = 0;

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
