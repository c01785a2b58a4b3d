// Live notices for the gap between steps: host work a trainer does outside
// BeginStep/EndStep (fetching its batch, logging) is idle time for the
// devices, announced by EndStep and closed by BeginStep once such gaps are
// long enough to matter (omni/window_channel.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "omni/clock.h"
#include "omni/evaluator.h"
#include "omni/forecast.h"
#include "omni/step_log.h"
#include "omni/telemetry.h"
#include "omni/window_channel.h"
#include "runtime/quantile.h"
#include "telemetry_options.h"
#include "unique_channel.h"

namespace omni {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
constexpr int64_t kMs = 1'000'000;

std::string UniqueChannel() { return testing::UniqueChannel("gap-test"); }

TelemetryOptions GapOptions() {
  TelemetryOptions o = testing::FastTelemetryOptions();
  o.window_channel_name = UniqueChannel();
  return o;
}

// One step of `compute` busy time; the worker has learned it on return.
void Step(Telemetry& t, FakeClock& clock, int64_t step, microseconds compute) {
  ASSERT_TRUE(t.BeginStep(step).ok());
  ASSERT_TRUE(t.BeginPhase(phase::kCompute).ok());
  clock.Advance(compute);
  ASSERT_TRUE(t.EndPhase(phase::kCompute).ok());
  ASSERT_TRUE(t.EndStep().ok());
  ASSERT_TRUE(t.Flush().ok());
}

TEST(GapNotice, TheGapBetweenStepsIsAnnouncedAtTheStepEndAndClosedByTheNextBegin) {
  FakeClock clock;
  const TelemetryOptions o = GapOptions();
  auto tel = Telemetry::Create(o, &clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  Telemetry& t = **tel;
  auto reader = WindowChannelReader::Open(o.window_channel_name, &clock);
  ASSERT_TRUE(reader.ok()) << reader.status();

  // 50 ms steps with 20 ms of host work between them.
  std::vector<double> gaps;
  for (int64_t s = 0; s < 80; ++s) {
    if (s > 0) {
      clock.Advance(milliseconds(20));
      gaps.push_back(20.0 * kMs);
    }
    ASSERT_NO_FATAL_FAILURE(Step(t, clock, s, milliseconds(50)));
    auto n = (*reader)->Read();
    ASSERT_TRUE(n.ok()) << n.status();
    if (s < 2) {
      // The worker learns the first gap with step 1's record, after
      // step 1's EndStep.
      EXPECT_EQ(n->state, WindowState::kNone) << "step " << s;
      continue;
    }
    ASSERT_EQ(n->state, WindowState::kOpen) << "step " << s;
    EXPECT_TRUE(n->before_step);
    EXPECT_EQ(n->phase, kBetweenStepsPhase);
    EXPECT_EQ(n->phase_name, "");
    EXPECT_EQ(n->kind, IdleKind::kHostSide);
    EXPECT_EQ(n->step, s + 1) << "the gap before the next step";
    EXPECT_EQ(n->opened_ns, clock.NowNanos());
    if (static_cast<int64_t>(gaps.size()) < o.window_min_samples) {
      EXPECT_EQ(n->remaining_ns, -1) << "too few gaps measured at step " << s;
    } else {
      EXPECT_EQ(n->remaining_ns, RemainingGivenElapsed(ClaimableQuantilesOf(gaps), 0, 0.95));
      if (static_cast<int64_t>(gaps.size()) >= MinWindowSamples(0.95)) {
        EXPECT_EQ(n->remaining_ns, 20 * kMs) << "step " << s;
      }
    }
  }
  // Part of the way into the gap, what is left of it; the forecast's claim
  // for the gap before step 80 is matched to the notice.
  clock.Advance(milliseconds(5));
  auto open = (*reader)->Read();
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ(open->elapsed_ns, 5 * kMs);
  EXPECT_EQ(open->remaining_ns, 15 * kMs);
  EXPECT_GT(open->forecast_guaranteed_ns, 0) << "the forecast's gap window before step 80";
  EXPECT_LE(open->forecast_guaranteed_ns, 20 * kMs);
  const int64_t begin = clock.NowNanos() + 15 * kMs;
  clock.Advance(milliseconds(15));
  ASSERT_TRUE(t.BeginStep(80).ok());
  auto closed = (*reader)->Read();
  ASSERT_TRUE(closed.ok());
  EXPECT_EQ(closed->state, WindowState::kClosed);
  EXPECT_TRUE(closed->before_step);
  EXPECT_EQ(closed->closed_ns, begin);
  EXPECT_EQ(closed->elapsed_ns, 20 * kMs);
  EXPECT_EQ(closed->sequence, open->sequence + 1);
  ASSERT_TRUE(t.EndStep().ok());
  ASSERT_TRUE(t.Close().ok());
}

TEST(GapNotice, GapsShorterThanMinWindowAreNotAnnouncedUntilOneOfTheLastGapsIsLonger) {
  FakeClock clock;
  TelemetryOptions o = GapOptions();
  o.window_channel_name.clear();  // the in-process record
  o.forecast.min_window_ns = kMs;
  o.stats.window = 20;
  auto tel = Telemetry::Create(o, &clock);
  ASSERT_TRUE(tel.ok()) << tel.status();
  Telemetry& t = **tel;
  int64_t s = 0;
  // A tight loop: 0.3 ms between steps writes no notice at all.
  for (; s < 30; ++s) {
    clock.Advance(microseconds(300));
    ASSERT_NO_FATAL_FAILURE(Step(t, clock, s, milliseconds(10)));
    EXPECT_EQ(t.LatestWindow().state, WindowState::kNone) << "step " << s;
  }
  // One 5 ms pause (a log flush): the gaps are announced from then on...
  clock.Advance(milliseconds(5));
  ASSERT_NO_FATAL_FAILURE(Step(t, clock, s++, milliseconds(10)));
  clock.Advance(microseconds(300));
  ASSERT_NO_FATAL_FAILURE(Step(t, clock, s++, milliseconds(10)));
  EXPECT_EQ(t.LatestWindow().state, WindowState::kOpen);
  EXPECT_TRUE(t.LatestWindow().before_step);
  EXPECT_EQ(t.LatestWindow().step, s);
  // ... while it is one of the last stats.window gaps (20), and not after.
  for (int i = 0; i < 18; ++i) {
    clock.Advance(microseconds(300));
    ASSERT_NO_FATAL_FAILURE(Step(t, clock, s++, milliseconds(10)));
    EXPECT_EQ(t.LatestWindow().state, WindowState::kOpen) << "step " << s - 1;
  }
  clock.Advance(microseconds(300));
  ASSERT_NO_FATAL_FAILURE(Step(t, clock, s++, milliseconds(10)));
  const uint64_t last = t.LatestWindow().sequence;
  EXPECT_EQ(t.LatestWindow().state, WindowState::kOpen) << "announced before the worker saw it";
  for (int i = 0; i < 3; ++i) {
    clock.Advance(microseconds(300));
    ASSERT_NO_FATAL_FAILURE(Step(t, clock, s++, milliseconds(10)));
  }
  EXPECT_EQ(t.LatestWindow().state, WindowState::kClosed);
  EXPECT_EQ(t.LatestWindow().sequence, last + 1) << "closed by the next BeginStep, none since";
  ASSERT_TRUE(t.Close().ok());
}

TEST(GapNotice, TheOutlookClaimsAGapBeforeAStepForItsNoticeAndItsJsonKeepsTheClaim) {
  Forecast f;
  f.made_at_ns = 1000 * kMs;
  f.horizon_ns = 1000 * kMs;
  f.last_step = 10;
  f.steps_observed = 10;
  f.confidence = 0.95;
  IdleWindow gap;
  gap.step = 11;
  gap.kind = IdleKind::kHostSide;
  gap.before_step = true;
  gap.earliest_start_ns = gap.latest_start_ns = 1000 * kMs;
  gap.guaranteed_ns = 18 * kMs;
  gap.expected_ns = 20 * kMs;
  IdleWindow host = gap;  // the host phase inside step 11: its own claim
  host.before_step = false;
  host.phase = "host";
  host.guaranteed_ns = 3 * kMs;
  f.windows = {gap, host};
  const PhaseCatalog catalog;
  std::array<int64_t, kNumIdleKinds> seen{};
  seen.fill(-1);
  const WindowOutlook o = OutlookOf(f, 4096, seen, &catalog);
  ASSERT_EQ(o.num_claims, 2);
  EXPECT_EQ(o.GuaranteedFor(11, kBetweenStepsPhase, IdleKind::kHostSide, 0), 18 * kMs);
  EXPECT_EQ(o.GuaranteedFor(11, phase::kHost, IdleKind::kHostSide, 0), 3 * kMs)
      << "a gap before the step does not make its host phase's ordinals ambiguous";

  const std::string json = WindowOutlookToJson(o);
  EXPECT_NE(json.find("\"gap_claims\""), std::string::npos) << json;
  auto back = WindowOutlookFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->GuaranteedFor(11, kBetweenStepsPhase, IdleKind::kHostSide, 0), 18 * kMs);
  EXPECT_EQ(back->GuaranteedFor(11, phase::kHost, IdleKind::kHostSide, 0), 3 * kMs);
  std::string bad = json;
  bad.replace(bad.find("\"guaranteed_ns\":18000000"), 24, "\"guaranteed_ns\":-1");
  auto refused = WindowOutlookFromJson(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("gap_claims[0].guaranteed_ns"), std::string::npos)
      << refused.status();

  WindowNotice n;
  n.state = WindowState::kOpen;
  n.kind = IdleKind::kHostSide;
  n.phase = kBetweenStepsPhase;
  n.before_step = true;
  n.step = 11;
  auto notice = WindowNoticeFromJson(WindowNoticeToJson(n));
  ASSERT_TRUE(notice.ok()) << notice.status();
  EXPECT_TRUE(notice->before_step);
  EXPECT_EQ(notice->phase, kBetweenStepsPhase);
  n.before_step = false;
  n.phase = 0;
  EXPECT_EQ(WindowNoticeToJson(n).find("before_step"), std::string::npos) << "left out when false";
}

// A trainer that fetches its batch outside the hooks (20 ms lognormal gaps
// before 60 ms steps): the replayed notices claim the gaps, and their claims
// hold at the stated confidence.
TEST(GapNotice, TheEvaluatorReplaysTheGapNoticesAndTheirClaimsHold) {
  StepLog log;
  std::mt19937 rng(5);
  std::lognormal_distribution<double> gap_ms(std::log(20.0), 0.3);
  int64_t t = 0;
  for (int64_t s = 0; s < 600; ++s) {
    t += static_cast<int64_t>(gap_ms(rng) * kMs);
    StepRecord r{};
    r.step = s;
    r.start_ns = t;
    t += 60 * kMs;
    r.end_ns = t;
    r.num_spans = 1;
    r.spans[0] = PhaseSpan{r.start_ns, r.end_ns, phase::kCompute, 0};
    log.steps.push_back(r);
  }
  auto report = Evaluate(log, EvaluateOptions{});
  ASSERT_TRUE(report.ok()) << report.status();
  const EvaluationReport::Score& host =
      report->notices.by_kind[static_cast<int>(IdleKind::kHostSide)];
  EXPECT_GT(host.real_ns, 599 * 15 * kMs);
  ASSERT_GT(host.forecast_ns, 0) << "no gap was claimed";
  const double precision =
      static_cast<double>(host.forecast_true_ns) / static_cast<double>(host.forecast_ns);
  const double recall =
      static_cast<double>(host.real_covered_ns) / static_cast<double>(host.real_ns);
  EXPECT_GE(precision, 0.95);
  EXPECT_GE(recall, 0.5);
  EXPECT_GT(report->notices.first_claims, 500);
  EXPECT_GE(static_cast<double>(report->notices.first_claims_held),
            0.95 * static_cast<double>(report->notices.first_claims));
}

}  // namespace
}  // namespace omni
