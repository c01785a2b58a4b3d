// The step log and trace across runs of one job: a resumed run keeps the
// earlier run's files, and a trace cut short (no Close) is whole events.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "omni/clock.h"
#include "omni/step_log.h"
#include "omni/telemetry.h"
#include "telemetry_options.h"
#include "temp_dir.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

using test_util::TempDir;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<Telemetry> RunSteps(const TempDir& dir, FakeClock& clock, int64_t first, int steps,
                                    bool keep_previous) {
  TelemetryOptions o;
  o.step_log_path = dir / "steps.jsonl";
  o.trace_path = dir / "trace.json";
  o.keep_previous_outputs = keep_previous;
  o.forecast_enabled = false;
  absl::StatusOr<std::unique_ptr<Telemetry>> t = Telemetry::Create(o, &clock);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int64_t s = first; s < first + steps; ++s) {
    EXPECT_TRUE((*t)->BeginStep(s).ok());
    clock.Advance(std::chrono::milliseconds(10));
    EXPECT_TRUE((*t)->EndStep().ok());
  }
  EXPECT_TRUE((*t)->Flush().ok());
  return *std::move(t);
}

TEST(TelemetryOutputs, AResumedRunMovesTheEarlierStepLogAndTraceAside) {
  TempDir dir;
  FakeClock clock;
  ASSERT_TRUE(RunSteps(dir, clock, 0, 5, true)->Close().ok());
  ASSERT_TRUE(RunSteps(dir, clock, 5, 3, true)->Close().ok());
  absl::StatusOr<StepLog> earlier = ReadStepLog(dir / "steps.jsonl.1");
  absl::StatusOr<StepLog> resumed = ReadStepLog(dir / "steps.jsonl");
  ASSERT_TRUE(earlier.ok()) << earlier.status();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(earlier->steps.size(), 5U);
  ASSERT_EQ(resumed->steps.size(), 3U);
  EXPECT_EQ(resumed->steps[0].step, 5);
  EXPECT_TRUE(nlohmann::json::accept(Read(dir / "trace.json.1")));
  EXPECT_TRUE(nlohmann::json::accept(Read(dir / "trace.json")));
  // A third run takes the next free name.
  ASSERT_TRUE(RunSteps(dir, clock, 8, 1, true)->Close().ok());
  EXPECT_EQ(ReadStepLog(dir / "steps.jsonl.2")->steps.size(), 3U);
}

TEST(TelemetryOutputs, WithoutKeepPreviousTheOutputsAreTruncated) {
  TempDir dir;
  FakeClock clock;
  ASSERT_TRUE(RunSteps(dir, clock, 0, 5, false)->Close().ok());
  ASSERT_TRUE(RunSteps(dir, clock, 5, 3, false)->Close().ok());
  EXPECT_FALSE(fs::exists(dir / "steps.jsonl.1"));
  EXPECT_EQ(ReadStepLog(dir / "steps.jsonl")->steps.size(), 3U);
}

TEST(TelemetryOutputs, ATraceCutBeforeCloseHoldsWholeEventsAndLacksOnlyTheBracket) {
  TempDir dir;
  FakeClock clock;
  std::unique_ptr<Telemetry> t = RunSteps(dir, clock, 0, 4, false);
  // As a SIGKILL would leave it: no Close.
  const std::string cut = Read(dir / "trace.json");
  EXPECT_FALSE(nlohmann::json::accept(cut));
  const nlohmann::json events = nlohmann::json::parse(cut + "\n]", nullptr, false);
  ASSERT_FALSE(events.is_discarded()) << cut;
  int steps = 0;
  for (const auto& e : events) steps += e.value("cat", "") == "step" ? 1 : 0;
  EXPECT_EQ(steps, 4);
}

// A job whose data loader stalls for 40 ms at the start of every 3rd step.
void RunRhythm(Telemetry& t, FakeClock& clock, int64_t first, int steps, PhaseId wait) {
  for (int64_t s = first; s < first + steps; ++s) {
    ASSERT_TRUE(t.BeginStep(s).ok());
    if (s % 3 == 0) {
      ASSERT_TRUE(t.BeginPhase(wait).ok());
      clock.Advance(std::chrono::milliseconds(40));
      ASSERT_TRUE(t.EndPhase(wait).ok());
    }
    ASSERT_TRUE(t.BeginPhase(phase::kCompute).ok());
    clock.Advance(std::chrono::milliseconds(50));
    ASSERT_TRUE(t.EndPhase(phase::kCompute).ok());
    ASSERT_TRUE(t.EndStep().ok());
    clock.Advance(std::chrono::microseconds(100));
  }
}

TelemetryOptions ForecastOptionsIn(const TempDir& dir) {
  TelemetryOptions o = testing::FastTelemetryOptions();
  o.step_log_path = dir / "steps.jsonl";
  o.keep_previous_outputs = true;
  return o;
}

// The data-stall windows of the latest forecast, by step.
std::vector<int64_t> StallWindowSteps(const Telemetry& t) {
  std::vector<int64_t> steps;
  absl::StatusOr<Forecast> f = t.LatestForecast();
  if (!f.ok()) return steps;
  for (const IdleWindow& w : f->windows) {
    if (w.kind == IdleKind::kDataStall) steps.push_back(w.step);
  }
  return steps;
}

// Resumed from a checkpoint of step 249 after a run that went on to step
// 299: the new run's forecaster knows the rhythm from its first step.
TEST(TelemetryOutputs, AResumedRunForecastsFromItsFirstStepWhatTheEarlierRunLearned) {
  TempDir dir;
  FakeClock clock;
  {
    auto t = Telemetry::Create(ForecastOptionsIn(dir), &clock);
    ASSERT_TRUE(t.ok()) << t.status();
    RunRhythm(**t, clock, 0, 300, phase::kDataWait);
    ASSERT_TRUE((*t)->Close().ok());
  }
  clock.Advance(std::chrono::seconds(30));  // the job was down
  for (const int learn : {1024, 0}) {
    SCOPED_TRACE(learn);
    TelemetryOptions o = ForecastOptionsIn(dir);
    o.learn_previous_steps = learn;
    auto t = Telemetry::Create(o, &clock);
    ASSERT_TRUE(t.ok()) << t.status();
    RunRhythm(**t, clock, 250, 1, phase::kDataWait);
    ASSERT_TRUE((*t)->Flush().ok());
    const TelemetryCounters c = (*t)->Counters();
    EXPECT_TRUE(c.previous_log_status.ok()) << c.previous_log_status;
    if (learn == 0) {
      EXPECT_EQ(c.previous_steps_learned, 0);
      EXPECT_FALSE((*t)->LatestForecast().ok());  // one step: too few to forecast
      continue;
    }
    // Steps 0-249: the redone steps 250-299 of the earlier run are not.
    EXPECT_EQ(c.previous_steps_learned, 250);
    const std::vector<int64_t> stalls = StallWindowSteps(**t);
    ASSERT_FALSE(stalls.empty());
    for (const int64_t s : stalls) EXPECT_EQ(s % 3, 0) << s;
    EXPECT_TRUE(std::find(stalls.begin(), stalls.end(), 252) != stalls.end());
    absl::StatusOr<std::vector<StepBound>> next = (*t)->NextStepBounds(3);
    ASSERT_TRUE(next.ok()) << next.status();
    // Step 252 stalls, 251 does not: the bounds know which is which.
    EXPECT_GT(next->at(1).lo_ns, next->at(0).hi_ns);
    // This run's statistics and step log hold its own step only.
    EXPECT_EQ(ReadStepLog(dir / "steps.jsonl")->steps.size(), 1U);
    ASSERT_TRUE((*t)->Close().ok());
  }
}

// The earlier run's phases are not this run's (another job, or one whose
// phases changed): nothing of it is learned, the run says why and goes on.
TEST(TelemetryOutputs, AnEarlierRunWithOtherPhasesOrAnUnreadableLogIsNotLearnedFrom) {
  TempDir dir;
  FakeClock clock;
  {
    auto t = Telemetry::Create(ForecastOptionsIn(dir), &clock);
    ASSERT_TRUE(t.ok()) << t.status();
    absl::StatusOr<PhaseId> fetch = (*t)->RegisterPhase("fetch", IdleKind::kDataStall);
    ASSERT_TRUE(fetch.ok());
    RunRhythm(**t, clock, 0, 60, *fetch);
    ASSERT_TRUE((*t)->Close().ok());
  }
  // A resumed run of two steps from `first`: what its telemetry counted.
  const auto resume = [&](int64_t first) {
    TelemetryCounters c;
    auto t = Telemetry::Create(ForecastOptionsIn(dir), &clock);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return c;
    RunRhythm(**t, clock, first, 2, phase::kDataWait);
    EXPECT_TRUE((*t)->Flush().ok());
    c = (*t)->Counters();
    EXPECT_TRUE((*t)->Close().ok());
    return c;
  };
  TelemetryCounters c = resume(60);
  EXPECT_EQ(c.previous_steps_learned, 0);
  EXPECT_EQ(c.previous_log_status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.previous_log_status.message().find("'fetch'"), absl::string_view::npos)
      << c.previous_log_status;
  EXPECT_EQ(c.export_errors, 0);
  EXPECT_EQ(ReadStepLog(dir / "steps.jsonl")->steps.size(), 2U);

  std::ofstream(dir / "steps.jsonl") << "not a step log\n";
  c = resume(62);
  EXPECT_EQ(c.previous_steps_learned, 0);
  EXPECT_EQ(c.previous_log_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.previous_log_status.message().find("steps.jsonl.2"), absl::string_view::npos)
      << c.previous_log_status;
  EXPECT_EQ(Read(dir / "steps.jsonl.2"), "not a step log\n");  // left as it was
}

// Steps of 20 µs: while the worker learns, the hooks fill the ring. It
// learns no more of the previous run than a quarter of the ring's steps
// give it time for (at ~100 µs a step): 256 / 4 × 20 µs / 100 µs = 12,
// also where this run's first step compiled for 2 s.
TEST(TelemetryOutputs, AResumedRunOfVeryShortStepsLearnsNoMoreThanTheRingGivesItTimeFor) {
  TempDir dir;
  FakeClock clock;
  const auto run = [&](int64_t first, int n, int64_t* learned) {
    auto t = Telemetry::Create(ForecastOptionsIn(dir), &clock);
    ASSERT_TRUE(t.ok()) << t.status();
    for (int64_t s = first; s < first + n; ++s) {
      ASSERT_TRUE((*t)->BeginStep(s).ok());
      clock.Advance(std::chrono::microseconds(s == 200 ? 2'000'000 : 20));
      ASSERT_TRUE((*t)->EndStep().ok());
    }
    ASSERT_TRUE((*t)->Flush().ok());
    *learned = (*t)->Counters().previous_steps_learned;
    ASSERT_TRUE((*t)->Close().ok());
  };
  int64_t learned = -1;
  run(0, 200, &learned);
  EXPECT_EQ(learned, 0);
  run(200, 1, &learned);
  EXPECT_EQ(learned, 12);
}

}  // namespace
}  // namespace omni
