// StoreWindowSource over a real FileStore: a guest on another host reads the
// host's store keys (MakeStoreSink). The host's and the guest's clocks are
// two FakeClocks far apart, as two machines' monotonic clocks are.
#include "omni/colocate_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include "omni/sinks.h"
#include "omni/store.h"
#include "omni/telemetry.h"

namespace omni::colocate {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1'000'000'000;
constexpr int64_t kHostEpoch = 5000 * kS;  // the host's clock reads ~5000 s, the guest's ~0

class StoreSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "omni_store_src_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    auto s = OpenStore("file://" + dir_);
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
    auto g = GuestGate::Create({}, &guest_clock_);
    ASSERT_TRUE(g.ok());
    gate_ = *std::move(g);
    guest_clock_.Advance(milliseconds(100));
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<StoreWindowSource> Source(uint32_t kinds = ~uint32_t{0}) {
    StoreSourceOptions o;
    o.prefix = "job/r0";
    o.watcher = false;
    o.clock = &guest_clock_;
    o.kinds = kinds;
    auto src = StoreWindowSource::Open(*store_, gate_.get(), o);
    EXPECT_TRUE(src.ok()) << src.status();
    return *std::move(src);
  }

  // What the host's store sink writes for a notice read at host time `at`.
  void Publish(uint64_t seq, WindowState state, IdleKind kind, int64_t opened, int64_t closed,
               int64_t at, int64_t remaining) {
    WindowNotice n;
    n.sequence = seq;
    n.state = state;
    n.kind = kind;
    n.phase_name = kind == IdleKind::kEval ? "eval" : "data_wait";
    n.step = 7;
    n.opened_ns = opened;
    n.closed_ns = closed;
    n.read_at_ns = at;
    n.elapsed_ns = (closed > 0 ? closed : at) - opened;
    n.confidence = 0.95;
    n.remaining_ns = remaining;
    n.phase_samples = 30;
    ASSERT_TRUE(store_->Set("job/r0/window", WindowNoticeToJson(n)).ok());
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  FakeClock guest_clock_;
  std::unique_ptr<GuestGate> gate_;
};

TEST_F(StoreSourceTest, OpenRefusesANonPositivePollANullClockAndAPrefixThatMakesNoKey) {
  StoreSourceOptions o;
  o.poll = absl::ZeroDuration();
  EXPECT_EQ(StoreWindowSource::Open(*store_, nullptr, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = {};
  o.clock = nullptr;
  EXPECT_EQ(StoreWindowSource::Open(*store_, nullptr, o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = {};
  o.prefix = "no spaces";
  auto src = StoreWindowSource::Open(*store_, nullptr, o);
  ASSERT_EQ(src.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(src.status().message().find("no spaces"), std::string::npos) << src.status();
}

TEST_F(StoreSourceTest, AWindowAlreadyOpenInTheStoreAtTheFirstReadIsNotUsed) {
  Publish(3, WindowState::kOpen, IdleKind::kDataStall, kHostEpoch, 0, kHostEpoch + kMs, 500 * kMs);
  auto src = Source();
  src->ReadNow();
  EXPECT_FALSE(src->Current().open) << "its age is unknown: it may have closed long ago";
  EXPECT_EQ(src->Stats().stale, 1);
  // The next window is used.
  guest_clock_.Advance(milliseconds(5));
  src->ReadNow();
  Publish(5, WindowState::kOpen, IdleKind::kDataStall, kHostEpoch + kS, 0, kHostEpoch + kS,
          40 * kMs);
  guest_clock_.Advance(milliseconds(5));
  src->ReadNow();
  EXPECT_TRUE(src->Current().open);
  EXPECT_EQ(src->Stats().opens, 1);
}

TEST_F(StoreSourceTest, ANewNoticeIsDatedWhenThePreviousReadBeganAndItsRemainderCountsFromThere) {
  auto src = Source();
  src->ReadNow();  // nothing yet, at guest 100 ms
  const int64_t read0 = guest_clock_.NowNanos();
  guest_clock_.Advance(milliseconds(5));
  // Opened 2 ms before the host's worker published it with 40 ms to go.
  Publish(9, WindowState::kOpen, IdleKind::kDataStall, kHostEpoch, 0, kHostEpoch + 2 * kMs,
          40 * kMs);
  guest_clock_.Advance(milliseconds(3));
  EXPECT_TRUE(src->WaitForChange(absl::ZeroDuration()));
  const OpenWindow w = src->Current();
  ASSERT_TRUE(w.open);
  EXPECT_EQ(w.window_id, 9u);
  EXPECT_EQ(w.as_of_ns, read0) << "the earliest it can have been published";
  EXPECT_EQ(w.remaining_ns, 40 * kMs);
  EXPECT_EQ(w.opened_at_ns, read0 - 2 * kMs);
  EXPECT_DOUBLE_EQ(w.confidence, 0.95);
  // The gate counts the remainder from as_of: 8 ms of it are gone now.
  const GateDecision d = gate_->BeforeUnit(w, 31 * kMs + kMs / 2);
  EXPECT_EQ(d.verdict, GateVerdict::kWaitTooShort)
      << "32 ms left: 31.5 ms + a 1 ms guard do not fit";
  EXPECT_TRUE(gate_->BeforeUnit(w, 30 * kMs).start());
  // Republished unchanged: nothing changes.
  src->ReadNow();
  EXPECT_FALSE(src->WaitForChange(absl::ZeroDuration()));
}

TEST_F(StoreSourceTest, AHostsCloseReachesTheGateDatedAtTheEarliestAndEndsTheWindow) {
  auto src = Source();
  src->ReadNow();
  guest_clock_.Advance(milliseconds(5));
  Publish(9, WindowState::kOpen, IdleKind::kDataStall, kHostEpoch, 0, kHostEpoch + kMs, 40 * kMs);
  src->ReadNow();
  ASSERT_TRUE(src->Current().open);
  const int64_t read1 = guest_clock_.NowNanos();
  guest_clock_.Advance(milliseconds(5));
  // Closed 20 ms after it opened, published 1 ms later.
  Publish(10, WindowState::kClosed, IdleKind::kDataStall, kHostEpoch, kHostEpoch + 20 * kMs,
          kHostEpoch + 21 * kMs, -1);
  src->ReadNow();
  EXPECT_FALSE(src->Current().open);
  int64_t closed = 0;
  ASSERT_TRUE(gate_->ClosedAt(9, &closed));
  EXPECT_EQ(closed, read1 - kMs) << "1 ms before the earliest publication";
  EXPECT_EQ(src->Stats().closes, 1);
}

TEST_F(StoreSourceTest, AWindowOfAKindLeftOutIsNoWindowAndEndsTheOneHeld) {
  auto src = Source(KindBit(IdleKind::kDataStall));
  src->ReadNow();
  guest_clock_.Advance(milliseconds(5));
  Publish(2, WindowState::kOpen, IdleKind::kDataStall, kHostEpoch, 0, kHostEpoch, 40 * kMs);
  src->ReadNow();
  ASSERT_TRUE(src->Current().open);
  guest_clock_.Advance(milliseconds(5));
  // The close was never read: the next notice is an eval window.
  Publish(4, WindowState::kOpen, IdleKind::kEval, kHostEpoch + 50 * kMs, 0, kHostEpoch + 51 * kMs,
          300 * kMs);
  src->ReadNow();
  EXPECT_FALSE(src->Current().open);
  EXPECT_EQ(src->Stats().skipped, 1);
  int64_t closed = 0;
  EXPECT_TRUE(gate_->ClosedAt(2, &closed));
}

TEST_F(StoreSourceTest, MalformedValuesAndStoreErrorsAreCountedAndReadingGoesOn) {
  auto src = Source();
  src->ReadNow();
  guest_clock_.Advance(milliseconds(5));
  ASSERT_TRUE(store_->Set("job/r0/window", "{\"schema\": 5}").ok());
  src->ReadNow();
  ASSERT_TRUE(store_->Set("job/r0/outlook", "not json").ok());
  guest_clock_.Advance(milliseconds(300));  // the outlook is read every 200 ms
  src->ReadNow();
  StoreSourceStats s = src->Stats();
  EXPECT_EQ(s.errors, 2);
  EXPECT_NE(s.last_error.message().find("job/r0/outlook"), std::string::npos) << s.last_error;
  EXPECT_FALSE(src->Current().open);
  guest_clock_.Advance(milliseconds(5));
  Publish(9, WindowState::kOpen, IdleKind::kDataStall, kHostEpoch, 0, kHostEpoch, 40 * kMs);
  src->ReadNow();
  EXPECT_TRUE(src->Current().open) << "a good notice after bad ones is used";
}

TEST_F(StoreSourceTest, TheOutlookIsMovedToTheGuestsClockAndGivesNoWindowBefore) {
  auto src = Source(KindBit(IdleKind::kEval));
  EXPECT_EQ(src->NoWindowBeforeNs(), 0);
  EXPECT_EQ(src->Outlook().status().code(), absl::StatusCode::kNotFound);
  WindowOutlook o;
  o.sequence = 4;
  o.state = OutlookState::kForecast;
  o.published_ns = kHostEpoch + 10 * kMs;
  o.made_at_ns = kHostEpoch + 9 * kMs;
  o.horizon_ns = 300 * kS;
  o.covered_until_ns = o.made_at_ns + o.horizon_ns;
  o.confidence = 0.95;
  o.last_step = 40;
  NextIdleWindow& eval = o.next[static_cast<size_t>(IdleKind::kEval)];
  eval.outlook = KindOutlook::kNext;
  eval.windows = 1;
  eval.earliest_start_ns = kHostEpoch + 30 * kS;
  eval.latest_start_ns = kHostEpoch + 31 * kS;
  eval.guaranteed_ns = 2 * kS;
  eval.step = 50;
  ASSERT_TRUE(store_->Set("job/r0/outlook", WindowOutlookToJson(o)).ok());
  src->ReadNow();
  EXPECT_EQ(src->NoWindowBeforeNs(), 0) << "there before the first read, no notice to date it";
  // A newer outlook: dated at the previous read of the outlook key.
  const int64_t read0 = guest_clock_.NowNanos();
  guest_clock_.Advance(milliseconds(300));  // past outlook_poll
  o.sequence = 5;
  o.busy_until_ns = kHostEpoch + 60 * kS;
  o.busy_announced_ns = kHostEpoch + 10 * kMs;
  ASSERT_TRUE(store_->Set("job/r0/outlook", WindowOutlookToJson(o)).ok());
  src->ReadNow();
  auto got = src->Outlook();
  ASSERT_TRUE(got.ok()) << got.status();
  const int64_t shift = read0 - o.published_ns;
  EXPECT_EQ(got->published_ns, read0);
  EXPECT_EQ(got->next[static_cast<size_t>(IdleKind::kEval)].earliest_start_ns,
            eval.earliest_start_ns + shift);
  EXPECT_EQ(src->NoWindowBeforeNs(), o.busy_until_ns + shift) << "the busy period, on our clock";
}

TEST_F(StoreSourceTest, AWriterThatClosedClosesTheWindowHeld) {
  auto src = Source();
  src->ReadNow();
  guest_clock_.Advance(milliseconds(5));
  Publish(9, WindowState::kOpen, IdleKind::kDataStall, kHostEpoch, 0, kHostEpoch, 40 * kMs);
  src->ReadNow();
  ASSERT_TRUE(src->Current().open);
  guest_clock_.Advance(milliseconds(5));
  WindowNotice n;
  n.sequence = 9;
  n.state = WindowState::kOpen;
  n.kind = IdleKind::kDataStall;
  n.opened_ns = kHostEpoch;
  n.read_at_ns = kHostEpoch + 3 * kMs;
  n.writer_closed = true;
  ASSERT_TRUE(store_->Set("job/r0/window", WindowNoticeToJson(n)).ok());
  src->ReadNow();
  EXPECT_FALSE(src->Current().open);
  EXPECT_TRUE(src->Stats().writer_closed);
  int64_t closed = 0;
  EXPECT_TRUE(gate_->ClosedAt(9, &closed));
}

// The host end to end: its Telemetry (on its own clock) publishes through a
// store sink; the guest's source reads the keys.
TEST_F(StoreSourceTest, AHostsTelemetryThroughItsStoreSinkOpensAndClosesTheGuestsWindow) {
  FakeClock host_clock;
  host_clock.Advance(std::chrono::nanoseconds(kHostEpoch));
  TelemetryOptions to;
  to.stats.warmup.max_steps = 0;
  to.stats.warmup.min_steps = 0;
  to.publish_interval_ns = 0;
  to.forecast.horizon_ns = 1'000'000'000;
  to.window_min_samples = 5;
  auto tel = Telemetry::Create(to, &host_clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  auto sink = MakeStoreSink(*store_, "job/r0");
  ASSERT_TRUE(sink.ok());
  (*tel)->AddSink(*std::move(sink));
  for (int i = 0; i < 10; ++i) {
    StepScope step(**tel);
    {
      PhaseScope p(**tel, phase::kDataWait);
      host_clock.Advance(milliseconds(20));
    }
    PhaseScope c(**tel, phase::kCompute);
    host_clock.Advance(milliseconds(50));
  }
  ASSERT_TRUE((*tel)->Flush().ok());
  auto src = Source();
  src->ReadNow();
  guest_clock_.Advance(milliseconds(5));
  ASSERT_TRUE((*tel)->BeginStep(10).ok());
  ASSERT_TRUE((*tel)->BeginPhase(phase::kDataWait).ok());
  ASSERT_TRUE((*tel)->Flush().ok());
  src->ReadNow();
  OpenWindow w = src->Current();
  ASSERT_TRUE(w.open);
  EXPECT_GT(w.remaining_ns, 0) << "ten 20 ms stalls measured";
  EXPECT_LE(w.remaining_ns, 20 * kMs);
  // The host announces a busy minute: the outlook key says so.
  ASSERT_TRUE((*tel)->AnnounceBusy(host_clock.NowNanos() + 60 * kS).ok());
  host_clock.Advance(milliseconds(20));
  ASSERT_TRUE((*tel)->EndPhase(phase::kDataWait).ok());
  ASSERT_TRUE((*tel)->Flush().ok());
  guest_clock_.Advance(milliseconds(300));
  src->ReadNow();
  EXPECT_FALSE(src->Current().open);
  int64_t closed = 0;
  EXPECT_TRUE(gate_->ClosedAt(w.window_id, &closed));
  EXPECT_GT(src->NoWindowBeforeNs(), guest_clock_.NowNanos() + 50 * kS);
  ASSERT_TRUE((*tel)->EndStep().ok());
  ASSERT_TRUE((*tel)->Close().ok());
  guest_clock_.Advance(milliseconds(300));
  src->ReadNow();
  auto o = src->Outlook();
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->writer_closed) << "the worker's last copy";
}

}  // namespace
}  // namespace omni::colocate
