#include "omni/telemetry.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "omni/step_log.h"
#include "runtime/worker_pacing.h"
#include "telemetry_options.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

using test_util::TempDir;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// One step: data_wait `dw` ms, compute 50 ms, optimizer 10 ms.
void RunStep(Telemetry& t, FakeClock& clock, int dw_ms) {
  StepScope step(t);
  {
    PhaseScope p(t, phase::kDataWait);
    clock.Advance(milliseconds(dw_ms));
  }
  {
    PhaseScope p(t, phase::kCompute);
    clock.Advance(milliseconds(50));
  }
  {
    PhaseScope p(t, phase::kOptimizer);
    clock.Advance(milliseconds(10));
  }
}

const StatsSnapshot::Row* FindRow(const StatsSnapshot& s, const std::string& name) {
  for (const auto& r : s.rows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

TEST(Telemetry, MeasuresStepsAndPhasesOnTheInjectedClock) {
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  for (int i = 0; i < 10; ++i) RunStep(**tel, clock, i % 2 ? 30 : 10);
  ASSERT_TRUE((*tel)->Flush().ok());
  const StatsSnapshot s = (*tel)->Snapshot();
  EXPECT_EQ(s.steps_seen, 10);
  const auto* step = FindRow(s, "step");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->summary.count, 10);
  EXPECT_DOUBLE_EQ(step->summary.mean, 80e6);
  EXPECT_DOUBLE_EQ(step->summary.stddev, 10e6);
  EXPECT_DOUBLE_EQ(step->summary.min, 70e6);
  EXPECT_DOUBLE_EQ(step->summary.max, 90e6);
  const auto* dw = FindRow(s, "data_wait");
  ASSERT_NE(dw, nullptr);
  EXPECT_DOUBLE_EQ(dw->summary.p50, 20e6);
  EXPECT_EQ(dw->idle_kind, "data_stall");
  EXPECT_DOUBLE_EQ(FindRow(s, "compute")->summary.mean, 50e6);
  const TelemetryCounters c = (*tel)->Counters();
  EXPECT_EQ(c.steps_recorded, 10);
  EXPECT_EQ(c.misuse_errors, 0);
  EXPECT_TRUE((*tel)->Close().ok());
}

// The runtime's threads carry names (common/thread_name.h), so that a
// host's top -H or /proc/<pid>/task tells what its worker costs.
TEST(Telemetry, ItsWorkerThreadIsNamedOmniTelemetry) {
  const auto named = [] {
    int n = 0;
    for (const auto& t : fs::directory_iterator("/proc/self/task")) {
      std::ifstream comm(t.path() / "comm");
      std::string name;
      std::getline(comm, name);
      n += name == "omni-telemetry" ? 1 : 0;
    }
    return n;
  };
  const int before = named();
  FakeClock clock;
  auto tel = Telemetry::Create({}, &clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  ASSERT_TRUE((*tel)->Flush().ok());  // the worker has run
  EXPECT_EQ(named(), before + 1);
  ASSERT_TRUE((*tel)->Close().ok());
  EXPECT_EQ(named(), before) << "joined";
}

TEST(Telemetry, PublishesForecastsAfterStationarySteps) {
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  ASSERT_TRUE(tel.ok());
  std::atomic<int> calls{0};
  Forecast last;
  (*tel)->AddSink(MakeCallbackSink([&](const Forecast& f) {
    last = f;
    calls++;
    return absl::OkStatus();
  }));
  for (int i = 0; i < 5; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  auto f = (*tel)->LatestForecast();
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_GE(calls.load(), 1);
  EXPECT_EQ(last.last_step, 4);
  ASSERT_FALSE(f->windows.empty());
  EXPECT_EQ(f->windows[0].kind, IdleKind::kDataStall);
  EXPECT_EQ(f->windows[0].duration_ns, 20'000'000);
  EXPECT_EQ(f->windows[0].start_ns, clock.NowNanos());
}

TEST(Telemetry, NextStepBoundsComeFromTheWorkersLatestModel) {
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  ASSERT_TRUE(tel.ok());
  for (int i = 0; i < 3; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  EXPECT_EQ((*tel)->NextStepBounds(2).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int i = 0; i < 5; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  auto b = (*tel)->NextStepBounds(2);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[0].step, 8);
  EXPECT_EQ((*b)[1].step, 9);
  EXPECT_EQ((*b)[0].lo_ns, 80'000'000);  // steady 80 ms steps
  EXPECT_EQ((*b)[0].hi_ns, 80'000'000);
  EXPECT_NEAR((*b)[0].confidence, 0.9545, 1e-4);
  EXPECT_EQ((*tel)->SaveBound().status().code(), absl::StatusCode::kNotFound);
}

TEST(Telemetry, MisuseReturnsErrorsAndTelemetryKeepsWorking) {
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  ASSERT_TRUE(tel.ok());
  Telemetry& t = **tel;
  EXPECT_EQ(t.EndStep().code(), absl::StatusCode::kFailedPrecondition);  // no step
  EXPECT_EQ(t.BeginPhase(phase::kCompute).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.BeginStep(0).ok());
  EXPECT_EQ(t.BeginStep(1).code(), absl::StatusCode::kFailedPrecondition);  // nested step
  ASSERT_TRUE(t.BeginPhase(phase::kCompute).ok());
  ASSERT_TRUE(t.BeginPhase(phase::kComm).ok());
  const absl::Status nest = t.EndPhase(phase::kCompute);  // not innermost
  EXPECT_EQ(nest.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nest.message().find("innermost open phase is comm"), absl::string_view::npos);
  clock.Advance(milliseconds(5));
  ASSERT_TRUE(t.EndPhase(phase::kComm).ok());
  ASSERT_TRUE(t.EndPhase(phase::kCompute).ok());
  EXPECT_EQ(t.BeginPhase(200).code(), absl::StatusCode::kInvalidArgument);  // unknown phase
  EXPECT_EQ(t.RecordPhase(phase::kComm, std::nan("")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.RecordPhase(phase::kComm, -1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.RecordPhase(phase::kComm, 10.0).code(), absl::StatusCode::kInvalidArgument);
  clock.Advance(milliseconds(5));
  ASSERT_TRUE(t.RecordPhase(phase::kComm, 0.004).ok());
  ASSERT_TRUE(t.EndStep().ok());
  EXPECT_EQ(t.EndStep().code(), absl::StatusCode::kFailedPrecondition);  // ended twice
  EXPECT_EQ(t.BeginStep(0).code(), absl::StatusCode::kInvalidArgument);  // not after last
  // Still works after all that.
  ASSERT_TRUE(t.BeginStep(1).ok());
  ASSERT_TRUE(t.BeginPhase(phase::kDataWait).ok());
  clock.Advance(milliseconds(1));
  EXPECT_EQ(t.EndStep().code(), absl::StatusCode::kFailedPrecondition);  // phase open
  ASSERT_TRUE(t.Flush().ok());
  const TelemetryCounters c = t.Counters();
  EXPECT_EQ(c.steps_recorded, 2);
  EXPECT_EQ(c.misuse_errors, 11);
  EXPECT_FALSE(c.last_error.ok());
  const StatsSnapshot s = t.Snapshot();
  EXPECT_EQ(s.steps_seen, 2);
  EXPECT_DOUBLE_EQ(FindRow(s, "comm")->summary.max, 9e6);  // nested 5 ms + recorded 4 ms
  EXPECT_TRUE(t.Close().ok());
  EXPECT_EQ(t.BeginStep(5).code(), absl::StatusCode::kFailedPrecondition);  // after Close
}

// A phase found to be something else only at its end (a save abandoned
// because another replica failed) is recorded as the phase it was: its
// time leaves the save bound, which the saves alone make.
TEST(Telemetry, APhaseEndedAsAnotherIsRecordedAsThatPhaseAndLeavesTheSaveBound) {
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  Telemetry& t = **tel;
  absl::StatusOr<PhaseId> abandoned = t.RegisterPhase("save_abandoned", IdleKind::kHostSide);
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  for (int i = 0; i < 12; ++i) {
    RunStep(t, clock, 20);
    StepScope step(t);
    PhaseScope save(t, phase::kCheckpoint);
    if (i == 6) {
      clock.Advance(milliseconds(3000));  // waited for a replica that had died
      save.EndAs(*abandoned);
    } else {
      clock.Advance(milliseconds(15));
    }
  }
  ASSERT_TRUE(t.Flush().ok());
  const StatsSnapshot s = t.Snapshot();
  ASSERT_NE(FindRow(s, "checkpoint"), nullptr);
  EXPECT_EQ(FindRow(s, "checkpoint")->summary.count, 11);
  EXPECT_DOUBLE_EQ(FindRow(s, "checkpoint")->summary.max, 15e6);
  ASSERT_NE(FindRow(s, "save_abandoned"), nullptr);
  EXPECT_EQ(FindRow(s, "save_abandoned")->summary.count, 1);
  EXPECT_EQ(FindRow(s, "save_abandoned")->idle_kind, "host_side");
  absl::StatusOr<StepBound> b = t.SaveBound();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_LT(b->hi_ns, 100'000'000) << "the abandoned save's 3 s is not a save's time";
  EXPECT_GE(b->hi_ns, 15'000'000);

  // Errors as EndPhase's, and for an unknown phase to record it as; the
  // phase stays open after them.
  ASSERT_TRUE(t.BeginStep().ok());
  ASSERT_TRUE(t.BeginPhase(phase::kCheckpoint).ok());
  EXPECT_EQ(t.EndPhaseAs(phase::kCheckpoint, 200).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t.EndPhaseAs(phase::kCompute, *abandoned).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(t.EndPhaseAs(phase::kCheckpoint, *abandoned).ok());
  EXPECT_EQ(t.EndPhaseAs(phase::kCheckpoint, *abandoned).code(), absl::StatusCode::kInvalidArgument)
      << "no phase is open";
  EXPECT_TRUE(t.EndStep().ok());
  EXPECT_TRUE(t.Close().ok());
}

TEST(Telemetry, DropsStepsWhenTheWorkerIsBehindAndCountsThem) {
  FakeClock clock;
  TelemetryOptions o = testing::FastTelemetryOptions();
  o.ring_capacity = 4;
  o.worker_poll = absl::Hours(1);  // the worker only runs on Flush
  auto tel = Telemetry::Create(o, &clock);
  ASSERT_TRUE(tel.ok());
  for (int i = 0; i < 10; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  const TelemetryCounters c = (*tel)->Counters();
  EXPECT_EQ(c.steps_recorded, 4);
  EXPECT_EQ(c.steps_dropped, 6);
  EXPECT_EQ((*tel)->Snapshot().steps_seen, 4);
  for (int i = 0; i < 3; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  EXPECT_EQ((*tel)->Counters().steps_recorded, 7);
}

TEST(Telemetry, AWorkerMoreThanHalfTheRingBehindForecastsFewerStepsAndLogsThemAll) {
  // Steps shorter than the forecaster's work per step (a model each time),
  // on a busy host: the worker fell behind, the ring filled, and steps were
  // dropped from the step log too (examples/minimal's 0.15 ms steps beside
  // two busy loops: 3,504 to 3,884 of 4,000 logged).
  TempDir dir;
  FakeClock clock;
  TelemetryOptions o = testing::FastTelemetryOptions();
  o.ring_capacity = 64;
  o.worker_poll = absl::Hours(1);  // the worker only runs on Flush
  o.step_log_path = dir / "steps.jsonl";
  auto tel = Telemetry::Create(o, &clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  for (int i = 0; i < 60; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  TelemetryCounters c = (*tel)->Counters();
  EXPECT_EQ(c.steps_recorded, 60);
  EXPECT_EQ(c.steps_dropped, 0);
  EXPECT_EQ(c.steps_not_forecast, 60 - 32);  // the newest half of the ring is forecast
  EXPECT_EQ((*tel)->Snapshot().steps_seen, 60);
  EXPECT_TRUE((*tel)->LatestForecast().ok()) << (*tel)->LatestForecast().status();
  // Within half the ring, every step is forecast.
  for (int i = 0; i < 30; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  c = (*tel)->Counters();
  EXPECT_EQ(c.steps_not_forecast, 60 - 32);
  ASSERT_TRUE((*tel)->Close().ok());
  auto log = ReadStepLog(o.step_log_path);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_EQ(log->steps.size(), 90u);
  for (size_t i = 0; i < log->steps.size(); ++i)
    EXPECT_EQ(log->steps[i].step, static_cast<int64_t>(i));
}

TEST(Telemetry, RejectsBadOptionsNamingThem) {
  TelemetryOptions o;
  o.stats.window = 0;
  EXPECT_NE(Telemetry::Create(o).status().message().find("window"), absl::string_view::npos);
  o = TelemetryOptions{};
  o.stats.window = -3;
  EXPECT_EQ(Telemetry::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = TelemetryOptions{};
  o.ring_capacity = 100;
  EXPECT_NE(Telemetry::Create(o).status().message().find("ring_capacity"), absl::string_view::npos);
  o = TelemetryOptions{};
  o.forecast.k = INFINITY;
  EXPECT_FALSE(Telemetry::Create(o).ok());
}

TEST(Telemetry, WritesStepLogAndPerfettoTrace) {
  TempDir dir;
  FakeClock clock;
  TelemetryOptions o = testing::FastTelemetryOptions();
  o.step_log_path = dir / "steps.jsonl";
  o.trace_path = dir / "trace.json";
  o.source = "unit-test";
  auto tel = Telemetry::Create(o, &clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  auto user = (*tel)->RegisterPhase("grad_clip", IdleKind::kNone);
  ASSERT_TRUE(user.ok());
  for (int i = 0; i < 6; ++i) {
    StepScope s(**tel);
    {
      PhaseScope p(**tel, phase::kCompute);
      clock.Advance(milliseconds(40));
      PhaseScope q(**tel, *user);
      clock.Advance(milliseconds(2));
    }
    clock.Advance(milliseconds(1));
  }
  ASSERT_TRUE((*tel)->Close().ok());
  auto log = ReadStepLog(o.step_log_path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->header.source, "unit-test");
  ASSERT_EQ(log->steps.size(), 6u);
  EXPECT_EQ(log->header.phases.name(*user), "grad_clip");
  EXPECT_EQ(log->steps[2].num_spans, 2);
  EXPECT_EQ(log->steps[2].spans[1].depth, 1);
  const auto trace = nlohmann::json::parse(ReadAll(o.trace_path));
  ASSERT_TRUE(trace.is_array());
  int steps = 0, grad = 0;
  for (const auto& e : trace) {
    if (e.value("cat", "") == "step") steps++;
    if (e.value("name", "") == "grad_clip") grad++;
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(grad, 6);
}

TEST(Telemetry, UnwritablePathsFailCreateNamingThePath) {
  TelemetryOptions o;
  o.step_log_path = "/nonexistent-dir/steps.jsonl";
  auto t = Telemetry::Create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("/nonexistent-dir/steps.jsonl"), absl::string_view::npos);
  auto sink = MakeFileSink("/nonexistent-dir/forecast.json");
  ASSERT_FALSE(sink.ok());
  EXPECT_NE(sink.status().message().find("/nonexistent-dir/forecast.json"),
            absl::string_view::npos);
}

TEST(Telemetry, FileSinkReplacesTheForecastAtomically) {
  TempDir dir;
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  auto sink = MakeFileSink(dir / "forecast.json");
  ASSERT_TRUE(sink.ok());
  (*tel)->AddSink(*std::move(sink));
  for (int i = 0; i < 5; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  auto f = ForecastFromJson(ReadAll(dir / "forecast.json"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->last_step, 4);
  RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  EXPECT_EQ(ForecastFromJson(ReadAll(dir / "forecast.json"))->last_step, 5);
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(dir / "x").parent_path())) {
    (void)e;
    files++;
  }
  EXPECT_EQ(files, 1);  // no temporary left behind
}

TEST(Telemetry, SinkFailuresAreCountedAndTrainingContinues) {
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  (*tel)->AddSink(MakeCallbackSink(
      [](const Forecast&) { return absl::UnavailableError("agent down"); }, "node-agent"));
  for (int i = 0; i < 5; ++i) RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  const TelemetryCounters c = (*tel)->Counters();
  EXPECT_EQ(c.steps_recorded, 6);
  EXPECT_GE(c.export_errors, 2);
  EXPECT_NE(c.last_error.message().find("node-agent"), absl::string_view::npos);
  EXPECT_FALSE((*tel)->Close().ok());  // Close reports the first export error
}

TEST(Telemetry, RejectsStepsWhoseClockWentBackwards) {
  FakeClock clock;
  auto tel = Telemetry::Create(testing::FastTelemetryOptions(), &clock);
  ASSERT_TRUE((*tel)->BeginStep(0).ok());
  clock.Set(clock.NowNanos() - 1000);
  ASSERT_TRUE((*tel)->EndStep().ok());
  RunStep(**tel, clock, 20);
  ASSERT_TRUE((*tel)->Flush().ok());
  EXPECT_EQ((*tel)->Counters().steps_rejected, 1);
  EXPECT_EQ((*tel)->Snapshot().steps_seen, 1);
}

// The worker's wait between looks at the ring (runtime/worker_pacing.h).
constexpr int64_t kMs = 1'000'000;

internal::WorkerPacing PacedBySteps(int n, int64_t step_ns) {
  internal::WorkerPacing p;
  for (int i = 0; i < n; ++i) p.Note(i * step_ns, (i + 1) * step_ns);
  return p;
}

TEST(Telemetry, CountsTheWorkersWakeUps) {
  auto tel = Telemetry::Create(TelemetryOptions{}).value();
  const int64_t before = tel->Counters().worker_wakeups;
  ASSERT_TRUE(tel->Flush().ok());  // wakes the worker at once
  ASSERT_TRUE(tel->Flush().ok());
  EXPECT_GE(tel->Counters().worker_wakeups, before + 2);
}

TEST(WorkerPacing, PollsUntilItHasSeenEnoughStepsAndWhileASinkIsAttached) {
  const absl::Duration poll = absl::Milliseconds(2);
  const int n = internal::WorkerPacing::kPacingSteps;
  EXPECT_EQ(internal::WorkerPacing().Next(0, poll, false), poll);
  EXPECT_EQ(PacedBySteps(n - 1, 50 * kMs).Next((n - 1) * 50 * kMs, poll, false), poll);
  EXPECT_EQ(PacedBySteps(n, 50 * kMs).Next(n * 50 * kMs, poll, /*prompt=*/true), poll);
}

TEST(WorkerPacing, SleepsUntilShortlyBeforeTheNextStepCanEndThenPolls) {
  const absl::Duration poll = absl::Milliseconds(2);
  const int n = internal::WorkerPacing::kPacingSteps;
  internal::WorkerPacing p = PacedBySteps(n, 50 * kMs);
  const int64_t end = n * 50 * kMs;
  // 90% of the shortest recent step after the last step's end.
  EXPECT_EQ(p.Next(end + kMs, poll, false), absl::Milliseconds(44));
  // Past that point, or past the step's end: a poll.
  EXPECT_EQ(p.Next(end + 46 * kMs, poll, false), poll);
  EXPECT_EQ(p.Next(end + 80 * kMs, poll, false), poll);
  // One shorter step among the recent ones shortens the sleep.
  p.Note(end, end + 20 * kMs);
  EXPECT_EQ(p.Next(end + 20 * kMs, poll, false), absl::Milliseconds(18));
  // A poll longer than the sleep is kept.
  EXPECT_EQ(p.Next(end + 20 * kMs, absl::Milliseconds(30), false), absl::Milliseconds(30));
}

TEST(WorkerPacing, ALongNextStepIsSleptThroughInWakeUpsOfAtMostTheLongestSleep) {
  const absl::Duration poll = absl::Milliseconds(2);
  const int n = internal::WorkerPacing::kPacingSteps;
  internal::WorkerPacing p = PacedBySteps(n, 10 * kMs);
  const int64_t end = n * 10 * kMs;
  p.ExpectNext(230 * kMs);  // an eval step: due 207 ms after the last end
  EXPECT_EQ(p.Next(end, poll, false), internal::WorkerPacing::kMaxSleep);
  EXPECT_EQ(p.Next(end + 150 * kMs, poll, false), absl::Milliseconds(57));
  EXPECT_EQ(p.Next(end + 210 * kMs, poll, false), poll);
  p.ExpectNext(0);  // no forecast: the recent steps alone
  EXPECT_EQ(p.Next(end, poll, false), absl::Milliseconds(9));
}

}  // namespace
}  // namespace omni
