#include "omni/phase.h"

#include <gtest/gtest.h>

#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "test_util.h"

namespace omni {
namespace {

using testing::kMs;
using testing::MakeStep;

TEST(PhaseCatalog, HoldsBuiltinPhasesWithStableIds) {
  PhaseCatalog c;
  EXPECT_EQ(c.size(), phase::kNumBuiltin);
  EXPECT_EQ(c.name(phase::kDataWait), "data_wait");
  EXPECT_EQ(c.idle_kind(phase::kDataWait), IdleKind::kDataStall);
  EXPECT_EQ(c.idle_kind(phase::kCompute), IdleKind::kNone);
  EXPECT_EQ(*c.Find("optimizer"), phase::kOptimizer);
}

TEST(PhaseCatalog, RegistersUserPhasesOnceAndRejectsConflicts) {
  PhaseCatalog c;
  auto a = c.Register("attention", IdleKind::kNone);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, phase::kNumBuiltin);
  EXPECT_EQ(*c.Register("attention", IdleKind::kNone), *a);
  auto conflict = c.Register("attention", IdleKind::kHostSide);
  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(conflict.status().message().find("attention"), absl::string_view::npos);
  EXPECT_EQ(c.Register("", IdleKind::kNone).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Register("bad name", IdleKind::kNone).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Find("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(PhaseCatalog, RefusesMoreThanMaxPhases) {
  PhaseCatalog c;
  for (int i = c.size(); i < kMaxPhases; ++i) {
    ASSERT_TRUE(c.Register("p" + std::to_string(i), IdleKind::kNone).ok());
  }
  EXPECT_EQ(c.Register("one_too_many", IdleKind::kNone).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(IdleKind, NamesRoundTrip) {
  for (int i = 0; i < kNumIdleKinds; ++i) {
    const auto k = static_cast<IdleKind>(i);
    EXPECT_EQ(*ParseIdleKind(IdleKindName(k)), k);
  }
  EXPECT_FALSE(ParseIdleKind("sleepy").ok());
}

TEST(StepRecord, KindIsCheckpointThenEvalThenNormal) {
  EXPECT_EQ(MakeStep(0, 0, 10, {{phase::kCompute, 0, 5}}).kind(), StepKind::kNormal);
  EXPECT_EQ(MakeStep(0, 0, 10, {{phase::kEval, 0, 5}}).kind(), StepKind::kEval);
  EXPECT_EQ(MakeStep(0, 0, 10, {{phase::kEval, 0, 5}, {phase::kCheckpoint, 5, 9}}).kind(),
            StepKind::kCheckpoint);
}

TEST(ValidateStepRecord, AcceptsNestedSpans) {
  PhaseCatalog c;
  auto r = MakeStep(
      3, 0, 100, {{phase::kDataWait, 0, 10}, {phase::kEval, 10, 90}, {phase::kCompute, 20, 50, 1}});
  EXPECT_TRUE(ValidateStepRecord(r, c).ok());
}

TEST(ValidateStepRecord, RejectsSpansThatDoNotNestOrLeaveTheStep) {
  PhaseCatalog c;
  auto overlap = MakeStep(1, 0, 100, {{phase::kCompute, 0, 50}, {phase::kOptimizer, 40, 60}});
  EXPECT_EQ(ValidateStepRecord(overlap, c).code(), absl::StatusCode::kInvalidArgument);
  auto outside = MakeStep(1, 0, 100, {{phase::kCompute, 0, 150}});
  EXPECT_NE(ValidateStepRecord(outside, c).message().find("not inside the step"),
            absl::string_view::npos);
  auto orphan = MakeStep(1, 0, 100, {{phase::kCompute, 0, 10}, {phase::kComm, 20, 30, 1}});
  EXPECT_FALSE(ValidateStepRecord(orphan, c).ok());
  auto backwards = MakeStep(1, 0, 100, {});
  backwards.end_ns = backwards.start_ns - 1;
  EXPECT_FALSE(ValidateStepRecord(backwards, c).ok());
  auto unknown = MakeStep(1, 0, 100, {{static_cast<PhaseId>(30), 0, 10}});
  EXPECT_NE(ValidateStepRecord(unknown, c).message().find("unknown phase"),
            absl::string_view::npos);
}

TEST(ValidateStepRecord, ClockReadingsOutsideZeroTo2Pow62AreRefusedNamingThem) {
  // The forecaster adds a horizon and the lengths of steps ahead to a
  // record's clock readings. A record from the int64 minimum to its maximum
  // was accepted, its duration an overflow (and so was the message about a
  // record that ends before it starts: "(1 ns)" for the reverse).
  PhaseCatalog c;
  auto at_limit = MakeStep(1, 0, 100, {});
  at_limit.end_ns = kMaxClockNs;
  EXPECT_TRUE(ValidateStepRecord(at_limit, c).ok());
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (const auto& [start, end] : std::vector<std::pair<int64_t, int64_t>>{
           {kMin, kMax}, {kMax, kMin}, {-1, 100}, {0, kMaxClockNs + 1}, {kMaxClockNs + 1, kMax}}) {
    auto r = MakeStep(7, 0, 100, {});
    r.start_ns = start;
    r.end_ns = end;
    const absl::Status st = ValidateStepRecord(r, c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << start << " " << end;
    EXPECT_NE(st.message().find("step 7: clock reading"), absl::string_view::npos) << st;
    EXPECT_NE(st.message().find("outside [0, 2^62]"), absl::string_view::npos) << st;
  }
}

TEST(ValidateStepRecord, StepNumbersOutsideZeroTo2Pow61AreRefusedNamingThem) {
  // A negative step number was accepted here and refused only later, by
  // the forecaster, as a step "not after the last one (-1)".
  PhaseCatalog c;
  for (const int64_t ok : {int64_t{0}, kMaxStepNumber}) {
    EXPECT_TRUE(ValidateStepRecord(MakeStep(ok, 0, 100, {}), c).ok()) << ok;
  }
  for (const int64_t bad : {std::numeric_limits<int64_t>::min(), int64_t{-150}, int64_t{-1},
                            kMaxStepNumber + 1, std::numeric_limits<int64_t>::max()}) {
    const absl::Status st = ValidateStepRecord(MakeStep(bad, 0, 100, {}), c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find(absl::StrCat("step ", bad, ": step number outside [0, 2^61]")),
              absl::string_view::npos)
        << st;
  }
}

TEST(ForEachIdleInterval, InnermostPhaseDecidesAndUncoveredTimeIsHostSide) {
  PhaseCatalog c;
  // data_wait 0-10, gap 10-12, eval 12-90 with busy compute 20-50 inside, gap 90-100.
  auto r =
      MakeStep(1, 1000, 100,
               {{phase::kDataWait, 0, 10}, {phase::kEval, 12, 90}, {phase::kCompute, 20, 50, 1}});
  std::vector<IdleInterval> got;
  ForEachIdleInterval(r, c, [&](const IdleInterval& iv) { got.push_back(iv); });
  ASSERT_EQ(got.size(), 5u);
  const int64_t base = 1000 * kMs;
  EXPECT_EQ(got[0].kind, IdleKind::kDataStall);
  EXPECT_EQ(got[0].start_ns, base);
  EXPECT_EQ(got[0].end_ns, base + 10 * kMs);
  EXPECT_EQ(got[1].kind, IdleKind::kHostSide);
  EXPECT_EQ(got[1].end_ns - got[1].start_ns, 2 * kMs);
  EXPECT_EQ(got[2].kind, IdleKind::kEval);
  EXPECT_EQ(got[2].end_ns, base + 20 * kMs);
  EXPECT_EQ(got[3].kind, IdleKind::kEval);
  EXPECT_EQ(got[3].start_ns, base + 50 * kMs);
  EXPECT_EQ(got[3].end_ns, base + 90 * kMs);
  EXPECT_EQ(got[4].kind, IdleKind::kHostSide);
  EXPECT_EQ(got[4].end_ns, base + 100 * kMs);
}

TEST(ForEachPhaseWindow, CountsEachStretchAnIdlePhaseIsInnermostAsTheHooksDo) {
  PhaseCatalog c;
  // eval 10-90 with compute 20-50 nested, a nested eval 60-70 (the window stays
  // open), then eval 90-95 right after the first (a new window), data_wait 97-99;
  // uncovered time is no window.
  auto r = MakeStep(1, 0, 100,
                    {{phase::kEval, 10, 90},
                     {phase::kCompute, 20, 50, 1},
                     {phase::kEval, 60, 70, 1},
                     {phase::kEval, 90, 95},
                     {phase::kDataWait, 97, 99}});
  std::vector<PhaseWindow> got;
  ForEachPhaseWindow(r, c, [&](const PhaseWindow& w) { got.push_back(w); });
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].phase, phase::kEval);
  EXPECT_EQ(got[0].ordinal, 0);
  EXPECT_EQ(got[0].start_ns, 10 * kMs);
  EXPECT_EQ(got[0].end_ns, 20 * kMs);
  EXPECT_EQ(got[1].ordinal, 1);
  EXPECT_EQ(got[1].start_ns, 50 * kMs);
  EXPECT_EQ(got[1].end_ns, 90 * kMs);
  EXPECT_EQ(got[2].ordinal, 2);
  EXPECT_EQ(got[2].start_ns, 90 * kMs);
  EXPECT_EQ(got[2].end_ns, 95 * kMs);
  EXPECT_EQ(got[3].phase, phase::kDataWait);
  EXPECT_EQ(got[3].ordinal, 0);
}
}  // namespace
}  // namespace omni
