#include "omni/preemption.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "omni/store.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kSec = 1'000'000'000;

using test_util::TempDir;

// Writes like a well-behaved agent: temp file + rename.
void WriteNotice(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
  }
  fs::rename(tmp, path);
}

// Polls `pred` (real time; for the watcher thread and for signals delivered
// to another thread) until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& pred, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time end = absl::Now() + timeout;
  while (!pred()) {
    if (absl::Now() > end) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

PreemptionOptions Opts(absl::Duration grace = absl::Seconds(10)) {
  PreemptionOptions o;
  o.grace = grace;
  o.k = 2.0;
  o.slack = 0;  // exact thresholds; the slack has its own test
  o.notice_poll = absl::Milliseconds(5);
  return o;
}

std::unique_ptr<PreemptionMonitor> MakeMonitor(const PreemptionOptions& o, const Clock* clock) {
  auto m = PreemptionMonitor::Create(o, clock);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

bool Contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// Costs: a step takes 1.2 s (1.0 + 2·0.1), a save 3.0 s (2.0 + 2·0.5).
const Cost kStep{1.0, 0.1};
const Cost kSave{2.0, 0.5};

TEST(Preemption, NothingPendingContinuesWithoutAReason) {
  FakeClock clock;
  auto m = MakeMonitor(Opts(), &clock);
  ASSERT_NE(m, nullptr);
  EXPECT_FALSE(m->pending());
  EXPECT_EQ(m->signals_received(), 0);
  const BoundaryDecision d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.action, BoundaryAction::kContinue);
  EXPECT_TRUE(d.reason.empty());
  EXPECT_EQ(d.deadline_ns, 0);
  EXPECT_TRUE(m->last_notice_error().ok());
}

TEST(Preemption, SigtermContinuesWhileStepAndSaveFitThenSavesThenExitsWithoutSave) {
  FakeClock clock;
  auto m = MakeMonitor(Opts(absl::Seconds(10)), &clock);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = clock.NowNanos();
  ASSERT_EQ(raise(SIGTERM), 0);  // delivered to this thread before raise returns
  EXPECT_EQ(m->signals_received(), 1);
  EXPECT_TRUE(m->pending());  // first observation: arrival = t0 on the fake clock

  BoundaryDecision d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.action, BoundaryAction::kContinue);
  EXPECT_EQ(d.deadline_ns, t0 + 10 * kSec);
  EXPECT_TRUE(Contains(d.reason, "SIGTERM")) << d.reason;
  EXPECT_TRUE(Contains(d.reason, "deadline in 10000 ms")) << d.reason;

  clock.Set(t0 + 10 * kSec - 4'200'000'000);  // exactly step + save left
  EXPECT_EQ(m->AtBoundary(kStep, kSave).action, BoundaryAction::kContinue);
  clock.Advance(std::chrono::nanoseconds(1));  // one more step would not leave time to save
  d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.action, BoundaryAction::kSaveAndExit);
  EXPECT_TRUE(Contains(d.reason, "saving now")) << d.reason;
  EXPECT_TRUE(Contains(d.reason, "save 3 s")) << d.reason;

  clock.Set(t0 + 7 * kSec);  // exactly the save left
  EXPECT_EQ(m->AtBoundary(kStep, kSave).action, BoundaryAction::kSaveAndExit);
  clock.Advance(std::chrono::nanoseconds(1));
  d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.action, BoundaryAction::kExitWithoutSave);
  EXPECT_TRUE(Contains(d.reason, "without saving")) << d.reason;
  EXPECT_EQ(d.deadline_ns, t0 + 10 * kSec);
}

TEST(Preemption, SlackStopsEarlierSoThatASlowerStepCannotMakeTheSaveMiss) {
  FakeClock clock;
  PreemptionOptions o = Opts(absl::Seconds(10));
  o.slack = 0.5;
  auto m = MakeMonitor(o, &clock);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = clock.NowNanos();
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_TRUE(m->pending());
  clock.Set(t0 + 10 * kSec - 6'300'000'000);  // (step + save) · 1.5 left
  EXPECT_EQ(m->AtBoundary(kStep, kSave).action, BoundaryAction::kContinue);
  clock.Advance(std::chrono::nanoseconds(1));
  const BoundaryDecision d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.action, BoundaryAction::kSaveAndExit);  // without the slack: another step
  EXPECT_TRUE(Contains(d.reason, "slack 0.5")) << d.reason;
}

TEST(Preemption, SecondSignalEscalatesToSaveNowOrExitIfTheSaveCannotFit) {
  FakeClock clock;
  auto m = MakeMonitor(Opts(absl::Seconds(60)), &clock);
  ASSERT_NE(m, nullptr);
  // kill() may run the handler on any thread (the watcher too): wait for it.
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  ASSERT_TRUE(WaitFor([&] { return m->signals_received() == 1; }));
  EXPECT_EQ(m->AtBoundary(kStep, kSave).action, BoundaryAction::kContinue);
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  ASSERT_TRUE(WaitFor([&] { return m->signals_received() == 2; }));
  BoundaryDecision d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.action, BoundaryAction::kSaveAndExit);
  EXPECT_TRUE(Contains(d.reason, "SIGUSR1")) << d.reason;
  EXPECT_TRUE(Contains(d.reason, "escalated")) << d.reason;
  // Escalated and the save no longer fits: leave without it.
  clock.Advance(std::chrono::seconds(58));
  EXPECT_EQ(m->AtBoundary(kStep, kSave).action, BoundaryAction::kExitWithoutSave);
}

TEST(Preemption, ApiNoticeSetsTheDeadlineAndTheEarliestDeadlineHolds) {
  FakeClock clock;
  auto m = MakeMonitor(Opts(absl::Seconds(30)), &clock);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = clock.NowNanos();
  m->Notice(t0 + 5 * kSec);
  EXPECT_TRUE(m->pending());
  EXPECT_EQ(m->signals_received(), 0);
  BoundaryDecision d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.action, BoundaryAction::kContinue);  // 4.2 s of 5 s
  EXPECT_EQ(d.deadline_ns, t0 + 5 * kSec);
  EXPECT_TRUE(Contains(d.reason, "notice")) << d.reason;
  m->Notice(t0 + 50 * kSec);  // a later notice does not extend the deadline
  EXPECT_EQ(m->AtBoundary(kStep, kSave).deadline_ns, t0 + 5 * kSec);
  m->Notice(t0 + 4 * kSec);  // an earlier one shortens it
  d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.deadline_ns, t0 + 4 * kSec);
  EXPECT_EQ(d.action, BoundaryAction::kSaveAndExit);
  // A signal's grace (30 s) is later than the notice: the notice still holds.
  ASSERT_EQ(raise(SIGTERM), 0);
  d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.deadline_ns, t0 + 4 * kSec);
  EXPECT_TRUE(Contains(d.reason, "SIGTERM")) << d.reason;
}

TEST(Preemption, NoticeFileWithYieldInSecondsCountsFromItsFirstRead) {
  TempDir dir;
  FakeClock clock;
  PreemptionOptions o = Opts();
  o.notice_file = dir / "notice.json";
  auto m = MakeMonitor(o, &clock);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = clock.NowNanos();
  WriteNotice(o.notice_file, R"({"yield_in_s": 30})");
  ASSERT_TRUE(WaitFor([&] { return m->pending(); }));
  BoundaryDecision d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.deadline_ns, t0 + 30 * kSec);  // the fake clock did not move
  EXPECT_TRUE(Contains(d.reason, "notice file")) << d.reason;
  EXPECT_TRUE(Contains(d.reason, "yield_in_s=30")) << d.reason;
  // The same content is not re-converted while time passes.
  clock.Advance(std::chrono::seconds(20));
  absl::SleepFor(absl::Milliseconds(30));  // several watcher polls
  EXPECT_EQ(m->AtBoundary(kStep, kSave).deadline_ns, t0 + 30 * kSec);
  EXPECT_TRUE(m->last_notice_error().ok()) << m->last_notice_error();
}

TEST(Preemption, NoticeFileWithAWallClockDeadlineIsConvertedToTheMonitorClock) {
  TempDir dir;
  FakeClock clock;
  PreemptionOptions o = Opts();
  o.notice_file = dir / "notice.json";
  auto m = MakeMonitor(o, &clock);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = clock.NowNanos();
  const int64_t wall_ms = absl::ToUnixMillis(absl::Now());
  WriteNotice(o.notice_file, "{\"deadline_unix_ms\": " + std::to_string(wall_ms + 20'000) + "}");
  ASSERT_TRUE(WaitFor([&] { return m->pending(); }));
  const BoundaryDecision d = m->AtBoundary(kStep, kSave);
  // 20 s from when it was written, minus the real time until the watcher read it.
  EXPECT_LE(d.deadline_ns, t0 + 20 * kSec + 10'000'000);
  EXPECT_GT(d.deadline_ns, t0 + 15 * kSec);
  EXPECT_EQ(d.action, BoundaryAction::kContinue);
  EXPECT_TRUE(Contains(d.reason, "deadline_unix_ms")) << d.reason;
}

TEST(Preemption, MalformedNoticeFileIsIgnoredAndReportedNamingTheFile) {
  TempDir dir;
  FakeClock clock;
  PreemptionOptions o = Opts();
  o.notice_file = dir / "notice.json";
  auto m = MakeMonitor(o, &clock);
  ASSERT_NE(m, nullptr);
  WriteNotice(o.notice_file, "{\"yield_in_s\": ");
  ASSERT_TRUE(WaitFor([&] { return !m->last_notice_error().ok(); }));
  const absl::Status err = m->last_notice_error();
  EXPECT_EQ(err.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(err.message()), o.notice_file)) << err;
  EXPECT_FALSE(m->pending());
  EXPECT_EQ(m->AtBoundary(kStep, kSave).action, BoundaryAction::kContinue);

  WriteNotice(o.notice_file, R"({"yield_in": 3})");  // valid JSON, no known field
  ASSERT_TRUE(
      WaitFor([&] { return Contains(std::string(m->last_notice_error().message()), "neither"); }));
  EXPECT_FALSE(m->pending());
  WriteNotice(o.notice_file, R"({"yield_in_s": -1})");
  ASSERT_TRUE(WaitFor(
      [&] { return Contains(std::string(m->last_notice_error().message()), "out of range"); }));
  EXPECT_FALSE(m->pending());

  // A later good notice is still honoured.
  WriteNotice(o.notice_file, R"({"yield_in_s": 2})");
  ASSERT_TRUE(WaitFor([&] { return m->pending(); }));
  EXPECT_EQ(m->AtBoundary(kStep, kSave).action, BoundaryAction::kExitWithoutSave);
}

std::atomic<int> g_test_handler_calls{0};
void TestHandler(int) { g_test_handler_calls.fetch_add(1); }

TEST(Preemption, StoreKeyNoticeWithYieldInSecondsIsActedUpon) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore("file://" + (dir / "store"));
  ASSERT_TRUE(store.ok()) << store.status();
  FakeClock clock;
  PreemptionOptions o = Opts();
  o.notice_store = store->get();
  o.notice_key = "job/preempt";
  auto m = MakeMonitor(o, &clock);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = clock.NowNanos();
  EXPECT_FALSE(m->pending());
  ASSERT_TRUE((*store)->Set("job/preempt", R"({"yield_in_s": 12})").ok());
  ASSERT_TRUE(WaitFor([&] { return m->pending(); }));
  const BoundaryDecision d = m->AtBoundary(kStep, kSave);
  EXPECT_EQ(d.deadline_ns, t0 + 12 * kSec);
  EXPECT_TRUE(Contains(d.reason, "store key 'job/preempt'")) << d.reason;
}

TEST(Preemption, StoreKeyNoticeWithAWallClockDeadlineIsRefused) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<Store>> store = OpenStore("file://" + (dir / "store"));
  ASSERT_TRUE(store.ok()) << store.status();
  FakeClock clock;
  PreemptionOptions o = Opts();
  o.notice_store = store->get();
  o.notice_key = "preempt";
  auto m = MakeMonitor(o, &clock);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE((*store)->Set("preempt", R"({"deadline_unix_ms": 1764432000000})").ok());
  ASSERT_TRUE(WaitFor([&] { return !m->last_notice_error().ok(); }));
  EXPECT_TRUE(Contains(std::string(m->last_notice_error().message()), "wall-clock"))
      << m->last_notice_error();
  EXPECT_FALSE(m->pending());
  PreemptionOptions half = Opts();
  half.notice_key = "preempt";  // without a store
  EXPECT_TRUE(absl::IsInvalidArgument(PreemptionMonitor::Create(half, &clock).status()));
}

TEST(Preemption, PreviousHandlersAreRestoredOnDestruction) {
  struct sigaction mine {};
  mine.sa_handler = &TestHandler;
  sigemptyset(&mine.sa_mask);
  struct sigaction original {};
  ASSERT_EQ(sigaction(SIGUSR2, &mine, &original), 0);
  struct sigaction term_before {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &term_before), 0);
  g_test_handler_calls = 0;
  {
    PreemptionOptions o = Opts();
    o.signals = {SIGUSR2, SIGTERM, SIGUSR2};  // a duplicate must not lose the original
    auto m = MakeMonitor(o, Clock::Real());
    ASSERT_NE(m, nullptr);
    ASSERT_EQ(raise(SIGUSR2), 0);
    EXPECT_EQ(m->signals_received(), 1);
    EXPECT_EQ(g_test_handler_calls.load(), 0);  // the monitor's handler ran instead
  }
  ASSERT_EQ(raise(SIGUSR2), 0);
  EXPECT_EQ(g_test_handler_calls.load(), 1);  // ours is back
  struct sigaction term_after {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &term_after), 0);
  EXPECT_EQ(term_after.sa_handler, term_before.sa_handler);
  ASSERT_EQ(sigaction(SIGUSR2, &original, nullptr), 0);
}

TEST(Preemption, OnlyOneMonitorPerProcessAndTheSlotIsFreedOnDestruction) {
  FakeClock clock;
  auto first = MakeMonitor(Opts(), &clock);
  ASSERT_NE(first, nullptr);
  auto second = PreemptionMonitor::Create(Opts(), &clock);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  first.reset();
  auto third = PreemptionMonitor::Create(Opts(), &clock);
  EXPECT_TRUE(third.ok()) << third.status();
}

TEST(Preemption, BadOptionsAreRejectedAndLeaveNoHandlerBehind) {
  FakeClock clock;
  EXPECT_EQ(PreemptionMonitor::Create(Opts(), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  PreemptionOptions o = Opts();
  o.notice_poll = absl::ZeroDuration();
  EXPECT_EQ(PreemptionMonitor::Create(o, &clock).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Opts();
  o.k = -1;
  EXPECT_EQ(PreemptionMonitor::Create(o, &clock).status().code(),
            absl::StatusCode::kInvalidArgument);
  o = Opts();
  o.slack = -0.1;
  EXPECT_EQ(PreemptionMonitor::Create(o, &clock).status().code(),
            absl::StatusCode::kInvalidArgument);
  struct sigaction term_before {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &term_before), 0);
  o = Opts();
  o.signals = {SIGTERM, SIGKILL};  // SIGKILL cannot be caught
  auto bad = PreemptionMonitor::Create(o, &clock);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(bad.status().message()), "signal 9")) << bad.status();
  struct sigaction term_after {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &term_after), 0);
  EXPECT_EQ(term_after.sa_handler, term_before.sa_handler);
  EXPECT_TRUE(PreemptionMonitor::Create(Opts(), &clock).ok());  // slot released
}

TEST(Preemption, DestructionIsPromptEvenWithALongNoticePoll) {
  TempDir dir;
  PreemptionOptions o = Opts();
  o.notice_poll = absl::Seconds(60);
  o.notice_file = dir / "notice.json";
  auto m = MakeMonitor(o, Clock::Real());
  ASSERT_NE(m, nullptr);
  const absl::Time start = absl::Now();
  m.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(Preemption, ApplyEnvironmentReadsTheGraceAtEveryCall) {
  PreemptionOptions o;
  ASSERT_EQ(unsetenv("OMNI_PREEMPT_GRACE_S"), 0);
  ASSERT_TRUE(ApplyEnvironment(o).ok());
  EXPECT_EQ(o.grace, absl::Seconds(30));
  ASSERT_EQ(setenv("OMNI_PREEMPT_GRACE_S", "12.5", 1), 0);
  ASSERT_TRUE(ApplyEnvironment(o).ok());
  EXPECT_EQ(o.grace, absl::Milliseconds(12500));
  ASSERT_EQ(setenv("OMNI_PREEMPT_GRACE_S", "3", 1), 0);
  ASSERT_TRUE(ApplyEnvironment(o).ok());
  EXPECT_EQ(o.grace, absl::Seconds(3));
  for (const char* bad : {"abc", "-1", "nan", "5s"}) {
    ASSERT_EQ(setenv("OMNI_PREEMPT_GRACE_S", bad, 1), 0);
    const absl::Status st = ApplyEnvironment(o);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(std::string(st.message()), "OMNI_PREEMPT_GRACE_S")) << st;
    EXPECT_EQ(o.grace, absl::Seconds(3)) << "a malformed value must not change the options";
  }
  ASSERT_EQ(unsetenv("OMNI_PREEMPT_GRACE_S"), 0);
}

// ------------------------------------------------------------ real processes

// A child that trains "steps" of ~5 ms with a monitor on the real clock and
// acts on AtBoundary. The step estimate is generous (0.105 s) so that a busy
// machine that stalls a step by less than that still saves in time. It writes 'r' to `fd` once the
// handlers are installed and 's' once it has seen the first signal. Never returns.
[[noreturn]] void ChildTrainer(int fd, absl::Duration grace) {
  PreemptionOptions o;
  o.grace = grace;
  auto m = PreemptionMonitor::Create(o, Clock::Real());
  if (!m.ok()) _exit(2);
  if (write(fd, "r", 1) != 1) _exit(2);
  bool told = false;
  for (int step = 0; step < 20'000; ++step) {
    absl::SleepFor(absl::Milliseconds(5));
    if (!told && (*m)->pending()) {
      told = true;
      if (write(fd, "s", 1) != 1) _exit(2);
    }
    const BoundaryDecision d = (*m)->AtBoundary(Cost{0.005, 0.05}, Cost{0.2, 0.01});
    if (d.action == BoundaryAction::kSaveAndExit) {
      // (A real trainer writes its checkpoint here.)
      m->reset();
      _exit(kExitPreempted);
    }
    if (d.action == BoundaryAction::kExitWithoutSave) _exit(kExitPreemptedNoSave);
  }
  _exit(3);  // never preempted
}

// Reads one byte from `fd` within `timeout_ms`; 0 when none came.
char ReadByte(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return 0;
  char c = 0;
  return read(fd, &c, 1) == 1 ? c : 0;
}

// Waits for `pid` up to `timeout`; kills it when it takes longer. The wait
// status, or -1 on timeout.
int WaitChild(pid_t pid, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < end) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    absl::SleepFor(absl::Milliseconds(5));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

TEST(PreemptionProcess, ChildSavesAndExitsWithExitPreemptedBeforeTheGraceEnds) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    ChildTrainer(fds[1], absl::Seconds(2));
  }
  close(fds[1]);
  ASSERT_EQ(ReadByte(fds[0], 10'000), 'r') << "child did not install its handlers";
  const absl::Time sent = absl::Now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = WaitChild(pid, absl::Seconds(10));
  const absl::Duration took = absl::Now() - sent;
  close(fds[0]);
  ASSERT_NE(status, -1) << "child did not exit within 10 s of SIGTERM";
  ASSERT_TRUE(WIFEXITED(status)) << "child died: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), kExitPreempted);
  // It kept training while a step + save fit: it decides at ~1.68 s of the
  // 2 s grace (the exit code says the save fit before the deadline).
  EXPECT_GT(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(4));
}

TEST(PreemptionProcess, SecondSigtermMakesTheChildSaveAtTheNextBoundary) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    ChildTrainer(fds[1], absl::Seconds(600));
  }
  close(fds[1]);
  ASSERT_EQ(ReadByte(fds[0], 10'000), 'r');
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  ASSERT_EQ(ReadByte(fds[0], 10'000), 's') << "child did not see the first SIGTERM";
  const absl::Time sent = absl::Now();
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int status = WaitChild(pid, absl::Seconds(10));
  close(fds[0]);
  ASSERT_NE(status, -1) << "child did not exit within 10 s of the second SIGTERM";
  ASSERT_TRUE(WIFEXITED(status)) << "child died: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), kExitPreempted);
  EXPECT_LT(absl::Now() - sent, absl::Seconds(5));
}

}  // namespace
}  // namespace omni
