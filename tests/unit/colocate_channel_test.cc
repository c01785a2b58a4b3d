// ChannelWindowSource on a real shared-memory channel: the host's writer runs
// on another thread, as the telemetry hooks of another process would.
#include "omni/colocate_channel.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <thread>
#include <vector>

#include "unique_channel.h"

namespace omni::colocate {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr absl::Duration kBound = absl::Seconds(5);  // bounded waits, never reached when it works

std::string UniqueChannel() { return testing::UniqueChannel("coloc-test"); }

// A host whose data stalls have lasted 200 ms each.
std::unique_ptr<WindowChannelWriter> Host(const std::string& name) {
  auto w = WindowChannelWriter::Create(name, 0.95);
  EXPECT_TRUE(w.ok()) << w.status();
  std::array<DurationQuantiles, kMaxPhases> q{};
  q[phase::kDataWait] = QuantilesOf(std::vector<double>(64, 200.0 * kMs));
  (*w)->PublishPhases(PhaseCatalog(), q);
  return *std::move(w);
}

int64_t Now() { return Clock::Real()->NowNanos(); }

// Waits until `done` holds, at most kBound.
template <typename F>
bool WaitUntil(ChannelWindowSource& src, F done) {
  const absl::Time until = absl::Now() + kBound;
  while (!done(src.Current())) {
    if (absl::Now() > until) return false;
    src.WaitForChange(absl::Milliseconds(10));
  }
  return true;
}

TEST(ChannelWindowSource, OpenNamesAChannelNoHostCreated) {
  const std::string name = UniqueChannel();
  auto src = ChannelWindowSource::Open(name, nullptr);
  ASSERT_EQ(src.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(src.status().message().find(name), std::string::npos) << src.status();
}

TEST(ChannelWindowSource, RefusesANonPositivePoll) {
  auto host = Host(UniqueChannel());
  ChannelSourceOptions o;
  o.poll = absl::ZeroDuration();
  EXPECT_EQ(ChannelWindowSource::Open(host->name(), nullptr, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChannelWindowSource, AHostsOpenWindowIsOpenWithTheRemainderAtTheStatedConfidence) {
  auto host = Host(UniqueChannel());
  auto gate = GuestGate::Create({});
  ASSERT_TRUE(gate.ok());
  auto src = ChannelWindowSource::Open(host->name(), gate->get());
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_FALSE((*src)->Current().open) << "no idle phase entered yet";

  const int64_t opened = Now();
  std::thread writer([&] { host->OpenWindow(phase::kDataWait, IdleKind::kDataStall, 7, opened); });
  writer.join();
  ASSERT_TRUE(WaitUntil(**src, [](const OpenWindow& w) { return w.open; }));
  const OpenWindow w = (*src)->Current();
  EXPECT_EQ(w.opened_at_ns, opened);
  EXPECT_DOUBLE_EQ(w.confidence, 0.95);
  EXPECT_GT(w.remaining_ns, 0);
  EXPECT_LE(w.remaining_ns, 200 * kMs - (w.as_of_ns - opened)) << "never past the longest stall";
  // A 10 ms unit fits a window that promises close to 200 ms more.
  EXPECT_TRUE((*gate)->BeforeUnit(w, 10 * kMs).start());
  (*gate)->UnitDone(Now());
  // One far longer than any stall does not.
  EXPECT_EQ((*gate)->BeforeUnit((*src)->Current(), 500 * kMs).verdict, GateVerdict::kWaitTooShort);
  EXPECT_EQ((*src)->Stats().opens, 1);
}

TEST(ChannelWindowSource, TheHostsCloseReachesTheGateWhileAUnitRuns) {
  auto host = Host(UniqueChannel());
  auto gate = GuestGate::Create({});
  ASSERT_TRUE(gate.ok());
  auto src = ChannelWindowSource::Open(host->name(), gate->get());
  ASSERT_TRUE(src.ok()) << src.status();
  host->OpenWindow(phase::kDataWait, IdleKind::kDataStall, 1, Now());
  ASSERT_TRUE(WaitUntil(**src, [](const OpenWindow& w) { return w.open; }));
  ASSERT_TRUE((*gate)->BeforeUnit((*src)->Current(), kMs).start());

  // Busy again while the unit runs: the watcher, not the guest's next
  // boundary, tells the gate.
  int64_t closed = 0;
  std::thread writer([&] {
    closed = Now();
    host->CloseWindow(closed);
  });
  writer.join();
  const absl::Time until = absl::Now() + kBound;
  while ((*src)->Stats().closes == 0 && absl::Now() < until) {
    (*src)->WaitForChange(absl::Milliseconds(10));
  }
  ASSERT_EQ((*src)->Stats().closes, 1);
  (*gate)->UnitDone(Now());  // ended after the close
  EXPECT_EQ((*gate)->Stats().deadline_misses, 1);
  EXPECT_GT((*gate)->Stats().overrun_ns, 0);

  const GateDecision d = (*gate)->BeforeUnit((*src)->Current(), kMs);
  EXPECT_EQ(d.verdict, GateVerdict::kWaitNoWindow);
  const GateStats s = (*gate)->Stats();
  EXPECT_EQ(s.yields, 1);
  EXPECT_GT(s.yield_max_ns, 0);
  EXPECT_LE(s.yield_max_ns, Now() - closed) << "measured from the host's close";
}

TEST(ChannelWindowSource, WithoutAWatcherTheWaitingThreadReadsTheHostsOpenAndClose) {
  auto host = Host(UniqueChannel());
  auto gate = GuestGate::Create({});
  ASSERT_TRUE(gate.ok());
  ChannelSourceOptions o;
  o.watcher = false;
  auto src = ChannelWindowSource::Open(host->name(), gate->get(), o);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_FALSE((*src)->WaitForChange(absl::Milliseconds(1))) << "nothing happened";
  const int64_t opened = Now();
  std::thread writer([&] { host->OpenWindow(phase::kDataWait, IdleKind::kDataStall, 3, opened); });
  EXPECT_TRUE((*src)->WaitForChange(kBound));  // woken by the doorbell
  writer.join();
  const OpenWindow w = (*src)->Current();
  ASSERT_TRUE(w.open);
  EXPECT_EQ(w.opened_at_ns, opened);
  int64_t closed = 0;
  EXPECT_FALSE((*gate)->ClosedAt(w.window_id, &closed));
  const int64_t close_ns = Now();
  writer = std::thread([&] { host->CloseWindow(close_ns); });
  EXPECT_TRUE((*src)->WaitForChange(kBound));
  writer.join();
  EXPECT_FALSE((*src)->Current().open);
  ASSERT_TRUE((*gate)->ClosedAt(w.window_id, &closed)) << "the close reached the gate";
  EXPECT_EQ(closed, close_ns);
  const ChannelSourceStats st = (*src)->Stats();
  EXPECT_EQ(st.opens, 1);
  EXPECT_EQ(st.closes, 1);
}

TEST(ChannelWindowSource, EachNewWindowHasAHigherIdAndAnUnseenCloseIsInferred) {
  auto host = Host(UniqueChannel());
  auto gate = GuestGate::Create({});
  ASSERT_TRUE(gate.ok());
  ChannelSourceOptions o;
  o.poll = absl::Milliseconds(50);  // slow enough to miss a close between two opens
  auto src = ChannelWindowSource::Open(host->name(), gate->get(), o);
  ASSERT_TRUE(src.ok()) << src.status();
  host->OpenWindow(phase::kDataWait, IdleKind::kDataStall, 1, Now());
  ASSERT_TRUE(WaitUntil(**src, [](const OpenWindow& w) { return w.open; }));
  const uint64_t first = (*src)->Current().window_id;
  host->CloseWindow(Now());
  host->OpenWindow(phase::kDataWait, IdleKind::kDataStall, 2, Now());
  ASSERT_TRUE(WaitUntil(**src, [&](const OpenWindow& w) { return w.window_id != first; }));
  EXPECT_GT((*src)->Current().window_id, first);
  EXPECT_TRUE((*src)->Current().open);
  EXPECT_EQ((*src)->Stats().opens, 2);
  EXPECT_EQ((*src)->Stats().closes, 1) << "the first window's close, seen or not";
}

TEST(ChannelWindowSource, AHostThatShutsDownClosesItsOpenWindow) {
  auto host = Host(UniqueChannel());
  const std::string name = host->name();
  auto gate = GuestGate::Create({});
  ASSERT_TRUE(gate.ok());
  auto src = ChannelWindowSource::Open(name, gate->get());
  ASSERT_TRUE(src.ok()) << src.status();
  host->OpenWindow(phase::kDataWait, IdleKind::kDataStall, 1, Now());
  ASSERT_TRUE(WaitUntil(**src, [](const OpenWindow& w) { return w.open; }));
  host.reset();  // the host process exits
  ASSERT_TRUE(WaitUntil(**src, [](const OpenWindow& w) { return !w.open; }));
  EXPECT_TRUE((*src)->Stats().writer_closed);
  EXPECT_EQ((*gate)->BeforeUnit((*src)->Current(), kMs).verdict, GateVerdict::kWaitNoWindow);
}

TEST(ChannelWindowSource, AWindowOfAKindLeftOutIsNoWindowAndEndsTheOneHeld) {
  auto host = Host(UniqueChannel());
  auto gate = GuestGate::Create({});
  ASSERT_TRUE(gate.ok());
  ChannelSourceOptions o;
  o.kinds = KindBit(IdleKind::kDataStall);  // a CPU host: eval scoring is CPU work
  auto src = ChannelWindowSource::Open(host->name(), gate->get(), o);
  ASSERT_TRUE(src.ok()) << src.status();
  host->OpenWindow(phase::kDataWait, IdleKind::kDataStall, 1, Now());
  ASSERT_TRUE(WaitUntil(**src, [](const OpenWindow& w) { return w.open; }));
  host->OpenWindow(phase::kEval, IdleKind::kEval, 1, Now());  // the stall ended, eval began
  ASSERT_TRUE(WaitUntil(**src, [](const OpenWindow& w) { return !w.open; }));
  const absl::Time until = absl::Now() + kBound;
  while ((*src)->Stats().skipped == 0 && absl::Now() < until) {
    (*src)->WaitForChange(absl::Milliseconds(10));
  }
  EXPECT_EQ((*src)->Stats().skipped, 1);
  EXPECT_EQ((*src)->Stats().closes, 1) << "the stall's window ends when the eval opens";
  EXPECT_EQ((*gate)->BeforeUnit((*src)->Current(), kMs).verdict, GateVerdict::kWaitNoWindow);
}

TEST(ChannelWindowSource, TheNextWindowOfTheGuestsKindsIsTheHostsOutlookForThem) {
  auto host = Host(UniqueChannel());
  const int64_t now = Now();
  WindowOutlook o;
  o.state = OutlookState::kForecast;
  o.made_at_ns = now;
  o.horizon_ns = 300'000 * kMs;
  o.covered_until_ns = now + o.horizon_ns;
  NextIdleWindow& stall = o.next[static_cast<size_t>(IdleKind::kDataStall)];
  stall.outlook = KindOutlook::kNext;
  stall.windows = 40;
  stall.earliest_start_ns = now + 50 * kMs;
  o.next[static_cast<size_t>(IdleKind::kEval)].outlook = KindOutlook::kNone;
  std::thread writer([&] { host->PublishOutlook(o); });  // the host's telemetry worker
  writer.join();

  ChannelSourceOptions stalls_only;
  stalls_only.kinds = KindBit(IdleKind::kDataStall);
  auto stalls = ChannelWindowSource::Open(host->name(), nullptr, stalls_only);
  ASSERT_TRUE(stalls.ok()) << stalls.status();
  EXPECT_EQ((*stalls)->NoWindowBeforeNs(), now + 50 * kMs);
  auto seen = (*stalls)->Outlook();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->next[static_cast<size_t>(IdleKind::kDataStall)].windows, 40);

  ChannelSourceOptions evals_only;
  evals_only.kinds = KindBit(IdleKind::kEval);
  auto gate = GuestGate::Create({});
  ASSERT_TRUE(gate.ok());
  auto evals = ChannelWindowSource::Open(host->name(), gate->get(), evals_only);
  ASSERT_TRUE(evals.ok()) << evals.status();
  EXPECT_EQ((*evals)->NoWindowBeforeNs(), now + o.horizon_ns) << "none within the horizon";
  // A guest of evals that waits at most 10 s leaves at once, at a boundary.
  std::atomic<bool> stop{false};
  GuestLoopOptions lo;
  lo.max_wait = absl::Seconds(10);
  int units = 0;
  const GuestLoopResult r = RunGuestLoop(
      **gate, **evals,
      [&] {
        ++units;
        return absl::OkStatus();
      },
      stop, lo);
  EXPECT_EQ(r.why, GuestStop::kHostBusy);
  EXPECT_EQ(r.no_window_before_ns, now + o.horizon_ns);
  EXPECT_EQ(units, 0);

  // The host announces 2 minutes without idle time: stalls too are far now.
  o.busy_until_ns = now + 120'000 * kMs;
  host->PublishOutlook(o);
  EXPECT_EQ((*stalls)->NoWindowBeforeNs(), now + 120'000 * kMs);
  EXPECT_EQ((*evals)->NoWindowBeforeNs(), now + o.horizon_ns);
}

TEST(ParseKinds, ReadsNamesAndAllAndNamesAnUnknownKind) {
  EXPECT_EQ(ParseKinds("data_stall").value(), KindBit(IdleKind::kDataStall));
  EXPECT_EQ(ParseKinds("data_stall,eval").value(),
            KindBit(IdleKind::kDataStall) | KindBit(IdleKind::kEval));
  EXPECT_EQ(ParseKinds("all").value(), ~uint32_t{0});
  const absl::Status bad = ParseKinds("data_stall,coffee").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("coffee"), std::string::npos) << bad;
  EXPECT_FALSE(ParseKinds("").ok());
}

}  // namespace
}  // namespace omni::colocate
