// Duration quantiles, the conditional remaining duration of an open window,
// the scale of the forecast claims a notice is matched to, and the notice's
// JSON form.
#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "json_read.h"
#include "omni/window_channel.h"
#include "quantile.h"

namespace omni {

using nlohmann::json;

namespace {

// RunBelowEverythingBefore: the fewest values before a run for the run to
// mean a new level (exchangeable values put the last one below all of 20
// before it one time in 21, the last two one time in 231), and the values a
// new level needs before it is claimed from.
constexpr size_t kMinBefore = 20;
constexpr size_t kMinNewLevel = 3;
constexpr double kDropMargin = 0.25;  // below all before by a quarter of their least

// The finite, non-negative durations of `values`, sorted.
std::vector<double> SortedDurations(std::vector<double> values) {
  values.erase(std::remove_if(values.begin(), values.end(),
                              [](double v) { return !std::isfinite(v) || v < 0; }),
               values.end());
  std::sort(values.begin(), values.end());
  return values;
}

DurationQuantiles QuantilesOfSorted(const std::vector<double>& values) {
  DurationQuantiles q;
  if (values.empty()) return q;
  q.samples = static_cast<int64_t>(values.size());
  const double last = static_cast<double>(values.size() - 1);
  for (int i = 0; i < kDurationQuantiles; ++i) {
    const double pos = last * i / (kDurationQuantiles - 1);
    const auto lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, values.size() - 1);
    const double frac = pos - static_cast<double>(lo);
    q.ns[static_cast<size_t>(i)] = values[lo] + frac * (values[hi] - values[lo]);
  }
  return q;
}

// The values from their latest level on (LevelShiftStart) where the values
// before it all stand above it, farther than kLevelShiftSds of its standard
// deviation (at least kLevelNoise of its mean) from its longest, and it has
// 3 values at least; else all of them. A first eval that compiled its
// kernels, and ran 5x the later ones, no longer keeps the claims of the next
// windows at 0 (its length in the small-sample bound's spread) nor their
// remaining durations long (in the upper quantiles). A level above the
// values before it keeps them: two long windows in a row are what a heavy
// tail shows too, and claims drawn from them alone would not hold.
std::vector<double> LatestLevelIfFarBelow(std::vector<double> values) {
  const size_t start = LevelShiftStart(values);
  if (start == 0 || values.size() - start < 3) return values;
  const auto split = values.begin() + static_cast<std::ptrdiff_t>(start);
  const auto n = static_cast<double>(values.size() - start);
  double sum = 0, sq = 0;
  for (auto it = split; it != values.end(); ++it) sum += *it;
  const double mean = sum / n;
  for (auto it = split; it != values.end(); ++it) sq += (*it - mean) * (*it - mean);
  const double sd = std::max(std::sqrt(sq / (n - 1)), kLevelNoise * std::abs(mean));
  const double gap =
      *std::min_element(values.begin(), split) - *std::max_element(split, values.end());
  if (gap > kLevelShiftSds * sd) values.erase(values.begin(), split);
  return values;
}

// How many of the last values (0 to `values.size()` − kMinBefore) lie below
// every value before them, where at least kMinBefore come before them.
size_t RunBelowEverythingBefore(const std::vector<double>& values) {
  const size_t n = values.size();
  if (n <= kMinBefore) return 0;
  std::vector<double> prefix_min(values);  // prefix_min[i]: the least of values[0..i]
  for (size_t i = 1; i < n; ++i) prefix_min[i] = std::min(prefix_min[i - 1], values[i]);
  size_t run = 0;
  double run_max = -std::numeric_limits<double>::infinity();
  for (size_t m = 1; m + kMinBefore <= n; ++m) {
    run_max = std::max(run_max, values[n - m]);
    if (run_max < (1 - kDropMargin) * prefix_min[n - m - 1]) run = m;
  }
  return run;
}

}  // namespace

DurationQuantiles QuantilesOf(std::vector<double> values) {
  return QuantilesOfSorted(SortedDurations(std::move(values)));
}

DurationQuantiles ClaimableQuantilesOf(std::vector<double> values) {
  const size_t below = RunBelowEverythingBefore(values);
  if (below > 0 && below < kMinNewLevel) {
    // The last one or two windows were shorter than all of the many before
    // them: what comes next may be their level, which nothing measured
    // shows yet. No claim (every level at 0) until kMinNewLevel of them.
    DurationQuantiles none;
    none.samples = static_cast<int64_t>(values.size());
    return none;
  }
  if (below >= kMinNewLevel)
    values.erase(values.begin(), values.end() - static_cast<std::ptrdiff_t>(below));
  values = LatestLevelIfFarBelow(std::move(values));
  values = SortedDurations(std::move(values));
  DurationQuantiles q = QuantilesOfSorted(values);
  if (q.samples == 0) return q;
  const auto n = static_cast<double>(values.size());
  double sum = 0;
  for (const double x : values) sum += x;
  const double mean = sum / n;
  const double median = QuantileSorted(values, 0.5);
  double sq = 0;
  for (const double x : values) sq += (x - mean) * (x - mean);
  const double sd = std::max(n > 1 ? std::sqrt(sq / (n - 1)) : 0.0, n < 5 ? 0.05 * mean : 0.0);
  const double centre = std::min(mean, median);
  constexpr int kLast = kDurationQuantiles - 1;
  for (int i = kLast / 2; i >= 0; --i) {
    // Level 0 stands for half a grid step (the support's end is not a level).
    const double p = i == 0 ? 0.5 / kLast : static_cast<double>(i) / kLast;
    const auto k = static_cast<size_t>(std::floor(p * (n + 1) + 1e-9));
    const double bound = k >= 1
                             ? values[k - 1]
                             : std::max(0.0, centre - SmallSampleFactor(TwoSidedZ(1 - 2 * p), n) *
                                                          sd * std::sqrt(1 + 1 / n));
    auto& at = q.ns[static_cast<size_t>(i)];
    at = std::min({at, bound, q.ns[static_cast<size_t>(i) + 1]});
  }
  return q;
}

// Outcomes are factors in [0, ∞); scaled by kFactorScale they go through
// the duration quantiles' integer claim without losing precision.
constexpr double kFactorScale = 1e6;

namespace {

// The factor recorded outcomes vouch for at confidence c, in [0, 1].
double FactorOf(std::vector<double> outcomes, double c) {
  const int64_t f = RemainingGivenElapsed(ClaimableQuantilesOf(std::move(outcomes)), 0, c);
  return std::clamp(static_cast<double>(f) / kFactorScale, 0.0, 1.0);
}

}  // namespace

ForecastClaimScale::ForecastClaimScale(int window, int min_samples, double confidence)
    : min_samples_(std::max(min_samples, 1)),
      confidence_(confidence),
      outcomes_(static_cast<size_t>(kNoticePhases) * kMaxWindowOrdinals,
                RollingWindow(std::max(window, 1))),
      levels_(outcomes_.size(), RollingWindow(std::max(window, 1))),
      level_factors_(outcomes_.size()),
      factor_(outcomes_.size(), 0.0),
      factor_confidence_(outcomes_.size(), 0.0),
      stale_(outcomes_.size(), 0) {}

size_t ForecastClaimScale::Slot(PhaseId phase, int ordinal) const {
  if (phase >= kNoticePhases || ordinal < 0) return outcomes_.size();
  return NoticeTableIndex(phase, ordinal);
}

void ForecastClaimScale::Record(PhaseId phase, int ordinal, int64_t duration_ns, int64_t table_ns,
                                int64_t guaranteed_ns) {
  const size_t slot = Slot(phase, ordinal);
  if (slot >= outcomes_.size() || guaranteed_ns <= 0) return;
  RollingWindow& w = outcomes_[slot];
  const double outcome = table_ns > duration_ns ? 0.0
                                                : static_cast<double>(duration_ns) /
                                                      static_cast<double>(guaranteed_ns);
  w.Add(outcome * kFactorScale);
  levels_[slot].Add(Level(guaranteed_ns));
  stale_[slot] = 1;
  level_factors_[slot].clear();
}

double ForecastClaimScale::Factor(PhaseId phase, int ordinal, double confidence) const {
  const size_t slot = Slot(phase, ordinal);
  if (slot >= factor_.size()) return 0.0;
  const double c = std::max(confidence_, confidence);
  if (stale_[slot] != 0 || factor_confidence_[slot] != c) {
    stale_[slot] = 0;
    factor_confidence_[slot] = c;
    const RollingWindow& w = outcomes_[slot];
    factor_[slot] = w.size() < min_samples_ ? 0.0 : FactorOf(w.Values(), c);
  }
  return factor_[slot];
}

double ForecastClaimScale::Level(int64_t guaranteed_ns) {
  return std::floor(std::log2(static_cast<double>(std::max<int64_t>(guaranteed_ns, 1))));
}

double ForecastClaimScale::FactorAt(PhaseId phase, int ordinal, int64_t guaranteed_ns,
                                    double confidence) const {
  const size_t slot = Slot(phase, ordinal);
  if (slot >= outcomes_.size()) return 0.0;
  const double c = std::max(confidence_, confidence);
  const double level = Level(guaranteed_ns);
  std::vector<LevelFactor>& memo = level_factors_[slot];
  for (const LevelFactor& m : memo) {
    if (m.level == level && m.confidence == c) return m.factor;
  }
  const std::vector<double> levels = levels_[slot].Values();
  const std::vector<double> outcomes = outcomes_[slot].Values();
  std::vector<double> same;
  for (size_t i = 0; i < levels.size(); ++i) {
    if (levels[i] == level) same.push_back(outcomes[i]);
  }
  const double f = static_cast<int64_t>(same.size()) >= MinWindowSamples(c)
                       ? FactorOf(std::move(same), c)
                       : Factor(phase, ordinal, c);
  memo.push_back({level, c, f});
  return f;
}

int64_t ForecastClaimScale::Scaled(PhaseId phase, int ordinal, int64_t guaranteed_ns,
                                   double confidence) const {
  return static_cast<int64_t>(std::floor(static_cast<double>(guaranteed_ns) *
                                         FactorAt(phase, ordinal, guaranteed_ns, confidence)));
}

NoticeClaimLevel::NoticeClaimLevel(double confidence, double gain)
    : target_(1.0 - std::clamp(confidence, 0.0, 1.0)),
      gain_(gain),
      miss_rate_(static_cast<size_t>(kNoticePhases) * kMaxWindowOrdinals, target_) {}

void NoticeClaimLevel::Record(PhaseId phase, int ordinal, bool held) {
  if (phase >= kNoticePhases || ordinal < 0) return;
  double& a = miss_rate_[NoticeTableIndex(phase, ordinal)];
  a = std::clamp(a + gain_ * (target_ - (held ? 0.0 : 1.0)), 0.0, target_);
}

double NoticeClaimLevel::Confidence(PhaseId phase, int ordinal) const {
  if (phase >= kNoticePhases || ordinal < 0) return 1.0 - target_;
  return 1.0 - miss_rate_[NoticeTableIndex(phase, ordinal)];
}

int64_t RemainingGivenElapsed(const DurationQuantiles& q, int64_t elapsed_ns, double confidence) {
  if (q.samples <= 0) return -1;
  constexpr int kLast = kDurationQuantiles - 1;
  const auto e = static_cast<double>(std::max<int64_t>(0, elapsed_ns));
  if (e >= q.ns[kLast]) return 0;
  // Conservative on the grid, so that the claim holds for the measured
  // durations themselves: F(e) ≥ i/kLast for the last grid point ns[i] ≤ e,
  // hence S(e) ≤ s_up = 1 − i/kLast; the answer is the last grid point ns[j]
  // with S(ns[j]) ≥ c·s_up, i.e. j = floor((1 − c·s_up)·kLast).
  const auto it = std::upper_bound(q.ns.begin(), q.ns.end(), e);
  int i = static_cast<int>(it - q.ns.begin()) - 1;  // -1 when e < ns[0]
  // A grid point at 0 is a lower tail no measured window vouches for
  // (ClaimableQuantilesOf), not mass the window has outlived.
  if (i >= 0 && q.ns[static_cast<size_t>(i)] <= 0) i = -1;
  const double s_up = i < 0 ? 1.0 : 1.0 - static_cast<double>(i) / kLast;
  // The claim at the open at the table's claim confidence (NoticeClaimLevel
  // raises it while the claims at the open held less often than stated);
  // the claims conditional on e at no more than half the stated miss rate
  // below it, so that a table whose claims at the open are held back still
  // claims as the window goes on.
  const double c = std::clamp(confidence, 0.0, 1.0);
  const double c_open = std::clamp(std::max(c, q.claim_confidence), 0.0, 1.0);
  const double c_then = std::max(c, std::min(c_open, 1.0 - (1.0 - c) / 2));
  const auto j0 = static_cast<int>(std::floor((1.0 - c_open) * kLast + 1e-9));
  const double open = q.ns[static_cast<size_t>(std::clamp(j0, 0, kLast))];
  const auto j = static_cast<int>(std::floor((1.0 - c_then * s_up) * kLast + 1e-9));
  double end = i < 0 ? open : std::max(open, q.ns[static_cast<size_t>(std::clamp(j, 0, kLast))]);
  // Beyond the claim at the open (which stands however long the window
  // lasted: P(D ≥ x | D > e) ≥ P(D ≥ x)), the windows that outlived e
  // vouch for the time up to the shortest of them in proportion to their
  // number m: a new window stops short of it with probability up to
  // 1/(m + 1), and the time claimed then is lost whole. Fewer than
  // c/(1 − c) of them (19 at 0.95; counted conservatively on the grid: at
  // least those from sorted position ceil((n − 1)(i + 1)/kLast) on are
  // longer than e) vouch for at most (1 − c)/c · e more: a reader that
  // reads again is told of the time after that as it comes, so the time it
  // is told of past the close is at most (1 − c)/c of the window's length
  // and it was idle for at least c of the time claimed, however far apart
  // the few measured lengths lie. Uncapped, a window that had outlived the
  // short ones measured was claimed to last as long as the next longer one:
  // host-side pauses of 11-272 ms, 33 of them measured, were idle for 0.91
  // of the time claimed, a demo's evals (longer while the model was
  // untrained) for 0.92.
  if (end > open && c > 0 && c < 1) {
    const auto n = static_cast<double>(q.samples);
    const double outlived = n - std::ceil((n - 1) * (i + 1) / kLast - 1e-9);
    if (outlived < c / (1 - c) - 1e-9) end = std::max(open, std::min(end, e + e * (1 - c) / c));
  }
  return std::max<int64_t>(0, static_cast<int64_t>(std::floor(end - e)));
}

int64_t NoClaimUntil(const DurationQuantiles& q, int64_t elapsed_ns, double confidence) {
  if (q.samples <= 0) return std::numeric_limits<int64_t>::max();
  const auto e = static_cast<double>(std::max<int64_t>(0, elapsed_ns));
  // RemainingGivenElapsed's cap e·(1 − c)/c grows within a grid interval:
  // while it is under a nanosecond, a claim of 0 may be one later on.
  const double c = std::clamp(confidence, 0.0, 1.0);
  if (c > 0 && c < 1 && e * (1 - c) < c) return elapsed_ns + 1;
  const auto it = std::upper_bound(q.ns.begin(), q.ns.end(), e);
  if (it == q.ns.end() || *it >= static_cast<double>(kMaxClockNs)) {
    return std::numeric_limits<int64_t>::max();
  }
  return std::max(elapsed_ns + 1, static_cast<int64_t>(std::ceil(*it)));
}

std::string WindowNoticeToJson(const WindowNotice& n) {
  json j;
  j["schema"] = "omni.window";
  j["version"] = 1;
  j["clock"] = "CLOCK_MONOTONIC";
  j["sequence"] = n.sequence;
  j["state"] = WindowStateName(n.state);
  j["phase"] = n.phase_name;
  j["kind"] = IdleKindName(n.kind);
  j["step"] = n.step;
  j["ordinal"] = n.ordinal;
  if (n.before_step) j["before_step"] = true;  // added within version 1
  j["opened_ns"] = n.opened_ns;
  j["closed_ns"] = n.closed_ns;
  j["read_at_ns"] = n.read_at_ns;
  j["elapsed_ns"] = n.elapsed_ns;
  j["confidence"] = n.confidence;
  j["remaining_ns"] = n.remaining_ns;
  j["remaining_median_ns"] = n.remaining_median_ns;
  j["phase_samples"] = n.phase_samples;
  j["forecast_guaranteed_ns"] = n.forecast_guaranteed_ns;
  j["writer_closed"] = n.writer_closed;
  return j.dump();
}

namespace {

absl::StatusOr<WindowNotice> ParseWindowNotice(const std::string& text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("window notice: not a JSON object");
  }
  if (j.value("schema", "") != "omni.window") {
    return absl::FailedPreconditionError("window notice: schema is not 'omni.window'");
  }
  const auto need = [&](const char* key, json::value_t type) -> absl::StatusOr<const json*> {
    auto it = j.find(key);
    const bool ok =
        it != j.end() &&
        (it->type() == type || (type == json::value_t::number_integer && it->is_number_integer()) ||
         (type == json::value_t::number_float && it->is_number()));
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("window notice: field '", key, "' missing or of the wrong type"));
    }
    return &*it;
  };
  const auto integer = [&](const char* key, int64_t& out) -> absl::Status {
    auto v = need(key, json::value_t::number_integer);
    if (!v.ok()) return v.status();
    out = (*v)->get<int64_t>();
    return absl::OkStatus();
  };
  int64_t version = 0;
  if (auto st = integer("version", version); !st.ok()) return st;
  if (version != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("window notice: version ", version, "; this reader reads version 1"));
  }
  WindowNotice n;
  int64_t seq = 0;
  for (auto [key, out] : {std::pair<const char*, int64_t*>{"sequence", &seq},
                          {"step", &n.step},
                          {"opened_ns", &n.opened_ns},
                          {"closed_ns", &n.closed_ns},
                          {"read_at_ns", &n.read_at_ns},
                          {"elapsed_ns", &n.elapsed_ns},
                          {"remaining_ns", &n.remaining_ns},
                          {"remaining_median_ns", &n.remaining_median_ns},
                          {"phase_samples", &n.phase_samples}}) {
    if (auto st = integer(key, *out); !st.ok()) return st;
  }
  n.sequence = static_cast<uint64_t>(seq);
  if (j.contains("ordinal")) {  // added after the first notices of version 1
    int64_t ordinal = 0;
    if (auto st = integer("ordinal", ordinal); !st.ok()) return st;
    if (ordinal < 0 || ordinal > (1 << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("window notice: field 'ordinal' out of range: ", ordinal));
    }
    n.ordinal = static_cast<int>(ordinal);
  }
  if (j.contains("forecast_guaranteed_ns")) {  // added within version 1 too
    if (auto st = integer("forecast_guaranteed_ns", n.forecast_guaranteed_ns); !st.ok()) return st;
    if (n.forecast_guaranteed_ns < 0) {
      return absl::InvalidArgumentError(
          "window notice: field 'forecast_guaranteed_ns' is negative");
    }
  }
  auto conf = need("confidence", json::value_t::number_float);
  if (!conf.ok()) return conf.status();
  n.confidence = (*conf)->get<double>();
  auto state = need("state", json::value_t::string);
  if (!state.ok()) return state.status();
  const auto s = (*state)->get<std::string>();
  if (s == "open") {
    n.state = WindowState::kOpen;
  } else if (s == "closed") {
    n.state = WindowState::kClosed;
  } else if (s == "none") {
    n.state = WindowState::kNone;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("window notice: unknown state '", s, "'"));
  }
  auto kind = need("kind", json::value_t::string);
  if (!kind.ok()) return kind.status();
  auto k = ParseIdleKind((*kind)->get<std::string>());
  if (!k.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("window notice: field 'kind': ", k.status().message()));
  }
  n.kind = *k;
  auto phase = need("phase", json::value_t::string);
  if (!phase.ok()) return phase.status();
  n.phase_name = (*phase)->get<std::string>();
  if (j.contains("before_step")) {  // added within version 1 too
    auto before = need("before_step", json::value_t::boolean);
    if (!before.ok()) return before.status();
    n.before_step = (*before)->get<bool>();
    if (n.before_step) n.phase = kBetweenStepsPhase;
  }
  auto closed = need("writer_closed", json::value_t::boolean);
  if (!closed.ok()) return closed.status();
  n.writer_closed = (*closed)->get<bool>();
  return n;
}

}  // namespace

absl::StatusOr<WindowNotice> WindowNoticeFromJson(const std::string& text) {
  return internal::CatchJsonErrors<WindowNotice>("window notice",
                                                 [&] { return ParseWindowNotice(text); });
}

}  // namespace omni
