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

}  // namespace
}  // namespace omni::colocate
