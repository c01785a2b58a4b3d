// The host's outlook in the window channel: from a forecast to the next
// window of each idle kind (OutlookOf, NoWindowBeforeNs), and a host's
// telemetry writing it with each forecast and each AnnounceBusy into a real
// shared-memory channel that a reader maps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "omni/telemetry.h"
#include "omni/window_channel.h"
#include "unique_channel.h"

namespace omni {
namespace {

using std::chrono::milliseconds;
constexpr int64_t kS = 1'000'000'000;
constexpr int64_t kMs = 1'000'000;

constexpr uint32_t Bit(IdleKind k) { return uint32_t{1} << static_cast<unsigned>(k); }

IdleWindow Window(IdleKind kind, int64_t step, int64_t earliest_ns, int64_t guaranteed_ns) {
  IdleWindow w;
  w.kind = kind;
  w.step = step;
  w.earliest_start_ns = earliest_ns;
  w.latest_start_ns = earliest_ns + 10 * kMs;
  w.start_ns = w.latest_start_ns;
  w.guaranteed_ns = guaranteed_ns;
  w.expected_ns = 2 * guaranteed_ns;
  return w;
}

std::array<int64_t, kNumIdleKinds> NeverSeen() {
  std::array<int64_t, kNumIdleKinds> seen{};
  seen.fill(-1);
  return seen;
}

// A forecast made at 1000 s after step 100, from steps 51..100.
Forecast MadeAt1000s() {
  Forecast f;
  f.made_at_ns = 1000 * kS;
  f.horizon_ns = 300 * kS;
  f.last_step = 100;
  f.steps_observed = 50;
  f.confidence = 0.95;
  f.windows = {Window(IdleKind::kDataStall, 101, 1000 * kS + 100 * kMs, 3 * kMs),
               Window(IdleKind::kDataStall, 102, 1000 * kS + 200 * kMs, 4 * kMs),
               Window(IdleKind::kEval, 150, 1005 * kS, 500 * kMs)};
  return f;
}

TEST(OutlookOf, AKindListedIsNextAKindLearnedButNotListedIsNoneAndOneNotLearnedIsUnknown) {
  std::array<int64_t, kNumIdleKinds> seen = NeverSeen();
  seen[static_cast<size_t>(IdleKind::kDataStall)] = 100;
  seen[static_cast<size_t>(IdleKind::kEval)] = 99;
  seen[static_cast<size_t>(IdleKind::kCheckpoint)] = 51;      // the first step learned from
  seen[static_cast<size_t>(IdleKind::kPipelineBubble)] = 50;  // before the model's history
  const WindowOutlook o = OutlookOf(MadeAt1000s(), 4096, seen);
  EXPECT_EQ(o.state, OutlookState::kForecast);
  EXPECT_EQ(o.made_at_ns, 1000 * kS);
  EXPECT_EQ(o.horizon_ns, 300 * kS);
  EXPECT_EQ(o.covered_until_ns, 1300 * kS);
  EXPECT_EQ(o.last_step, 100);
  EXPECT_DOUBLE_EQ(o.confidence, 0.95);

  const NextIdleWindow& stall = o.next[static_cast<size_t>(IdleKind::kDataStall)];
  EXPECT_EQ(stall.outlook, KindOutlook::kNext);
  EXPECT_EQ(stall.windows, 2);
  EXPECT_EQ(stall.step, 101) << "the first of them";
  EXPECT_EQ(stall.earliest_start_ns, 1000 * kS + 100 * kMs);
  EXPECT_EQ(stall.latest_start_ns, 1000 * kS + 110 * kMs);
  EXPECT_EQ(stall.guaranteed_ns, 3 * kMs);
  EXPECT_EQ(stall.expected_ns, 6 * kMs);
  EXPECT_EQ(stall.last_seen_step, 100);
  const NextIdleWindow& eval = o.next[static_cast<size_t>(IdleKind::kEval)];
  EXPECT_EQ(eval.outlook, KindOutlook::kNext);
  EXPECT_EQ(eval.step, 150);
  EXPECT_EQ(o.next[static_cast<size_t>(IdleKind::kCheckpoint)].outlook, KindOutlook::kNone);
  EXPECT_EQ(o.next[static_cast<size_t>(IdleKind::kPipelineBubble)].outlook, KindOutlook::kUnknown);
  EXPECT_EQ(o.next[static_cast<size_t>(IdleKind::kHostSide)].outlook, KindOutlook::kUnknown);
  EXPECT_EQ(o.next[static_cast<size_t>(IdleKind::kHostSide)].last_seen_step, -1);
}

TEST(OutlookOf, NoWindowBeforeIsTheEarliestNextStartOfTheKindsAndTheEndOfTheHorizonForNone) {
  std::array<int64_t, kNumIdleKinds> seen = NeverSeen();
  seen[static_cast<size_t>(IdleKind::kDataStall)] = 100;
  seen[static_cast<size_t>(IdleKind::kEval)] = 99;
  seen[static_cast<size_t>(IdleKind::kCheckpoint)] = 80;
  WindowOutlook o = OutlookOf(MadeAt1000s(), 4096, seen);
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kDataStall) | Bit(IdleKind::kEval)),
            1000 * kS + 100 * kMs);
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kEval)), 1005 * kS);
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kCheckpoint)), 1300 * kS)
      << "none within the horizon: none before its end";
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kCheckpoint) | Bit(IdleKind::kEval)), 1005 * kS);
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kHostSide)), 0) << "unknown: no statement";
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kHostSide) | Bit(IdleKind::kCheckpoint)), 0)
      << "one kind it knows nothing about makes the whole statement void";
  EXPECT_EQ(o.NoWindowBeforeNs(~uint32_t{0}), 0);

  // An announced busy period wins when it ends later, whatever the kinds.
  o.busy_until_ns = 2000 * kS;
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kDataStall)), 2000 * kS);
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kHostSide)), 2000 * kS);
  o.busy_until_ns = 1002 * kS;
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kEval)), 1005 * kS);
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kDataStall)), 1002 * kS);
}

TEST(OutlookOf, AListCutAtMaxWindowsIsCompleteOnlyUpToTheLastStepItReached) {
  std::array<int64_t, kNumIdleKinds> seen = NeverSeen();
  seen[static_cast<size_t>(IdleKind::kDataStall)] = 100;
  seen[static_cast<size_t>(IdleKind::kCheckpoint)] = 90;
  const WindowOutlook o = OutlookOf(MadeAt1000s(), 3, seen);
  EXPECT_EQ(o.covered_until_ns, 1005 * kS) << "the eval's step 150 was the last one reached";
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kCheckpoint)), 1005 * kS);
}

TEST(OutlookOf, ClaimsTheWindowsALiveNoticeCanBeMatchedToInTheForecastsOrder) {
  PhaseCatalog catalog;
  const absl::StatusOr<PhaseId> prefetch = catalog.Register("prefetch_wait", IdleKind::kDataStall);
  ASSERT_TRUE(prefetch.ok()) << prefetch.status();
  Forecast f = MadeAt1000s();
  f.windows[0].phase = "data_wait";
  f.windows[1].phase = "data_wait";
  f.windows[2].phase = "eval";
  f.windows[2].ordinal = 1;
  // Step 103 waits for data in two phases: the forecast numbers them 0 and
  // 1 by kind, the notices 0 and 0 by phase; neither is claimed.
  f.windows.insert(f.windows.begin() + 2,
                   {Window(IdleKind::kDataStall, 103, 1000 * kS + 300 * kMs, 2 * kMs),
                    Window(IdleKind::kDataStall, 103, 1000 * kS + 310 * kMs, 2 * kMs)});
  f.windows[2].phase = "data_wait";
  f.windows[3].phase = "prefetch_wait";
  f.windows[3].ordinal = 1;
  IdleWindow between = Window(IdleKind::kHostSide, 104, 1000 * kS + 400 * kMs, kMs);
  IdleWindow unknown = Window(IdleKind::kEval, 105, 1000 * kS + 500 * kMs, kMs);
  IdleWindow wrong_kind = Window(IdleKind::kEval, 106, 1000 * kS + 600 * kMs, kMs);
  IdleWindow unclaimed = Window(IdleKind::kDataStall, 107, 1000 * kS + 700 * kMs, 0);
  unknown.phase = "no_such_phase";
  wrong_kind.phase = "data_wait";  // a data-stall phase, not an eval one
  unclaimed.phase = "data_wait";
  f.windows.insert(f.windows.begin() + 4, {between, unknown, wrong_kind, unclaimed});

  const WindowOutlook none = OutlookOf(f, 4096, NeverSeen());
  EXPECT_EQ(none.num_claims, 0) << "no catalog: no phase ids";
  const WindowOutlook o = OutlookOf(f, 4096, NeverSeen(), &catalog);
  ASSERT_EQ(o.num_claims, 3);
  EXPECT_EQ(o.claims[0].step, 101);
  EXPECT_EQ(o.claims[0].phase, phase::kDataWait);
  EXPECT_EQ(o.claims[0].kind, IdleKind::kDataStall);
  EXPECT_EQ(o.claims[0].guaranteed_ns, 3 * kMs);
  EXPECT_EQ(o.claims[1].step, 102);
  EXPECT_EQ(o.claims[2].step, 150);
  EXPECT_EQ(o.claims[2].phase, phase::kEval);
  EXPECT_EQ(o.claims[2].ordinal, 1);
  EXPECT_EQ(o.GuaranteedFor(150, phase::kEval, IdleKind::kEval, 1), 500 * kMs);
  EXPECT_EQ(o.GuaranteedFor(150, phase::kEval, IdleKind::kEval, 0), 0);
  EXPECT_EQ(o.GuaranteedFor(103, phase::kDataWait, IdleKind::kDataStall, 0), 0);
  EXPECT_EQ(o.GuaranteedFor(103, *prefetch, IdleKind::kDataStall, 0), 0);

  // The list is cut at kMaxForecastClaims, keeping the first.
  Forecast many = MadeAt1000s();
  many.windows.clear();
  for (int s = 0; s < kMaxForecastClaims + 10; ++s) {
    many.windows.push_back(Window(IdleKind::kDataStall, 200 + s, 1001 * kS + s * kMs, kMs));
    many.windows.back().phase = "data_wait";
  }
  const WindowOutlook cut = OutlookOf(many, 4096, NeverSeen(), &catalog);
  EXPECT_EQ(cut.num_claims, kMaxForecastClaims);
  EXPECT_EQ(cut.claims[kMaxForecastClaims - 1].step, 200 + kMaxForecastClaims - 1);
  WindowOutlook withdrawn = cut;
  withdrawn.state = OutlookState::kWithdrawn;
  EXPECT_EQ(withdrawn.GuaranteedFor(200, phase::kDataWait, IdleKind::kDataStall, 0), 0);

  // The last ordinal may be a step's 13th eval window as well as its 8th: a
  // notice's ordinal cannot tell which, so it is not claimed.
  Forecast split = MadeAt1000s();
  split.windows.clear();
  for (const int ordinal : {kMaxIdleOrdinals - 2, kMaxIdleOrdinals - 1}) {
    split.windows.push_back(Window(IdleKind::kEval, 300, 1001 * kS + ordinal * kMs, kMs));
    split.windows.back().phase = "eval";
    split.windows.back().ordinal = ordinal;
  }
  const WindowOutlook s = OutlookOf(split, 4096, NeverSeen(), &catalog);
  ASSERT_EQ(s.num_claims, 1);
  EXPECT_EQ(s.claims[0].ordinal, kMaxIdleOrdinals - 2);
}

TEST(OutlookOf, AForecastWithoutAnyWindowIsWithdrawnAndStatesNothing) {
  Forecast f = MadeAt1000s();
  f.windows.clear();  // e.g. suspended after a step far outside its bound
  std::array<int64_t, kNumIdleKinds> seen = NeverSeen();
  seen[static_cast<size_t>(IdleKind::kDataStall)] = 100;
  WindowOutlook o = OutlookOf(f, 4096, seen);
  EXPECT_EQ(o.state, OutlookState::kWithdrawn);
  EXPECT_EQ(o.next[static_cast<size_t>(IdleKind::kDataStall)].last_seen_step, 100);
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kDataStall)), 0);
  o.busy_until_ns = 1100 * kS;
  EXPECT_EQ(o.NoWindowBeforeNs(Bit(IdleKind::kDataStall)), 1100 * kS)
      << "an announced busy period holds without a forecast";
  EXPECT_EQ(WindowOutlook{}.NoWindowBeforeNs(~uint32_t{0}), 0);
}

// ------------------------------------------------ from a host's telemetry

std::string UniqueChannel() { return testing::UniqueChannel("outlook-test"); }

TelemetryOptions HostOptions(int64_t eval_every) {
  TelemetryOptions o;
  o.stats.warmup.max_steps = 0;
  o.stats.warmup.min_steps = 0;
  o.publish_interval_ns = 0;
  o.forecast.horizon_ns = kS;
  o.forecast.eval.every_steps = eval_every;
  o.forecast.eval.offset = eval_every - 1;
  o.window_channel_name = UniqueChannel();
  return o;
}

// A host's telemetry on a fake clock publishing into a real channel, and a
// guest's reader of that channel.
struct HostChannel {
  FakeClock clock;
  std::unique_ptr<Telemetry> tel;
  std::unique_ptr<WindowChannelReader> reader;

  // Fails the test (ASSERT_NO_FATAL_FAILURE) when either cannot be created.
  void Start(int64_t eval_every) {
    const TelemetryOptions o = HostOptions(eval_every);
    auto t = Telemetry::Create(o, &clock);
    ASSERT_TRUE(t.ok()) << t.status();
    tel = *std::move(t);
    auto r = WindowChannelReader::Open(o.window_channel_name, &clock);
    ASSERT_TRUE(r.ok()) << r.status();
    reader = *std::move(r);
  }
};

// Steps of a 5 ms data stall and 20 ms of compute; eval steps add a 30 ms
// eval (the declared rhythm).
void Train(Telemetry& t, FakeClock& clock, int64_t from, int64_t to, int64_t eval_every,
           int64_t compute_ms = 20) {
  for (int64_t s = from; s < to; ++s) {
    ASSERT_TRUE(t.BeginStep(s).ok());
    ASSERT_TRUE(t.BeginPhase(phase::kDataWait).ok());
    clock.Advance(milliseconds(5));
    ASSERT_TRUE(t.EndPhase(phase::kDataWait).ok());
    ASSERT_TRUE(t.BeginPhase(phase::kCompute).ok());
    clock.Advance(milliseconds(compute_ms));
    ASSERT_TRUE(t.EndPhase(phase::kCompute).ok());
    if (s % eval_every == eval_every - 1) {
      ASSERT_TRUE(t.BeginPhase(phase::kEval).ok());
      clock.Advance(milliseconds(30));
      ASSERT_TRUE(t.EndPhase(phase::kEval).ok());
    }
    ASSERT_TRUE(t.EndStep().ok());
  }
  ASSERT_TRUE(t.Flush().ok());
}

TEST(WindowOutlookJson, RoundTripsEveryFieldAndMovesToAnotherClock) {
  std::array<int64_t, kNumIdleKinds> seen = NeverSeen();
  seen[static_cast<size_t>(IdleKind::kDataStall)] = 100;
  seen[static_cast<size_t>(IdleKind::kEval)] = 99;
  seen[static_cast<size_t>(IdleKind::kCheckpoint)] = 60;
  Forecast f = MadeAt1000s();
  for (IdleWindow& w : f.windows) w.phase = w.kind == IdleKind::kEval ? "eval" : "data_wait";
  const PhaseCatalog catalog;
  WindowOutlook o = OutlookOf(f, 4096, seen, &catalog);
  ASSERT_EQ(o.num_claims, 3);
  o.sequence = 12;
  o.busy_until_ns = 1200 * kS;
  o.busy_announced_ns = 1001 * kS;
  o.published_ns = 1002 * kS;
  o.writer_closed = true;
  auto back = WindowOutlookFromJson(WindowOutlookToJson(o));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(WindowOutlookToJson(*back), WindowOutlookToJson(o));
  EXPECT_EQ(back->NoWindowBeforeNs(Bit(IdleKind::kEval)), 1200 * kS);
  const NextIdleWindow& stall = back->next[static_cast<size_t>(IdleKind::kDataStall)];
  EXPECT_EQ(stall.outlook, KindOutlook::kNext);
  EXPECT_EQ(stall.windows, 2);
  EXPECT_EQ(back->next[static_cast<size_t>(IdleKind::kCheckpoint)].outlook, KindOutlook::kNone);
  EXPECT_EQ(back->num_claims, 3);
  EXPECT_EQ(back->GuaranteedFor(150, phase::kEval, IdleKind::kEval, 0), 500 * kMs);
  // A version-1 copy (an older writer's: no claims) still reads.
  std::string v1 = WindowOutlookToJson(o);
  v1.replace(v1.find("\"version\":2"), 11, "\"version\":1");
  v1.erase(v1.find(",\"claims\":"),
           v1.find("]", v1.find(",\"claims\":")) + 1 - v1.find(",\"claims\":"));
  auto old = WindowOutlookFromJson(v1);
  ASSERT_TRUE(old.ok()) << old.status() << " " << v1;
  EXPECT_EQ(old->num_claims, 0);
  EXPECT_EQ(old->next[static_cast<size_t>(IdleKind::kDataStall)].windows, 2);
  // On a clock 1000 s behind: every time moves, the rest stays.
  const WindowOutlook moved = back->ShiftedBy(-1000 * kS);
  EXPECT_EQ(moved.made_at_ns, 0);
  EXPECT_EQ(moved.busy_until_ns, 200 * kS);
  EXPECT_EQ(moved.published_ns, 2 * kS);
  EXPECT_EQ(moved.next[static_cast<size_t>(IdleKind::kDataStall)].earliest_start_ns, 100 * kMs);
  EXPECT_EQ(moved.next[static_cast<size_t>(IdleKind::kDataStall)].guaranteed_ns, 3 * kMs);
  EXPECT_EQ(moved.next[static_cast<size_t>(IdleKind::kCheckpoint)].earliest_start_ns, 0)
      << "a kind with no next window has no start to move";
}

TEST(WindowOutlookJson, MalformedInputGetsAnErrorNamingTheField) {
  Forecast f = MadeAt1000s();
  for (IdleWindow& w : f.windows) w.phase = w.kind == IdleKind::kEval ? "eval" : "data_wait";
  const PhaseCatalog catalog;
  const std::string good = WindowOutlookToJson(OutlookOf(f, 4096, NeverSeen(), &catalog));
  EXPECT_EQ(WindowOutlookFromJson("[1]").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WindowOutlookFromJson("{\"schema\": \"omni.window\"}").status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::string newer = good;
  newer.replace(newer.find("\"version\":2"), 11, "\"version\":3");
  EXPECT_EQ(WindowOutlookFromJson(newer).status().code(), absl::StatusCode::kFailedPrecondition);
  for (const auto& [from, to, field] :
       {std::tuple<std::string, std::string, std::string>{"\"state\":\"forecast\"",
                                                          "\"state\":\"maybe\"", "state"},
        {"\"horizon_ns\":", "\"horizon_ns\":-", "horizon_ns"},
        {"\"confidence\":0.95", "\"confidence\":\"high\"", "confidence"},
        {"\"windows\":2", "\"windows\":\"two\"", "kinds.data_stall.windows"},
        {"\"claims\":[", "\"claims\":[7,", "claims[0]"},
        {"\"ordinal\":0", "\"ordinal\":-1", "claims[0].ordinal"},
        {"\"phase\":0", "\"phase\":99", "claims[0].phase"},
        {"\"guaranteed_ns\":3000000,\"kind\":\"data_stall\"",
         "\"guaranteed_ns\":-3,\"kind\":\"data_stall\"", "claims[0].guaranteed_ns"},
        {"\"claims\":", "\"claimz\":", "claims"}}) {
    std::string bad = good;
    const size_t at = bad.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << good;
    bad.replace(at, from.size(), to);
    auto r = WindowOutlookFromJson(bad);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  }
  // A newer writer's idle kind is skipped.
  std::string extra = good;
  extra.replace(extra.find("\"kinds\":{"), 9, "\"kinds\":{\"npu_swap\":{},");
  EXPECT_TRUE(WindowOutlookFromJson(extra).ok()) << extra;
}

// Found while writing the outlook's reader: a field of another JSON type than
// the schema's (a string where a number goes) made json::value throw
// through the readers of the forecast and the notice, which promise a
// Status (a store value is anybody's input).
TEST(WindowOutlookJson, EveryJsonReaderAnswersAMistypedFieldWithAnErrorNotAnException) {
  EXPECT_EQ(ForecastFromJson("{\"schema\": 5}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WindowNoticeFromJson("{\"schema\": [1]}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WindowOutlookFromJson("{\"schema\": {}}").status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string forecast = ForecastToJson(MadeAt1000s());
  std::string bad = forecast;
  bad.replace(bad.find("\"confidence\":"), 13, "\"confidence\":\"x\",\"c\":");
  auto r = ForecastFromJson(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
}

TEST(WindowOutlook, AHostsChannelCarriesItsLatestForecastsNextWindowOfEachKind) {
  HostChannel h;
  ASSERT_NO_FATAL_FAILURE(h.Start(10));
  FakeClock& clock = h.clock;
  auto before = h.reader->ReadOutlook();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->state, OutlookState::kNone);
  EXPECT_EQ(before->sequence, 0u);
  EXPECT_EQ(before->next[static_cast<size_t>(IdleKind::kDataStall)].last_seen_step, -1);
  EXPECT_EQ(before->NoWindowBeforeNs(~uint32_t{0}), 0);

  Train(*h.tel, clock, 0, 25, 10);  // evals in steps 9 and 19
  auto f = h.tel->LatestForecast();
  ASSERT_TRUE(f.ok()) << f.status();
  auto out = h.reader->ReadOutlook();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->state, OutlookState::kForecast);
  EXPECT_GT(out->sequence, 0u);
  EXPECT_EQ(out->made_at_ns, f->made_at_ns);
  EXPECT_EQ(out->horizon_ns, kS);
  EXPECT_EQ(out->covered_until_ns, f->made_at_ns + kS);
  EXPECT_EQ(out->last_step, 24);
  EXPECT_DOUBLE_EQ(out->confidence, f->confidence);
  for (const IdleKind k : {IdleKind::kDataStall, IdleKind::kEval}) {
    // The first of the forecast's windows of the kind.
    int64_t earliest = std::numeric_limits<int64_t>::max(), step = -1, count = 0;
    for (const IdleWindow& w : f->windows) {
      if (w.kind != k) continue;
      ++count;
      if (w.earliest_start_ns < earliest) {
        earliest = w.earliest_start_ns;
        step = w.step;
      }
    }
    const NextIdleWindow& n = out->next[static_cast<size_t>(k)];
    ASSERT_GT(count, 0) << IdleKindName(k) << " windows in the forecast";
    EXPECT_EQ(n.outlook, KindOutlook::kNext) << IdleKindName(k);
    EXPECT_EQ(n.windows, count) << IdleKindName(k);
    EXPECT_EQ(n.earliest_start_ns, earliest) << IdleKindName(k);
    EXPECT_EQ(n.step, step) << IdleKindName(k);
    EXPECT_EQ(out->NoWindowBeforeNs(Bit(k)), earliest) << IdleKindName(k);
  }
  EXPECT_EQ(out->next[static_cast<size_t>(IdleKind::kEval)].step, 29) << "the next declared eval";
  EXPECT_EQ(out->next[static_cast<size_t>(IdleKind::kEval)].last_seen_step, 19);
  EXPECT_EQ(out->next[static_cast<size_t>(IdleKind::kDataStall)].last_seen_step, 24);
  EXPECT_EQ(out->next[static_cast<size_t>(IdleKind::kCheckpoint)].outlook, KindOutlook::kUnknown)
      << "never seen";
  EXPECT_EQ(out->NoWindowBeforeNs(Bit(IdleKind::kEval) | Bit(IdleKind::kCheckpoint)), 0);
  EXPECT_EQ(h.tel->LatestOutlook().made_at_ns, out->made_at_ns);
  ASSERT_TRUE(h.tel->Close().ok());
  auto closed = h.reader->ReadOutlook();
  ASSERT_TRUE(closed.ok());
  EXPECT_TRUE(closed->writer_closed);
}

TEST(WindowOutlook, EvalsFartherApartThanTheHorizonAreNoneBeforeItsEnd) {
  // 80 steps of >= 25 ms: 2 s > the 1 s horizon
  HostChannel h;
  ASSERT_NO_FATAL_FAILURE(h.Start(80));
  FakeClock& clock = h.clock;
  Train(*h.tel, clock, 0, 79, 80);
  auto out = h.reader->ReadOutlook();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->next[static_cast<size_t>(IdleKind::kEval)].outlook, KindOutlook::kUnknown)
      << "no eval measured yet: its absence means nothing";
  EXPECT_EQ(out->NoWindowBeforeNs(Bit(IdleKind::kEval)), 0);

  Train(*h.tel, clock, 79, 85, 80);  // the eval in step 79
  out = h.reader->ReadOutlook();
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->state, OutlookState::kForecast);
  const NextIdleWindow& eval = out->next[static_cast<size_t>(IdleKind::kEval)];
  EXPECT_EQ(eval.outlook, KindOutlook::kNone);
  EXPECT_EQ(eval.last_seen_step, 79);
  EXPECT_EQ(out->NoWindowBeforeNs(Bit(IdleKind::kEval)), out->made_at_ns + kS);
  EXPECT_LT(out->NoWindowBeforeNs(Bit(IdleKind::kEval) | Bit(IdleKind::kDataStall)),
            out->made_at_ns + 30 * kMs)
      << "the next step's data stall";
  ASSERT_TRUE(h.tel->Close().ok());
}

TEST(WindowOutlook, AnAnnouncedBusyPeriodReachesTheChannelAtOnceAndOutlivesNewForecasts) {
  HostChannel h;
  ASSERT_NO_FATAL_FAILURE(h.Start(10));
  FakeClock& clock = h.clock;
  Telemetry& t = *h.tel;

  const int64_t until = clock.NowNanos() + 60 * kS;
  ASSERT_TRUE(t.AnnounceBusy(until).ok());
  auto out = h.reader->ReadOutlook();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->state, OutlookState::kNone) << "no forecast yet";
  EXPECT_EQ(out->busy_until_ns, until);
  EXPECT_EQ(out->busy_announced_ns, clock.NowNanos());
  EXPECT_EQ(out->NoWindowBeforeNs(Bit(IdleKind::kDataStall)), until);
  EXPECT_EQ(t.LatestOutlook().busy_until_ns, until);

  Train(t, clock, 0, 12, 10);
  out = h.reader->ReadOutlook();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->state, OutlookState::kForecast);
  EXPECT_EQ(out->busy_until_ns, until) << "a new forecast keeps the announcement";
  EXPECT_EQ(out->NoWindowBeforeNs(Bit(IdleKind::kDataStall)), until);

  ASSERT_TRUE(t.AnnounceBusy(0).ok());  // withdrawn
  const uint64_t seq = out->sequence;
  out = h.reader->ReadOutlook();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->sequence, seq + 1);
  EXPECT_EQ(out->busy_until_ns, 0);
  EXPECT_EQ(out->NoWindowBeforeNs(Bit(IdleKind::kDataStall)),
            out->next[static_cast<size_t>(IdleKind::kDataStall)].earliest_start_ns);

  const absl::Status bad = t.AnnounceBusy(-5);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("until_ns"), absl::string_view::npos) << bad;
  ASSERT_TRUE(t.Close().ok());
  EXPECT_EQ(t.AnnounceBusy(until).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(WindowOutlook, WhileTheHostHasNoForecastTheOutlookIsWithdrawn) {
  HostChannel h;
  ASSERT_NO_FATAL_FAILURE(h.Start(1000));
  FakeClock& clock = h.clock;
  Train(*h.tel, clock, 0, 30, 1000);
  ASSERT_TRUE(h.tel->LatestForecast().ok());
  // Steps 8x as long: a new regime, which has no forecast until it has
  // enough steps. After each step the outlook says what the host has.
  int withdrawn = 0;
  for (int64_t s = 30; s < 60; ++s) {
    Train(*h.tel, clock, s, s + 1, 1000, /*compute_ms=*/200);
    auto out = h.reader->ReadOutlook();
    ASSERT_TRUE(out.ok());
    // A forecast without any window (suspended after a step far outside its
    // bound) states nothing either.
    auto f = h.tel->LatestForecast();
    const bool has = f.ok() && !f->windows.empty();
    EXPECT_EQ(out->state, has ? OutlookState::kForecast : OutlookState::kWithdrawn) << "step " << s;
    if (!has) {
      ++withdrawn;
      EXPECT_EQ(out->NoWindowBeforeNs(~uint32_t{0}), 0);
    }
  }
  EXPECT_GT(withdrawn, 0) << "the regime change left the host without a forecast for a while";
  EXPECT_EQ(h.reader->ReadOutlook()->state, OutlookState::kForecast) << "and it came back";
  ASSERT_TRUE(h.tel->Close().ok());
}

}  // namespace
}  // namespace omni
