#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "omni/stats.h"

namespace omni {

using nlohmann::json;

StatsSnapshot SnapshotOf(const StepStats& stats, int window) {
  StatsSnapshot s;
  s.steps_seen = stats.steps_seen();
  s.warmup_steps = stats.warmup_steps();
  s.warming_up = stats.warming_up();
  s.window = window;
  s.rows.push_back({"step", "", stats.steps(StepKind::kNormal).Summarize()});
  for (const StepKind k : {StepKind::kCheckpoint, StepKind::kEval}) {
    if (!stats.steps(k).empty()) {
      s.rows.push_back(
          {absl::StrCat("step[", StepKindName(k), "]"), "", stats.steps(k).Summarize()});
    }
  }
  const PhaseCatalog& cat = stats.catalog();
  for (int p = 0; p < cat.size(); ++p) {
    const auto id = static_cast<PhaseId>(p);
    if (stats.phase_total(id).empty()) continue;
    s.rows.push_back({cat.name(id), std::string(IdleKindName(cat.idle_kind(id))),
                      stats.phase_total(id).Summarize()});
  }
  if (!stats.uncovered().empty()) {
    s.rows.push_back({"uncovered", "host_side", stats.uncovered().Summarize()});
  }
  return s;
}

namespace {
double Ms(double ns) { return std::round(ns) / 1e6; }
}  // namespace

std::string StatsSnapshot::ToJson() const {
  json j;
  j["schema"] = "omni.stats";
  j["version"] = 1;
  j["steps_seen"] = steps_seen;
  j["warmup_steps"] = warmup_steps;
  j["warming_up"] = warming_up;
  j["window"] = window;
  json rs = json::array();
  for (const Row& r : rows) {
    const Summary& s = r.summary;
    json o = {{"name", r.name},        {"count", s.count},
              {"mean_ms", Ms(s.mean)}, {"stddev_ms", Ms(s.stddev)},
              {"p50_ms", Ms(s.p50)},   {"p95_ms", Ms(s.p95)},
              {"min_ms", Ms(s.min)},   {"max_ms", Ms(s.max)}};
    if (!r.idle_kind.empty()) o["idle_kind"] = r.idle_kind;
    rs.push_back(std::move(o));
  }
  j["rows"] = std::move(rs);
  return j.dump();
}

std::string StatsSnapshot::ToTable() const {
  std::string out =
      absl::StrFormat("step statistics: %d steps seen, %d warm-up steps left out%s, window %d\n",
                      steps_seen, warmup_steps, warming_up ? " (still warming up)" : "", window);
  absl::StrAppend(&out, absl::StrFormat("  %-18s %-15s %6s %10s %10s %10s %10s %10s %10s\n", "name",
                                        "devices", "count", "mean(ms)", "sd(ms)", "p50(ms)",
                                        "p95(ms)", "min(ms)", "max(ms)"));
  for (const Row& r : rows) {
    const Summary& s = r.summary;
    absl::StrAppend(
        &out, absl::StrFormat("  %-18s %-15s %6d %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f\n",
                              r.name, r.idle_kind.empty() ? "" : r.idle_kind, s.count, s.mean / 1e6,
                              s.stddev / 1e6, s.p50 / 1e6, s.p95 / 1e6, s.min / 1e6, s.max / 1e6));
  }
  return out;
}

}  // namespace omni
