#include "omni/evaluator.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace omni {

using nlohmann::json;

double EvaluationReport::Score::precision() const {
  return forecast_ns > 0 ? static_cast<double>(forecast_true_ns) / static_cast<double>(forecast_ns)
                         : std::numeric_limits<double>::quiet_NaN();
}
double EvaluationReport::Score::recall() const {
  return real_ns > 0 ? static_cast<double>(real_covered_ns) / static_cast<double>(real_ns)
                     : std::numeric_limits<double>::quiet_NaN();
}

namespace {

struct Interval {
  int64_t a, b;
  IdleKind kind;
};

// Calls fn(i, j, overlap) for every overlapping pair of the two sorted,
// internally non-overlapping interval lists.
template <typename Fn>
void ForEachOverlap(const Interval* x, size_t nx, const Interval* y, size_t ny, Fn&& fn) {
  size_t i = 0, j = 0;
  while (i < nx && j < ny) {
    const int64_t lo = std::max(x[i].a, y[j].a);
    const int64_t hi = std::min(x[i].b, y[j].b);
    if (hi > lo) fn(i, j, hi - lo);
    if (x[i].b < y[j].b) {
      ++i;
    } else {
      ++j;
    }
  }
}

json ScoreJson(const EvaluationReport::Score& s) {
  const auto num = [](double v) {
    return std::isnan(v) ? json(nullptr) : json(std::round(v * 1e4) / 1e4);
  };
  return {{"forecast_ms", static_cast<double>(s.forecast_ns) / 1e6},
          {"forecast_true_ms", static_cast<double>(s.forecast_true_ns) / 1e6},
          {"real_ms", static_cast<double>(s.real_ns) / 1e6},
          {"real_covered_ms", static_cast<double>(s.real_covered_ns) / 1e6},
          {"precision", num(s.precision())},
          {"recall", num(s.recall())}};
}

}  // namespace

absl::StatusOr<EvaluationReport> Evaluate(const StepLog& log, const EvaluateOptions& options) {
  if (options.stride_steps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("stride_steps must be positive, got ", options.stride_steps));
  }
  if (log.steps.empty()) return absl::InvalidArgumentError("step log has no steps");
  ForecastOptions fo = options.forecast;
  if (options.events_from_header) {
    fo.checkpoint = log.header.checkpoint;
    fo.eval = log.header.eval;
    fo.pipeline = log.header.pipeline;
  }
  auto forecaster = Forecaster::Create(fo);
  if (!forecaster.ok()) return forecaster.status();
  auto stats = StepStats::Create(options.stats, log.header.phases);
  if (!stats.ok()) return stats.status();

  // Real idle time: the innermost-phase rule inside steps, and the gaps
  // between steps (host-side).
  std::vector<Interval> truth;
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& rec = log.steps[i];
    if (i > 0 && rec.start_ns > log.steps[i - 1].end_ns) {
      truth.push_back({log.steps[i - 1].end_ns, rec.start_ns, IdleKind::kHostSide});
    }
    ForEachIdleInterval(rec, log.header.phases, [&](const IdleInterval& iv) {
      truth.push_back({iv.start_ns, iv.end_ns, iv.kind});
    });
  }
  const int64_t log_end = log.steps.back().end_ns;

  EvaluationReport report;
  report.scoring = options.scoring;
  int64_t stationary = 0;
  std::vector<Interval> wins;
  const size_t stride = static_cast<size_t>(options.stride_steps);
  for (size_t i = 0; i < log.steps.size(); ++i) {
    const StepRecord& rec = log.steps[i];
    if (auto st = stats->Add(rec); !st.ok()) return st;
    if (stats->warming_up()) continue;
    if (stationary++ % options.stride_steps != 0) continue;
    const int64_t now = rec.end_ns;
    int64_t end = std::min(now + fo.horizon_ns, log_end);
    if (options.scoring == Scoring::kLive && i + stride < log.steps.size()) {
      end = std::min(end, log.steps[i + stride].end_ns);  // until the next forecast
    }
    if (end <= now) continue;
    auto f = forecaster->Predict(*stats, now);
    if (!f.ok()) continue;  // e.g. no normal step yet
    ++report.forecasts;
    wins.clear();
    for (const IdleWindow& w : f->windows) {
      const int64_t a = std::max(w.start_ns, now);
      const int64_t b = std::min(w.start_ns + w.duration_ns, end);
      if (b > a) wins.push_back({a, b, w.kind});
    }
    report.windows += static_cast<int64_t>(wins.size());
    // Truth intervals overlapping [now, end), clipped.
    auto first = std::lower_bound(truth.begin(), truth.end(), now,
                                  [](const Interval& iv, int64_t t) { return iv.b <= t; });
    std::vector<Interval> real;
    for (auto it = first; it != truth.end() && it->a < end; ++it) {
      real.push_back({std::max(it->a, now), std::min(it->b, end), it->kind});
    }
    for (const Interval& w : wins) {
      report.by_kind[static_cast<int>(w.kind)].forecast_ns += w.b - w.a;
      report.total.forecast_ns += w.b - w.a;
    }
    for (const Interval& r : real) {
      report.by_kind[static_cast<int>(r.kind)].real_ns += r.b - r.a;
      report.total.real_ns += r.b - r.a;
    }
    ForEachOverlap(wins.data(), wins.size(), real.data(), real.size(),
                   [&](size_t wi, size_t ri, int64_t len) {
                     report.by_kind[static_cast<int>(wins[wi].kind)].forecast_true_ns += len;
                     report.by_kind[static_cast<int>(real[ri].kind)].real_covered_ns += len;
                     report.total.forecast_true_ns += len;
                     report.total.real_covered_ns += len;
                   });
  }
  if (report.forecasts == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no forecast could be made from ", log.steps.size(), " steps (",
        stats->warming_up() ? "never stationary" : "no normal step after warm-up", ")"));
  }
  return report;
}

std::string EvaluationReport::ToJson() const {
  json j;
  j["schema"] = "omni.forecast_eval";
  j["version"] = 1;
  j["scoring"] = scoring == Scoring::kLive ? "live" : "horizon";
  j["forecasts"] = forecasts;
  j["windows"] = windows;
  j["total"] = ScoreJson(total);
  json k = json::object();
  for (int i = 1; i < kNumIdleKinds; ++i) {
    const Score& s = by_kind[i];
    if (s.forecast_ns == 0 && s.real_ns == 0) continue;
    k[std::string(IdleKindName(static_cast<IdleKind>(i)))] = ScoreJson(s);
  }
  j["by_kind"] = std::move(k);
  return j.dump();
}

std::string EvaluationReport::ToTable() const {
  std::string out = absl::StrFormat("%d forecasts, %d windows scored (%s scoring)\n", forecasts,
                                    windows, scoring == Scoring::kLive ? "live" : "horizon");
  absl::StrAppend(&out, absl::StrFormat("  %-16s %12s %12s %10s %10s\n", "kind", "forecast(ms)",
                                        "real(ms)", "precision", "recall"));
  const auto row = [&](const std::string& name, const Score& s) {
    absl::StrAppend(
        &out, absl::StrFormat("  %-16s %12.1f %12.1f %10.4f %10.4f\n", name,
                              static_cast<double>(s.forecast_ns) / 1e6,
                              static_cast<double>(s.real_ns) / 1e6, s.precision(), s.recall()));
  };
  for (int i = 1; i < kNumIdleKinds; ++i) {
    const Score& s = by_kind[i];
    if (s.forecast_ns == 0 && s.real_ns == 0) continue;
    row(std::string(IdleKindName(static_cast<IdleKind>(i))), s);
  }
  row("all", total);
  return out;
}

}  // namespace omni
