// The step log and trace across runs of one job: a resumed run keeps the
// earlier run's files, and a trace cut short (no Close) is whole events.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "omni/clock.h"
#include "omni/step_log.h"
#include "omni/telemetry.h"
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

}  // namespace
}  // namespace omni
